/**
 * One way for tests, the bench and the stress harness to run a program: exactly the
 * environment given, stdin fed when given (otherwise /dev/null), exit code and
 * output collected; and one way for the scripts' tests to run a task or a `deno`
 * subcommand from the repository as a user would ({@linkcode runFromRoot}).
 *
 * @module
 */
import { ROOT } from "../../scripts/_paths.ts";

/** What one run printed, and how it exited. */
export interface CommandOutput {
  code: number;
  stdout: string;
  stderr: string;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Runs `argv` (program first) with exactly `env`, feeding `stdin` when given. */
export async function runCommand(
  argv: string[],
  env: Record<string, string>,
  stdin?: string,
): Promise<CommandOutput> {
  const [cmd, ...args] = argv;
  const child = new Deno.Command(cmd, {
    args,
    clearEnv: true,
    env,
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (stdin !== undefined) {
    const w = child.stdin.getWriter();
    await w.write(encoder.encode(stdin));
    await w.close();
  }
  const out = await child.output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

/**
 * Runs `argv` (program first) from the repository's root with this process's environment
 * and `NO_COLOR=1`, stdin /dev/null, as a user at a terminal would run a task.
 */
export async function runFromRoot(argv: string[]): Promise<CommandOutput> {
  const [cmd, ...args] = argv;
  const out = await new Deno.Command(cmd, {
    args,
    cwd: ROOT,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

/**
 * Waits for `done` (the end of `child` and of the reading of its output); kills `child`
 * by its PID with SIGKILL if that takes longer than `ms`.
 */
export async function awaitOrKill(
  child: Deno.ChildProcess,
  done: Promise<unknown>,
  ms = 10_000,
): Promise<void> {
  const timer = setTimeout(() => {
    try {
      child.kill("SIGKILL");
    } catch { /* gone */ }
  }, ms);
  try {
    await done;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Spawns `deno run -A <module> <args>` under `enter` (an argv that runs its rest in a
 * namespace, e.g. `nsenter --net=/proc/<pid>/ns/net --`), as {@linkcode spawnDenoInNetns};
 * `flags` are more of `deno run`'s.
 */
export function spawnDenoWith(
  enter: string[],
  module: string,
  args: string[],
  env: Record<string, string> = {},
  flags: string[] = [],
): Deno.ChildProcess {
  const [cmd, ...pre] = enter;
  return new Deno.Command(cmd, {
    args: [
      ...pre,
      Deno.execPath(),
      "run",
      "-A",
      "--quiet",
      "--no-prompt",
      ...flags,
      "--config",
      `${ROOT}/tests/deno.json`,
      module,
      ...args,
    ],
    env: { NO_COLOR: "1", ...env },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

/**
 * Spawns the Deno module `module` (with all permissions and the tests' config) inside the
 * network namespace `netns` (a name under /run/netns), its stdio piped, its environment
 * `NO_COLOR=1` and `env` over this process's; `flags` are more of `deno run`'s
 * (`--unstable-net` for `Deno.listenDatagram`).
 */
export function spawnDenoInNetns(
  netns: string,
  module: string,
  args: string[],
  env: Record<string, string> = {},
  flags: string[] = [],
): Deno.ChildProcess {
  return spawnDenoWith(["/usr/sbin/ip", "netns", "exec", netns], module, args, env, flags);
}
