/**
 * The agent's record beside its socket (`api/wire.ts` `AgentRecord`): written when the
 * agent starts serving, and again when a graceful stop begins (with `stoppedAt`), so the
 * plugin knows an agent being replaced from one that is gone (docs/runtimes.md, STATUS).
 *
 * @module
 */
import { type AgentRecord, agentRecordPath, replacingPath } from "../api/wire.ts";
import { VERSION } from "../lib/version.ts";

/**
 * Writes `record` beside `socket`, whole (a temporary file renamed over it): the plugin
 * never reads half of one. A failure is returned, not thrown: the record only refines what
 * STATUS answers while the agent is away.
 */
export async function writeAgentRecord(
  socket: string,
  record: AgentRecord,
): Promise<Error | undefined> {
  return await writeWhole(agentRecordPath(socket), JSON.stringify(record) + "\n");
}

/**
 * Writes `text` at `path` whole (mode 0644): a temporary file beside it, renamed over it.
 * Random: every container's agent may be pid 1. A failure is returned, not thrown.
 */
async function writeWhole(path: string, text: string): Promise<Error | undefined> {
  const tmp = `${path}.tmp-${crypto.randomUUID()}`;
  try {
    await Deno.writeTextFile(tmp, text, { mode: 0o644 });
    await Deno.rename(tmp, path);
    return undefined;
  } catch (err) {
    await Deno.remove(tmp).catch(() => {});
    return err instanceof Error ? err : new Error(String(err));
  }
}

/**
 * Writes the agent's record at `socket` (this process, this version; `stoppedAt` at a
 * graceful stop), logging a failure as a warning.
 */
export async function recordAgent(
  socket: string,
  log: { warn(msg: string, fields?: Record<string, unknown>): void },
  servingSince: number,
  stoppedAt?: number,
): Promise<void> {
  const err = await writeAgentRecord(socket, {
    version: VERSION,
    pid: Deno.pid,
    servingSince,
    ...(stoppedAt === undefined ? {} : { stoppedAt }),
  });
  if (err) log.warn("cannot write the agent's record", { error: err });
  // Serving: the init container's replacement marker has done its work.
  if (stoppedAt === undefined) await Deno.remove(replacingPath(socket)).catch(() => {});
}

/**
 * How often a standby agent (waiting for another one's lock) writes the replacement marker
 * again: well within `RESTART_GRACE_SECONDS`, so the plugin holds calls for it until it
 * serves, however long the agent before it takes to stop.
 */
export const MARK_EVERY_MS = 5_000;

/**
 * Writes the replacement marker beside `socket` (`api/wire.ts` `REPLACING_NAME`), whole:
 * an agent is on its way. A failure is logged, not thrown (the marker only refines what
 * the plugin answers while no agent serves).
 */
export async function markReplacing(
  socket: string,
  log: { warn(msg: string, fields?: Record<string, unknown>): void },
): Promise<void> {
  const err = await writeWhole(replacingPath(socket), JSON.stringify({ since: Date.now() }) + "\n");
  if (err) log.warn("cannot write the replacement marker", { error: err });
}
