/**
 * Test helper: serves a {@linkcode FakeManager} on a temporary socket and runs
 * the operator program against it with captured output.
 *
 * @module
 */
import { createHandler, serveUnix } from "../../agent/server.ts";
import { FakeManager } from "./fake_manager.ts";
import { withRunDir } from "./run_dir.ts";
import { runCli } from "../../cli/mod.ts";
import { processIo } from "../../cli/io.ts";

/** The outcome of one CLI run. */
export interface CliRun {
  code: number;
  out: string;
  err: string;
}

/** Runs `enim <argv>` in process with captured output. */
export async function cli(argv: string[]): Promise<CliRun> {
  const r = { code: 0, out: "", err: "" };
  r.code = await runCli(argv, {
    out: (t) => (r.out += t),
    err: (t) => (r.err += t),
    agent: processIo.agent,
  });
  return r;
}

/** Serves a fake manager on /run/enim/test-*\/enim.sock for the duration of `fn`. */
export function withFakeAgent(
  fn: (socket: string, m: FakeManager) => Promise<void>,
  m = new FakeManager(),
): Promise<void> {
  return withRunDir(async (dir) => {
    const socket = `${dir}/enim.sock`;
    const server = await serveUnix(socket, createHandler({ manager: m }));
    try {
      await fn(socket, m);
    } finally {
      await server.shutdown();
    }
  });
}
