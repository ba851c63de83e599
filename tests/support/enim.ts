/**
 * How tests, the demo and the bench run enim: the built bundle (`deno task
 * build`, `dist/bundle/main.js`), the artifact that ships, through `deno run`
 * with exactly the `enim` permission set as flags (scripts/build.ts
 * `bundleArgv`), as the launcher and the compiled binary run it. The bundle is
 * built on first use when it is missing or older than the sources.
 *
 * @module
 */
import type { EnimSandbox } from "./sandbox.ts";
import { bundleArgv, ensureBuiltSync } from "../../scripts/build.ts";
import { type CommandOutput, runCommand } from "./command.ts";

let entry: string | undefined;

/** The argv prefix that runs enim exactly as the shipped artifact runs (permissions included). */
export function enimArgv(): string[] {
  entry ??= ensureBuiltSync();
  return bundleArgv(entry);
}

/** Options for {@linkcode runEnim}. */
export interface RunEnimOptions {
  /** Environment for the child (only these variables are set, plus PATH). */
  env?: Record<string, string>;
  /** Text for stdin. */
  stdin?: string;
  /** Run inside this named network namespace (`ip netns exec`). */
  netns?: string;
  /** Run inside this sandbox (private /run/enim, and its network namespace). */
  sandbox?: EnimSandbox;
  /** The argv prefix of another build (an earlier release); default this tree's bundle. */
  argv?: string[];
}

/** The result of one enim run. */
export type RunEnimResult = CommandOutput;

/** Builds the command line, wrapped in `ip netns exec` when asked. */
export function enimCommandLine(args: string[], netns?: string): string[] {
  const argv = [...enimArgv(), ...args];
  return netns ? ["/usr/sbin/ip", "netns", "exec", netns, ...argv] : argv;
}

/** Runs enim once (plugin or command) and collects its output. */
export async function runEnim(args: string[], opts: RunEnimOptions = {}): Promise<RunEnimResult> {
  return await runCommand(
    opts.sandbox ? opts.sandbox.enim(args, opts.argv) : opts.argv
      ? [
        ...(opts.netns ? ["/usr/sbin/ip", "netns", "exec", opts.netns] : []),
        ...opts.argv,
        ...args,
      ]
      : enimCommandLine(args, opts.netns),
    { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", NO_COLOR: "1", ...opts.env },
    opts.stdin,
  );
}
