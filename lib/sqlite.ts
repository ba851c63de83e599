/**
 * SQLite helpers shared by the state store and providers that keep tables in
 * the agent's database: opening with the agent's pragmas, and transactions.
 *
 * @module
 */
import { DatabaseSync, type StatementSync } from "node:sqlite";

/**
 * Opens (creating when missing) the agent's SQLite database with WAL, a busy
 * timeout and foreign keys on. `":memory:"` works for tests.
 */
export function openDatabase(path: string, busyTimeoutMs = 5000): DatabaseSync {
  const db = new DatabaseSync(path);
  try {
    if (path !== ":memory:") db.exec("PRAGMA journal_mode = WAL");
    db.exec(`PRAGMA busy_timeout = ${Math.max(0, Math.floor(busyTimeoutMs))}`);
    db.exec("PRAGMA foreign_keys = ON");
    // FULL: a committed outcome survives a power loss too, not only kill -9.
    db.exec("PRAGMA synchronous = FULL");
  } catch (err) {
    db.close();
    throw err;
  }
  return db;
}

/**
 * Runs `fn` in one `BEGIN IMMEDIATE` transaction (committed when it returns,
 * rolled back when it throws). Inside an open transaction it runs as part of it.
 * `fn` must be synchronous: nothing else touches the connection meanwhile.
 */
export function transaction<T>(db: DatabaseSync, fn: () => T): T {
  if (db.isTransaction) return fn();
  db.exec("BEGIN IMMEDIATE");
  try {
    const out = fn();
    db.exec("COMMIT");
    return out;
  } catch (err) {
    if (db.isTransaction) db.exec("ROLLBACK");
    throw err;
  }
}

const statements = new WeakMap<DatabaseSync, Map<string, StatementSync>>();

/**
 * The prepared statement for `sql` on `db`, prepared once and reused. A
 * statement is native memory V8 does not see: preparing one per call (and
 * leaving it to the garbage collector) makes a busy agent's RSS climb between
 * major GCs, and costs a parse each time.
 */
export function prepared(db: DatabaseSync, sql: string): StatementSync {
  let byDb = statements.get(db);
  if (!byDb) statements.set(db, byDb = new Map());
  let st = byDb.get(sql);
  if (!st) byDb.set(sql, st = db.prepare(sql));
  return st;
}
