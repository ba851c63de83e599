/**
 * The one place that spawns `tc` (iproute2's traffic control), as `./ip.ts` is
 * for `ip`: argument arrays through Deno.Command (never a shell), an absolute
 * binary path, a namespace by name (`tc -n NAME`) or by path (`nsenter --net=PATH
 * tc …`), several commands in one `tc -batch FILE`, and `tc -j` output parsed as
 * JSON lines. A failure is an {@linkcode IpError} (argv, exit code, stderr), as
 * for `ip`, so the device layer reads both alike.
 *
 * @module
 */
import {
  batchLine,
  DEFAULT_SCRATCH_DIR,
  iprouteArgv,
  type NetnsRef,
  parseJsonLines,
  spawn,
  withScratchFile,
} from "./ip.ts";

/** The `tc` binary (iproute2). */
export const TC_BIN = "/usr/sbin/tc";

/** Options for {@linkcode tcBatch}. */
export interface TcBatchOptions {
  netns?: NetnsRef;
  /** Set `-j` and return the output of every show command. */
  json?: boolean;
  /** Where the batch file goes (default `DEFAULT_SCRATCH_DIR` of `./ip.ts`). */
  scratchDir?: string;
}

/** The argv (binary first) that runs `tc <args>` in `netns`. */
export function tcArgv(args: string[], netns?: NetnsRef): string[] {
  return iprouteArgv(TC_BIN, args, netns);
}

/**
 * Runs several `tc` commands (each an argument array, without the leading `tc`) in
 * one `tc -batch FILE`, stopping at the first failure; a single command runs as
 * plain arguments. With `json`, the output of every show command is returned, in
 * order.
 */
export async function tcBatch(
  commands: (string | number)[][],
  opts: TcBatchOptions = {},
): Promise<unknown[]> {
  if (commands.length === 0) return [];
  const lines = commands.map(batchLine);
  const flags = opts.json ? ["-j"] : [];
  if (commands.length === 1) {
    const { stdout } = await spawn(tcArgv([...flags, ...commands[0].map(String)], opts.netns));
    return opts.json ? parseJsonLines(stdout) : [];
  }
  return await withScratchFile(
    opts.scratchDir ?? DEFAULT_SCRATCH_DIR,
    lines.join("\n") + "\n",
    async (file) => {
      const { stdout } = await spawn(tcArgv([...flags, "-batch", file], opts.netns));
      return opts.json ? parseJsonLines(stdout) : [];
    },
  );
}
