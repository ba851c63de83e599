/**
 * Test helper: runs the dispatcher in process with a fake agent and collects
 * stdout, the exit code and the log lines.
 *
 * @module
 */
import { Logger } from "../../lib/log.ts";
import { assert, assertEquals } from "../../lib/assert.ts";
import { type CniErrorObject, CniErrorObjectSchema } from "../../cni/errors.ts";
import { FakeAgent } from "./fake_agent.ts";
import { dispatchCall, type DispatchIo } from "../../cni/dispatch.ts";

/** What one in-process run produced. */
export interface Run {
  code: number;
  /** Everything written to stdout, concatenated. */
  stdout: string;
  /** How many times stdout was written. */
  writes: number;
  /** Parsed log lines. */
  logs: Record<string, unknown>[];
  agent: FakeAgent;
}

/** Runs the dispatcher once. */
export async function run(
  env: Record<string, string | undefined>,
  stdin: unknown,
  agent: FakeAgent = new FakeAgent(),
  extra: Partial<DispatchIo> = {},
): Promise<Run> {
  let stdout = "";
  let writes = 0;
  const logs: Record<string, unknown>[] = [];
  const code = await dispatchCall({
    env,
    stdin: typeof stdin === "string" ? stdin : JSON.stringify(stdin),
    stdout: (s) => {
      stdout += s;
      writes++;
    },
    agent,
    log: new Logger((l) => logs.push(JSON.parse(l)), "debug"),
    ...extra,
  });
  return { code, stdout, writes, logs, agent };
}

/** Asserts the run failed with exactly one CNI error object of `code` on stdout; returns it. */
export function expectError(r: Run, code: number, cniVersion?: string): CniErrorObject {
  assertEquals(r.code, 1, `exit code; stdout: ${r.stdout}`);
  assertEquals(r.writes, 1, "exactly one stdout write");
  const obj = CniErrorObjectSchema.parse(JSON.parse(r.stdout));
  assertEquals(obj.code, code, obj.msg);
  if (cniVersion !== undefined) assertEquals(obj.cniVersion, cniVersion);
  assert(r.logs.length === 1, "one log line");
  return obj;
}

/** Asserts success with nothing on stdout. */
export function expectQuietSuccess(r: Run): void {
  assertEquals(r.stdout, "", "stdout");
  assertEquals(r.code, 0, "exit code");
}
