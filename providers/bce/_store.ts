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
 * Each ENI and each create intent belongs to a profile (`profile`; rows of a
 * database from before profiles migrate as `default`). An ENI row records the
 * groups BCE has on it when they differ from its profile's (a pod's inline
 * groups), NULL meaning "its profile's own, as created"; and its name (the
 * marker, sent along with a description change) and description.
 *
 * The schema is versioned per component (`migrateComponent`, component `bce`):
 * version 1 is the tables as the first releases made them (a database of
 * theirs, which has no version yet, is brought to it in place), version 2 adds
 * the profile columns.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import {
  hasColumn,
  migrateComponent,
  type Migration,
  prepared,
  transaction,
} from "../../lib/sqlite.ts";
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

/** Adds a column unless the table has it (tables made before versioning may or may not). */
function addColumn(db: DatabaseSync, table: string, column: string, decl: string): void {
  if (!hasColumn(db, table, column)) db.exec(`ALTER TABLE ${table} ADD COLUMN ${column} ${decl}`);
}

/** The provider's schema, by version (index i takes it to version i + 1). */
export const MIGRATIONS: readonly Migration[] = [
  // 1: the tables of the first releases, and the lost-ENI columns added after them.
  (db) => {
    db.exec(SCHEMA);
    addColumn(db, "bce_enis", "lost_reason", "TEXT");
    addColumn(db, "bce_enis", "lost_ms", "INTEGER");
  },
  // 2: profiles. Existing ENIs and intents belong to `default`, with its groups.
  (db) => {
    addColumn(db, "bce_enis", "profile", "TEXT NOT NULL DEFAULT 'default'");
    addColumn(db, "bce_enis", "name", "TEXT");
    addColumn(db, "bce_enis", "security_groups", "TEXT");
    addColumn(db, "bce_enis", "enterprise_security_groups", "TEXT");
    addColumn(db, "bce_enis", "description", "TEXT");
    addColumn(db, "bce_intents", "profile", "TEXT NOT NULL DEFAULT 'default'");
    addColumn(db, "bce_intents", "requested_ip6", "TEXT");
    addColumn(db, "bce_intents", "security_groups", "TEXT");
    addColumn(db, "bce_intents", "enterprise_security_groups", "TEXT");
    addColumn(db, "bce_intents", "after_release", "TEXT");
  },
];

const nullableString = z.nullable(z.string());
/** A JSON list of group ids, or null. */
const GroupsColumn = z.pipe(
  z.nullable(z.string()),
  z.transform((s): string[] | null => s === null ? null : z.array(z.string()).parse(JSON.parse(s))),
);

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
  profile: z._default(z.string(), "default"),
  /** The ENI's name (our marker), null when unknown (rows from before profiles). */
  name: z._default(nullableString, null),
  /** The regular groups on the ENI when they are not its profile's; null: the profile's. */
  security_groups: z._default(GroupsColumn, null),
  enterprise_security_groups: z._default(GroupsColumn, null),
  /** The description BCE shows, when known. */
  description: z._default(nullableString, null),
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
  profile: z._default(z.string(), "default"),
  /** A fixed IPv6 address the new ENI gets. */
  requested_ip6: z._default(nullableString, null),
  /** The groups the new ENI is created with when not its profile's (a pod's inline groups). */
  security_groups: z._default(GroupsColumn, null),
  enterprise_security_groups: z._default(GroupsColumn, null),
  /**
   * The release intent whose ENI makes room for this create (a pod at the node
   * limit evicted an idle ENI): the two share one slot while both exist.
   */
  after_release: z._default(nullableString, null),
});
/** One row of `bce_intents`. */
export type IntentRow = z.infer<typeof IntentRowSchema>;
/** The columns of an intent that have defaults. */
type IntentDefaulted =
  | "profile"
  | "requested_ip6"
  | "security_groups"
  | "enterprise_security_groups"
  | "after_release";
/** An intent as written (the profile columns optional). */
export type IntentInput =
  & Omit<IntentRow, IntentDefaulted>
  & Partial<Pick<IntentRow, IntentDefaulted>>;

/** An intent with the defaults of its profile columns filled in. */
function fillIntent(i: IntentInput): IntentRow {
  return {
    profile: "default",
    requested_ip6: null,
    security_groups: null,
    enterprise_security_groups: null,
    after_release: null,
    ...i,
  };
}

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
  profile: string;
  name: string | null;
  /** The groups on the ENI when they are not its profile's; null: the profile's. */
  groups: Groups | null;
  description: string | null;
}

/** An ENI's groups: regular and enterprise (one of them empty). */
export interface Groups {
  securityGroupIds: string[];
  enterpriseSecurityGroupIds: string[];
}

/** The provider's tables. All methods are synchronous, so each is atomic against the others. */
export class BceStore {
  readonly #db: DatabaseSync;

  constructor(db: DatabaseSync) {
    this.#db = db;
    migrateComponent(db, "bce", MIGRATIONS);
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

  /** Free rows (never a lost one), by id; of one profile when given. */
  freeRows(profile?: string): EniRow[] {
    const rows = profile === undefined
      ? prepared(this.#db, "SELECT * FROM bce_enis WHERE pod IS NULL ORDER BY eni_id").all()
      : prepared(
        this.#db,
        "SELECT * FROM bce_enis WHERE pod IS NULL AND profile = ? ORDER BY eni_id",
      ).all(profile);
    return z.array(EniRowSchema).parse(rows);
  }

  /** Assigns a free ENI to `owner`; false when someone else took it first. */
  assign(eniId: string, owner: Owner, now: number): boolean {
    const r = prepared(
      this.#db,
      "UPDATE bce_enis SET pod = ?, container_id = ?, if_name = ?, updated_ms = ? WHERE eni_id = ? AND pod IS NULL",
    ).run(owner.pod, owner.containerId, owner.ifName, now, eniId);
    return Number(r.changes) === 1;
  }

  /** Gives the ENI `from` holds to `to` (a sticky pod's comeback); false when `from` holds none. */
  reassign(from: Owner, to: Owner, now: number): string | null {
    return transaction(this.#db, () => {
      const r = this.rowOf(from);
      if (!r || r.lost_reason !== null) return null;
      prepared(
        this.#db,
        "UPDATE bce_enis SET pod = ?, container_id = ?, if_name = ?, updated_ms = ? WHERE eni_id = ?",
      ).run(to.pod, to.containerId, to.ifName, now, r.eni_id);
      return r.eni_id;
    });
  }

  /** Records the groups BCE has on the ENI (null: its profile's). */
  setGroups(eniId: string, groups: Groups | null, now: number): void {
    prepared(
      this.#db,
      "UPDATE bce_enis SET security_groups = ?, enterprise_security_groups = ?, updated_ms = ? WHERE eni_id = ?",
    ).run(
      groups ? JSON.stringify(groups.securityGroupIds) : null,
      groups ? JSON.stringify(groups.enterpriseSecurityGroupIds) : null,
      now,
      eniId,
    );
  }

  /** Records the description BCE shows. */
  setDescription(eniId: string, description: string): void {
    prepared(this.#db, "UPDATE bce_enis SET description = ? WHERE eni_id = ?").run(
      description,
      eniId,
    );
  }

  /** Records the ENI's name where it is not known yet (rows from before profiles). */
  learnName(eniId: string, name: string): void {
    prepared(this.#db, "UPDATE bce_enis SET name = ? WHERE eni_id = ? AND name IS NULL").run(
      name,
      eniId,
    );
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
        `INSERT OR REPLACE INTO bce_enis (eni_id, mac, subnet_id, ipv4, ipv6, pod, container_id,
           if_name, updated_ms, lost_reason, lost_ms, profile, name, security_groups,
           enterprise_security_groups, description)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?, ?, ?, ?)`,
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
        eni.profile,
        eni.name,
        eni.groups ? JSON.stringify(eni.groups.securityGroupIds) : null,
        eni.groups ? JSON.stringify(eni.groups.enterpriseSecurityGroupIds) : null,
        eni.description,
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

  /** Intents in flight. */
  intentCount(): number {
    return z.object({ n: z.number() }).parse(
      prepared(this.#db, "SELECT COUNT(*) AS n FROM bce_intents").get(),
    ).n;
  }

  /**
   * Intents that hold a node slot: all of them, except a create that waits for the
   * release of the ENI it displaces (the two share that ENI's slot while both exist).
   */
  intentSlots(): number {
    return z.object({ n: z.number() }).parse(
      prepared(
        this.#db,
        `SELECT COUNT(*) AS n FROM bce_intents i WHERE NOT (i.after_release IS NOT NULL
           AND EXISTS (SELECT 1 FROM bce_intents r WHERE r.id = i.after_release))`,
      ).get(),
    ).n;
  }

  insertIntent(input: IntentInput): void {
    const i = fillIntent(input);
    prepared(
      this.#db,
      `INSERT INTO bce_intents (id, kind, client_token, name, eni_id, requested_ip, purpose, phase,
         created_ms, profile, requested_ip6, security_groups, enterprise_security_groups,
         after_release)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
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
      i.profile,
      i.requested_ip6,
      i.security_groups ? JSON.stringify(i.security_groups) : null,
      i.enterprise_security_groups ? JSON.stringify(i.enterprise_security_groups) : null,
      i.after_release,
    );
  }

  intent(id: string): IntentRow | null {
    const r = prepared(this.#db, "SELECT * FROM bce_intents WHERE id = ?").get(id);
    return r === undefined ? null : IntentRowSchema.parse(r);
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

  /**
   * Moves a free ENI into a release intent, in one transaction: the one named by
   * `eniId`, else the most recently freed one (of `profile`, when given). Null when
   * there is none (or it was taken first).
   */
  takeFreeForRelease(
    intent: Omit<IntentInput, "eni_id">,
    which: { eniId?: string; profile?: string } = {},
  ): IntentRow | null {
    return transaction(this.#db, () => {
      const r = which.eniId !== undefined
        ? prepared(this.#db, "SELECT * FROM bce_enis WHERE eni_id = ? AND pod IS NULL").get(
          which.eniId,
        )
        : which.profile !== undefined
        ? prepared(
          this.#db,
          "SELECT * FROM bce_enis WHERE pod IS NULL AND profile = ? ORDER BY updated_ms DESC, eni_id LIMIT 1",
        ).get(which.profile)
        : prepared(
          this.#db,
          "SELECT * FROM bce_enis WHERE pod IS NULL ORDER BY updated_ms DESC, eni_id LIMIT 1",
        ).get();
      if (r === undefined) return null;
      const row = EniRowSchema.parse(r);
      const del = prepared(this.#db, "DELETE FROM bce_enis WHERE eni_id = ? AND pod IS NULL")
        .run(row.eni_id);
      if (Number(del.changes) !== 1) return null;
      const full = fillIntent({ ...intent, eni_id: row.eni_id, profile: row.profile });
      this.insertIntent(full);
      return full;
    });
  }

  /** Moves an owned ENI out of the pool into a release intent (it must not serve another pod). */
  releaseOwned(eniId: string, intent: Omit<IntentInput, "eni_id">): IntentRow | null {
    return transaction(this.#db, () => {
      const row = this.row(eniId);
      if (!row) return null;
      this.drop(eniId);
      const full = fillIntent({ ...intent, eni_id: eniId, profile: row.profile });
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
