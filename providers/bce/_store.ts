/**
 * The BCE provider's tables in the agent's SQLite database, every row parsed
 * with zod on the way out:
 *
 * - `bce_enis`: ENIs this provider created that are attached to this node and
 *   ready, each free or owned by one CNI attachment. A UNIQUE index on the owner
 *   and the primary key on the ENI make "one ENI, one owner" a database invariant.
 *   An owned ENI found deleted or detached out of band stays, marked *lost*
 *   (`lost_reason`), until its owner's DEL or GC releases it.
 * - `bce_intents`: work in flight. A `create` intent carries the clientToken of
 *   its create call and the ENI name, so a retry or a restart repeats the *same*
 *   operation; a `release` intent is a surplus ENI being detached and deleted.
 * - `bce_quarantine`: ENIs stuck in `attaching` or `detaching` that could not be
 *   detached or deleted; retried now and then, and shown in the status.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import { prepared, transaction } from "../../lib/sqlite.ts";
import type { Owner } from "../contract.ts";

const SCHEMA = `
CREATE TABLE IF NOT EXISTS bce_enis (
  eni_id TEXT PRIMARY KEY,
  mac TEXT NOT NULL,
  subnet_id TEXT,
  ipv4 TEXT,
  ipv6 TEXT,
  pod TEXT,
  container_id TEXT,
  if_name TEXT,
  updated_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS bce_enis_owner ON bce_enis(pod, container_id, if_name)
  WHERE pod IS NOT NULL;
CREATE TABLE IF NOT EXISTS bce_intents (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  client_token TEXT NOT NULL,
  name TEXT NOT NULL,
  eni_id TEXT,
  requested_ip TEXT,
  purpose TEXT NOT NULL,
  phase TEXT NOT NULL DEFAULT 'active',
  created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS bce_quarantine (
  eni_id TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  reason TEXT NOT NULL,
  since_ms INTEGER NOT NULL,
  last_try_ms INTEGER NOT NULL,
  tries INTEGER NOT NULL DEFAULT 1
);
`;

/** Columns added after the first release (a database from then is migrated in place). */
const ADDED_COLUMNS: readonly [table: string, column: string, type: string][] = [
  ["bce_enis", "lost_reason", "TEXT"],
  ["bce_enis", "lost_ms", "INTEGER"],
];

const nullableString = z.nullable(z.string());

/** One row of `bce_enis`. */
export const EniRowSchema = z.object({
  eni_id: z.string(),
  mac: z.string(),
  subnet_id: nullableString,
  /** JSON of an {@linkcode EniAddress}, or null. */
  ipv4: nullableString,
  ipv6: nullableString,
  pod: nullableString,
  container_id: nullableString,
  if_name: nullableString,
  updated_ms: z.number(),
  /** Why an owned ENI is lost (deleted or detached out of band), null when it is not. */
  lost_reason: z._default(nullableString, null),
  lost_ms: z._default(z.nullable(z.number()), null),
});
/** One row of `bce_enis`. */
export type EniRow = z.infer<typeof EniRowSchema>;

/** One row of `bce_intents`. */
export const IntentRowSchema = z.object({
  id: z.string(),
  kind: z.enum(["create", "release"]),
  client_token: z.string(),
  name: z.string(),
  eni_id: nullableString,
  requested_ip: nullableString,
  purpose: z.enum(["owner", "pool"]),
  phase: z.enum(["active", "cleanup"]),
  created_ms: z.number(),
});
/** One row of `bce_intents`. */
export type IntentRow = z.infer<typeof IntentRowSchema>;

/** One row of `bce_quarantine`. */
export const QuarantineRowSchema = z.object({
  eni_id: z.string(),
  /** The VPC status it was stuck in. */
  status: z.string(),
  reason: z.string(),
  since_ms: z.number(),
  last_try_ms: z.number(),
  tries: z.number(),
});
/** One row of `bce_quarantine`. */
export type QuarantineRow = z.infer<typeof QuarantineRowSchema>;

/** What a row records of a ready ENI. */
export interface EniRecord {
  id: string;
  mac: string;
  subnetId: string | null;
  ipv4: unknown;
  ipv6: unknown;
}

/** The provider's tables. All methods are synchronous, so each is atomic against the others. */
export class BceStore {
  readonly #db: DatabaseSync;

  constructor(db: DatabaseSync) {
    this.#db = db;
    db.exec(SCHEMA);
    for (const [table, column, type] of ADDED_COLUMNS) {
      const cols = z.array(z.looseObject({ name: z.string() })).parse(
        db.prepare(`PRAGMA table_info(${table})`).all(),
      );
      if (!cols.some((c) => c.name === column)) {
        db.exec(`ALTER TABLE ${table} ADD COLUMN ${column} ${type}`);
      }
    }
  }

  // ---- ENIs ---------------------------------------------------------------------

  /** Every ENI row, by id. */
  rows(): EniRow[] {
    return z.array(EniRowSchema).parse(
      prepared(this.#db, "SELECT * FROM bce_enis ORDER BY eni_id").all(),
    );
  }

  row(eniId: string): EniRow | null {
    const r = prepared(this.#db, "SELECT * FROM bce_enis WHERE eni_id = ?").get(eniId);
    return r === undefined ? null : EniRowSchema.parse(r);
  }

  rowOf(owner: Owner): EniRow | null {
    const r = prepared(
      this.#db,
      "SELECT * FROM bce_enis WHERE pod = ? AND container_id = ? AND if_name = ?",
    ).get(owner.pod, owner.containerId, owner.ifName);
    return r === undefined ? null : EniRowSchema.parse(r);
  }

  /** Free rows (never a lost one), by id. */
  freeRows(): EniRow[] {
    return z.array(EniRowSchema).parse(
      prepared(this.#db, "SELECT * FROM bce_enis WHERE pod IS NULL ORDER BY eni_id").all(),
    );
  }

  /** Assigns a free ENI to `owner`; false when someone else took it first. */
  assign(eniId: string, owner: Owner, now: number): boolean {
    const r = prepared(
      this.#db,
      "UPDATE bce_enis SET pod = ?, container_id = ?, if_name = ?, updated_ms = ? WHERE eni_id = ? AND pod IS NULL",
    ).run(owner.pod, owner.containerId, owner.ifName, now, eniId);
    return Number(r.changes) === 1;
  }

  /** Returns an owned ENI to the free pool. */
  unassign(eniId: string, now: number): void {
    prepared(
      this.#db,
      "UPDATE bce_enis SET pod = NULL, container_id = NULL, if_name = NULL, lost_reason = NULL, lost_ms = NULL, updated_ms = ? WHERE eni_id = ?",
    ).run(now, eniId);
  }

  /** Records a ready ENI (free, or owned) and drops its intent, in one transaction. */
  insert(eni: EniRecord, owner: Owner | null, now: number, intentId?: string): void {
    transaction(this.#db, () => {
      prepared(
        this.#db,
        "INSERT OR REPLACE INTO bce_enis (eni_id, mac, subnet_id, ipv4, ipv6, pod, container_id, if_name, updated_ms, lost_reason, lost_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
      ).run(
        eni.id,
        eni.mac,
        eni.subnetId,
        eni.ipv4 ? JSON.stringify(eni.ipv4) : null,
        eni.ipv6 ? JSON.stringify(eni.ipv6) : null,
        owner?.pod ?? null,
        owner?.containerId ?? null,
        owner?.ifName ?? null,
        now,
      );
      if (intentId) prepared(this.#db, "DELETE FROM bce_intents WHERE id = ?").run(intentId);
    });
  }

  drop(eniId: string): void {
    prepared(this.#db, "DELETE FROM bce_enis WHERE eni_id = ?").run(eniId);
  }

  markLost(eniId: string, reason: string, now: number): void {
    prepared(
      this.#db,
      "UPDATE bce_enis SET lost_reason = ?, lost_ms = ?, updated_ms = ? WHERE eni_id = ?",
    ).run(reason, now, now, eniId);
  }

  clearLost(eniId: string, now: number): void {
    prepared(
      this.#db,
      "UPDATE bce_enis SET lost_reason = NULL, lost_ms = NULL, updated_ms = ? WHERE eni_id = ?",
    ).run(now, eniId);
  }

  /** ENI rows that hold a node slot (lost ones do not: their ENI is not attached). */
  slotRows(): number {
    const r = z.object({ n: z.number() }).parse(
      prepared(this.#db, "SELECT COUNT(*) AS n FROM bce_enis WHERE lost_reason IS NULL").get(),
    );
    return r.n;
  }

  // ---- intents ------------------------------------------------------------------

  intents(): IntentRow[] {
    return z.array(IntentRowSchema).parse(
      prepared(this.#db, "SELECT * FROM bce_intents ORDER BY created_ms, id").all(),
    );
  }

  intentCount(): number {
    return z.object({ n: z.number() }).parse(
      prepared(this.#db, "SELECT COUNT(*) AS n FROM bce_intents").get(),
    ).n;
  }

  insertIntent(i: IntentRow): void {
    prepared(
      this.#db,
      "INSERT INTO bce_intents (id, kind, client_token, name, eni_id, requested_ip, purpose, phase, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    ).run(
      i.id,
      i.kind,
      i.client_token,
      i.name,
      i.eni_id,
      i.requested_ip,
      i.purpose,
      i.phase,
      i.created_ms,
    );
  }

  setIntentEni(id: string, eniId: string): void {
    prepared(this.#db, "UPDATE bce_intents SET eni_id = ? WHERE id = ?").run(eniId, id);
  }

  setIntentPhase(id: string, phase: IntentRow["phase"]): void {
    prepared(this.#db, "UPDATE bce_intents SET phase = ? WHERE id = ?").run(phase, id);
  }

  deleteIntent(id: string): void {
    prepared(this.#db, "DELETE FROM bce_intents WHERE id = ?").run(id);
  }

  /** Moves the most recently freed ENI into a release intent; null when none is free. */
  takeFreeForRelease(intent: Omit<IntentRow, "eni_id">): IntentRow | null {
    return transaction(this.#db, () => {
      const r = prepared(
        this.#db,
        "SELECT * FROM bce_enis WHERE pod IS NULL ORDER BY updated_ms DESC, eni_id LIMIT 1",
      ).get();
      if (r === undefined) return null;
      const row = EniRowSchema.parse(r);
      const del = prepared(this.#db, "DELETE FROM bce_enis WHERE eni_id = ? AND pod IS NULL")
        .run(row.eni_id);
      if (Number(del.changes) !== 1) return null;
      const full: IntentRow = { ...intent, eni_id: row.eni_id };
      this.insertIntent(full);
      return full;
    });
  }

  // ---- quarantine ---------------------------------------------------------------

  quarantined(): QuarantineRow[] {
    return z.array(QuarantineRowSchema).parse(
      prepared(this.#db, "SELECT * FROM bce_quarantine ORDER BY since_ms, eni_id").all(),
    );
  }

  /** Records (or refreshes) a stuck ENI. */
  quarantine(eniId: string, status: string, reason: string, now: number): void {
    prepared(
      this.#db,
      `INSERT INTO bce_quarantine (eni_id, status, reason, since_ms, last_try_ms, tries)
       VALUES (?, ?, ?, ?, ?, 1)
       ON CONFLICT(eni_id) DO UPDATE SET status = excluded.status, reason = excluded.reason,
         last_try_ms = excluded.last_try_ms, tries = tries + 1`,
    ).run(eniId, status, reason, now, now);
  }

  /** Notes another failed try of a quarantined ENI. */
  touchQuarantine(eniId: string, now: number): void {
    prepared(
      this.#db,
      "UPDATE bce_quarantine SET last_try_ms = ?, tries = tries + 1 WHERE eni_id = ?",
    ).run(now, eniId);
  }

  unquarantine(eniId: string): void {
    prepared(this.#db, "DELETE FROM bce_quarantine WHERE eni_id = ?").run(eniId);
  }
}
