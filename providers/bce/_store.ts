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
 * Zone-wide sticky pods add a flag and the cloud's name to an ENI row, `park`
 * and `claim` intents, and two small lists: the ENIs this node parked
 * (`bce_parked`) and the claims it made (`bce_claims`).
 *
 * The DDL, the migrations and the row schemas are in `_tables.ts`.
 *
 * Why one file: every query over the provider's tables is here, so that each
 * multi-table change (an ENI leaving the pool for an intent, a claim finished)
 * is one transaction in one place; the class is long because the tables are
 * many, not because any method is.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import { migrateComponent, prepared, transaction } from "../../lib/sqlite.ts";
import type { Owner } from "../contract.ts";
import {
  ClaimRowSchema,
  EniRowSchema,
  fillIntent,
  type IntentInput,
  type IntentRow,
  IntentRowSchema,
  MIGRATIONS,
  ParkedRowSchema,
  QuarantineRowSchema,
} from "./_tables.ts";
import type { ClaimRow, EniRecord, EniRow, Groups, ParkedRow, QuarantineRow } from "./_tables.ts";

export type {
  ClaimRow,
  EniRecord,
  EniRow,
  Groups,
  IntentInput,
  IntentRow,
  ParkedRow,
  QuarantineRow,
} from "./_tables.ts";
export { MIGRATIONS } from "./_tables.ts";

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

  /** Returns an owned ENI to the free pool (no zone-sticky pod owns it any more). */
  unassign(eniId: string, now: number): void {
    prepared(
      this.#db,
      "UPDATE bce_enis SET pod = NULL, container_id = NULL, if_name = NULL, lost_reason = NULL, lost_ms = NULL, sticky = 0, updated_ms = ? WHERE eni_id = ?",
    ).run(now, eniId);
  }

  /** Records whether a zone-sticky pod owns the ENI. */
  setSticky(eniId: string, sticky: boolean): void {
    prepared(this.#db, "UPDATE bce_enis SET sticky = ? WHERE eni_id = ?").run(
      sticky ? 1 : 0,
      eniId,
    );
  }

  /** Records the name (null: the row's own) and description BCE shows. */
  setCloudRecord(eniId: string, cloudName: string | null, description: string): void {
    prepared(this.#db, "UPDATE bce_enis SET cloud_name = ?, description = ? WHERE eni_id = ?").run(
      cloudName,
      description,
      eniId,
    );
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
         after_release, owner_pod, owner_container, owner_if, until_ms)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
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
      i.owner_pod,
      i.owner_container,
      i.owner_if,
      i.until_ms,
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

  // ---- zone-wide sticky pods ------------------------------------------------------

  /**
   * Moves an owned ENI into a `park` intent and this node's parked list, in one
   * transaction (it must serve no other pod). Null when it is not tracked any more.
   */
  parkOwned(
    eniId: string,
    intent: Omit<IntentInput, "eni_id" | "profile">,
  ): IntentRow | null {
    return transaction(this.#db, () => {
      const row = this.row(eniId);
      if (!row) return null;
      this.drop(eniId);
      const full = fillIntent({ ...intent, eni_id: eniId, profile: row.profile });
      this.insertIntent(full);
      prepared(
        this.#db,
        `INSERT OR REPLACE INTO bce_parked (eni_id, pod, if_name, profile, state, parked_ms, until_ms)
         VALUES (?, ?, ?, ?, 'parking', ?, ?)`,
      ).run(eniId, full.owner_pod!, full.owner_if!, full.profile, full.created_ms, full.until_ms!);
      return full;
    });
  }

  /**
   * Records a `park` intent (and a parked entry) for an ENI that no row or intent
   * tracks; null when something does.
   */
  parkUntracked(eniId: string, intent: Omit<IntentInput, "eni_id">): IntentRow | null {
    return transaction(this.#db, () => {
      if (this.row(eniId) || this.intents().some((i) => i.eni_id === eniId)) return null;
      const full = fillIntent({ ...intent, eni_id: eniId });
      this.insertIntent(full);
      prepared(
        this.#db,
        `INSERT OR REPLACE INTO bce_parked (eni_id, pod, if_name, profile, state, parked_ms, until_ms)
         VALUES (?, ?, ?, ?, 'parking', ?, ?)`,
      ).run(eniId, full.owner_pod!, full.owner_if!, full.profile, full.created_ms, full.until_ms!);
      return full;
    });
  }

  /** Ends a park intent: the ENI is in the VPC (`parked`), or it was not parked (dropped). */
  endPark(intentId: string, eniId: string, parked: boolean): void {
    transaction(this.#db, () => {
      prepared(this.#db, "DELETE FROM bce_intents WHERE id = ?").run(intentId);
      if (parked) {
        prepared(this.#db, "UPDATE bce_parked SET state = 'parked' WHERE eni_id = ?").run(eniId);
      } else {
        prepared(this.#db, "DELETE FROM bce_parked WHERE eni_id = ?").run(eniId);
      }
    });
  }

  /** The ENIs this node parked, oldest first. */
  parked(): ParkedRow[] {
    return z.array(ParkedRowSchema).parse(
      prepared(this.#db, "SELECT * FROM bce_parked ORDER BY parked_ms, eni_id").all(),
    );
  }

  /** Forgets a parked ENI (claimed, reclaimed, gone); the entry when this node had one. */
  dropParked(eniId: string): ParkedRow | null {
    return transaction(this.#db, () => {
      const r = prepared(this.#db, "SELECT * FROM bce_parked WHERE eni_id = ?").get(eniId);
      if (r === undefined) return null;
      prepared(this.#db, "DELETE FROM bce_parked WHERE eni_id = ?").run(eniId);
      return ParkedRowSchema.parse(r);
    });
  }

  /**
   * A claim done, in one transaction: the ENI's owned row (a zone-sticky pod's,
   * showing `cloudName`) replaces the claim intent, the claim is listed (the last
   * 100 kept), and this node's parked entry of it, if any, goes.
   */
  finishClaim(
    intentId: string,
    eni: EniRecord,
    owner: Owner,
    o: { cloudName: string | null; from: string | null; now: number },
  ): void {
    transaction(this.#db, () => {
      this.insert(eni, owner, o.now, intentId);
      prepared(this.#db, "UPDATE bce_enis SET sticky = 1, cloud_name = ? WHERE eni_id = ?").run(
        o.cloudName,
        eni.id,
      );
      prepared(
        this.#db,
        "INSERT INTO bce_claims (eni_id, pod, if_name, from_instance, at_ms) VALUES (?, ?, ?, ?, ?)",
      ).run(eni.id, owner.pod, owner.ifName, o.from, o.now);
      prepared(
        this.#db,
        "DELETE FROM bce_claims WHERE seq <= (SELECT MAX(seq) - 100 FROM bce_claims)",
      ).run();
      prepared(this.#db, "DELETE FROM bce_parked WHERE eni_id = ?").run(eni.id);
    });
  }

  /** The claims this node made, newest first (the last 100). */
  claims(): ClaimRow[] {
    return z.array(ClaimRowSchema).parse(
      prepared(this.#db, "SELECT * FROM bce_claims ORDER BY seq DESC").all(),
    );
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
