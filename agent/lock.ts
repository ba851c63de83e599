/**
 * One agent per node: an exclusive lock next to the state, taken before the
 * agent touches anything (before it opens the state, the provider or the
 * socket, before reconcile).
 *
 * The lock is a small SQLite file (`enim.lock` beside the state database)
 * held with an exclusive POSIX lock for the agent's whole life
 * (`locking_mode = EXCLUSIVE` keeps the lock of its first write transaction).
 * The kernel drops it when the process ends however it ends, kill -9
 * included, so a dead agent never leaves a stale lock. A second agent waits for
 * the lock up to a bounded time (a DaemonSet's rolling update starts the new
 * pod while the old one drains) and then gives up with a message naming the
 * lock; it has changed nothing. (`fuser <lock>` shows the holder.)
 *
 * @module
 */
import { sleep } from "../lib/async.ts";
import { DatabaseSync } from "node:sqlite";
import { privateFile } from "../lib/private_fs.ts";

/** The lock is held by another agent. */
export class AgentLockedError extends Error {
  readonly path: string;
  constructor(path: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "AgentLockedError";
    this.path = path;
  }
}

/** A held lock; {@linkcode AgentLock.release} lets the next agent in. */
export interface AgentLock {
  readonly path: string;
  release(): void;
}

/** Whether a SQLite error says another connection holds the lock. */
function isBusy(err: unknown): boolean {
  return err instanceof Error && /database is locked|SQLITE_BUSY/i.test(err.message);
}

/** Options for {@linkcode acquireAgentLock}. */
export interface AcquireOptions {
  /** How long to wait for another agent to let go (0: do not wait). */
  waitMs: number;
  /** Called once when the lock is found held and the wait begins. */
  onWait?: () => void;
  /** Ends the wait early (SIGTERM while waiting). */
  signal?: AbortSignal;
}

/**
 * Takes the exclusive lock at `path` (created 0600), waiting up to
 * `opts.waitMs` for another agent to release it.
 *
 * @throws {AgentLockedError} when another agent still holds it
 */
export async function acquireAgentLock(path: string, opts: AcquireOptions): Promise<AgentLock> {
  await privateFile(path);
  const db = new DatabaseSync(path);
  const deadline = Date.now() + opts.waitMs;
  let waited = false;
  try {
    db.exec("PRAGMA busy_timeout = 0");
    db.exec("PRAGMA locking_mode = EXCLUSIVE");
    for (let delay = 20;; delay = Math.min(delay * 2, 250)) {
      try {
        db.exec("PRAGMA journal_mode = DELETE");
        db.exec("BEGIN EXCLUSIVE");
        // A write: in exclusive locking mode its lock is kept until the file is closed.
        db.exec("CREATE TABLE IF NOT EXISTS holder (pid INTEGER NOT NULL, since INTEGER NOT NULL)");
        db.exec("DELETE FROM holder");
        db.prepare("INSERT INTO holder (pid, since) VALUES (?, ?)").run(Deno.pid, Date.now());
        db.exec("COMMIT");
        break;
      } catch (err) {
        if (db.isTransaction) db.exec("ROLLBACK");
        if (!isBusy(err)) throw err;
        if (!waited) {
          waited = true;
          opts.onWait?.();
        }
        if (Date.now() >= deadline || opts.signal?.aborted) {
          throw new AgentLockedError(
            path,
            `Another enim agent holds "${path}"${
              opts.waitMs > 0 ? ` (waited ${Math.round(opts.waitMs / 1000)} s)` : ""
            }: only one agent may run per node; this one stops and has changed nothing`,
            { cause: err },
          );
        }
        await sleep(Math.min(delay, Math.max(1, deadline - Date.now())));
      }
    }
  } catch (err) {
    db.close();
    throw err;
  }
  let released = false;
  return {
    path,
    release() {
      if (released) return;
      released = true;
      db.close();
    },
  };
}
