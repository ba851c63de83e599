/**
 * One way for tests, the bench and the stress harness to run a program: exactly the
 * environment given, stdin fed when given (otherwise /dev/null), exit code and
 * output collected.
 *
 * @module
 */

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
