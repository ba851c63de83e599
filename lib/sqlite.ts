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
    // NORMAL in WAL mode: a commit is a write to the WAL, without an fsync (one at each
    // checkpoint). What it keeps: every committed transaction survives the agent being
    // killed (kill -9, OOM, a crash), because the WAL is in the kernel's page cache the
    // moment the commit returns, and the database is never corrupted. What it gives up:
    // on a power loss or kernel crash the last transactions before the last checkpoint may
    // roll back. Reconcile covers that: after a reboot every pod namespace is gone, so a
    // lost `ready` is rolled back to free, a lost delete is finished again, and a provider
    // row rolled back with it is consistent with the state (one database, one WAL); an
    // ENI created in the cloud whose intent was lost is an orphan the provider's own
    // cleanup finds by its name. FULL cost ~1.5 ms of fsync per ADD on these machines.
    db.exec("PRAGMA synchronous = NORMAL");
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

/** Why the state could not be written, as far as a user can act on it. */
export type StateFailureKind = "full" | "readonly" | "io";

/**
 * What a SQLite error means for the state, when it is a failure of the storage
 * (a full disk, a read-only file system or file, an I/O error); undefined for
 * any other error (a constraint, a bug).
 */
export function storageFailure(err: unknown): StateFailureKind | undefined {
  if (!(err instanceof Error)) return undefined;
  const code = (err as { code?: unknown }).code;
  if (typeof code !== "string" || !code.startsWith("ERR_SQLITE")) return undefined;
  const m = err.message;
  if (/database or disk is full|disk is full/i.test(m)) return "full";
  if (/readonly database|read-only/i.test(m)) return "readonly";
  if (/disk I\/O error|unable to open database file/i.test(m)) return "io";
  return undefined;
}

/** The sentence for a storage failure of the database at `path`. */
export function storageFailureMessage(kind: StateFailureKind, path: string): string {
  const what = kind === "full"
    ? "the disk is full"
    : kind === "readonly"
    ? "it is read-only"
    : "an I/O error";
  return `The agent cannot write its state at "${path}": ${what}; nothing was changed`;
}

/** One schema change: SQL, or a function for what SQL alone cannot say. */
export type Migration = string | ((db: DatabaseSync) => void);

/**
 * A schema change the previous release still opens (a new table, a new column with a
 * default or NULL, a new index), recorded by `name` in `enim_additions` and never in
 * `enim_migrations`: the schema version the previous release checks stays the one it
 * knows, so it opens the database and works beside what it does not know. How enim
 * changes its state from 0.2.0 on (docs/upgrading.md, "The state"): a change that is not
 * additive is made expand-then-contract over releases, each step an addition: expand (the
 * new form beside the old, both written), switch the reads, then drop the old form once no
 * release within the skew writes or reads it. `name` is never reused; an addition of a
 * newer release this code does not know is left alone.
 */
export interface Addition {
  /** Unique within its component, never reused (e.g. "writers"). */
  name: string;
  /** The change; it must leave a database every release within the skew opens. */
  up: Migration;
}

/**
 * Brings `component`'s tables (the state store, a provider) to the newest of its
 * `migrations`: index i takes the schema to version i + 1. Every pending step
 * runs in one transaction, and the versions are kept per component in
 * `enim_migrations`, so components evolve independently in the one database.
 * A database newer than this code is refused. Then its `additions` not yet made
 * ({@linkcode Addition}), in the same transaction: a kill at any write leaves the
 * database as it was before, which both this release and the previous one open.
 *
 * `migrations` are frozen at what 0.1.0 knows (releases.json's `schemas`; a test keeps
 * them so): 0.1.0 refuses a database whose version for a component is higher than its
 * list, so every change since is an addition. A component new since 0.1.0 (a table set
 * of its own) may have migrations of its own: 0.1.0 never asks for it.
 */
export function migrateComponent(
  db: DatabaseSync,
  component: string,
  migrations: readonly Migration[],
  now: () => number = Date.now,
  additions: readonly Addition[] = [],
): void {
  db.exec(
    `CREATE TABLE IF NOT EXISTS enim_migrations (component TEXT NOT NULL, version INTEGER NOT NULL,
       applied_at INTEGER NOT NULL, PRIMARY KEY (component, version))`,
  );
  transaction(db, () => {
    const row = prepared(db, "SELECT max(version) AS v FROM enim_migrations WHERE component = ?")
      .get(component) as { v: number | null } | undefined;
    const v = row?.v ?? 0;
    if (v > migrations.length) {
      throw new Error(
        `The ${component} tables have schema version ${v}; this enim knows up to ${migrations.length}`,
      );
    }
    for (let i = v; i < migrations.length; i++) {
      const m = migrations[i];
      if (typeof m === "string") db.exec(m);
      else m(db);
      prepared(db, "INSERT INTO enim_migrations (component, version, applied_at) VALUES (?, ?, ?)")
        .run(component, i + 1, now());
    }
    if (additions.length === 0) return;
    db.exec(
      `CREATE TABLE IF NOT EXISTS enim_additions (component TEXT NOT NULL, name TEXT NOT NULL,
         applied_at INTEGER NOT NULL, PRIMARY KEY (component, name))`,
    );
    const made = new Set(
      prepared(db, "SELECT name FROM enim_additions WHERE component = ?").all(component)
        .map((r) => String(r.name)),
    );
    for (const a of additions) {
      if (made.has(a.name)) continue;
      if (typeof a.up === "string") db.exec(a.up);
      else a.up(db);
      prepared(db, "INSERT INTO enim_additions (component, name, applied_at) VALUES (?, ?, ?)")
        .run(component, a.name, now());
    }
  });
}

/** Whether `table` has a column `column` (for migrations of tables made before versioning). */
export function hasColumn(db: DatabaseSync, table: string, column: string): boolean {
  const cols = db.prepare(`PRAGMA table_info(${table})`).all() as { name?: unknown }[];
  return cols.some((c) => c.name === column);
}
