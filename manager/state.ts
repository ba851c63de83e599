/**
 * The agent's state store over node:sqlite: one row per CNI attachment, keyed
 * by (container_id, if_name), with the intent/outcome state the manager needs
 * to finish or roll back any half-done operation after a crash.
 *
 * Every write is one transaction (committed before the manager goes on to the
 * next step); every row read is parsed with zod.
 *
 * Why one file: the table's schema, its migrations and the queries over it are one
 * contract (the CHECK constraints are the crash protocol's invariants); splitting
 * them would put the SQL and the code that relies on it in different places.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import type { DatabaseSync } from "node:sqlite";
import {
  type Addition,
  migrateComponent,
  type Migration,
  prepared,
  transaction,
} from "../lib/sqlite.ts";
import { VERSION } from "../lib/version.ts";
import {
  type Attachment,
  type AttachmentState,
  AttachmentStateSchema,
  type Mode,
  ModeSchema,
} from "../api/schema.ts";

/** The first schema (version 1), as agents before per-component versions made it. */
const V1 = `CREATE TABLE attachments (
    container_id TEXT NOT NULL,
    if_name TEXT NOT NULL,
    pod TEXT NOT NULL,
    pod_uid TEXT,
    network TEXT NOT NULL,
    netns TEXT NOT NULL,
    netns_dev INTEGER,
    netns_ino INTEGER,
    mode TEXT NOT NULL CHECK (mode IN ('interface', 'ipam')),
    state TEXT NOT NULL CHECK (state IN ('adding', 'ready', 'recycling', 'deleting')),
    eni_id TEXT,
    mac TEXT,
    node_name TEXT,
    ifindex INTEGER,
    result TEXT,
    recycle_since INTEGER,
    gc_failures INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (container_id, if_name),
    CHECK (state NOT IN ('ready', 'recycling') OR (eni_id IS NOT NULL AND result IS NOT NULL)),
    CHECK (state <> 'recycling' OR recycle_since IS NOT NULL)
  );
  CREATE UNIQUE INDEX attachments_eni ON attachments (eni_id) WHERE eni_id IS NOT NULL;
  CREATE INDEX attachments_pod ON attachments (pod);
  CREATE INDEX attachments_state ON attachments (state);`;

/** Migrations of the `state` component, in order: index i brings it to version i + 1. */
const MIGRATIONS: Migration[] = [
  (db) => {
    // Databases of earlier agents recorded version 1 in `enim_schema`.
    const legacy = db.prepare(
      "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'enim_schema'",
    ).get();
    if (!legacy) db.exec(V1);
  },
  // Profiles and sticky holds: the table is rebuilt (SQLite cannot change a CHECK).
  `CREATE TABLE attachments_v2 (
    container_id TEXT NOT NULL,
    if_name TEXT NOT NULL,
    pod TEXT NOT NULL,
    pod_uid TEXT,
    network TEXT NOT NULL,
    netns TEXT NOT NULL,
    netns_dev INTEGER,
    netns_ino INTEGER,
    mode TEXT NOT NULL CHECK (mode IN ('interface', 'ipam')),
    state TEXT NOT NULL CHECK (state IN ('adding', 'ready', 'recycling', 'deleting', 'held')),
    eni_id TEXT,
    mac TEXT,
    node_name TEXT,
    ifindex INTEGER,
    result TEXT,
    recycle_since INTEGER,
    gc_failures INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    profile TEXT NOT NULL DEFAULT 'default',
    sticky INTEGER NOT NULL DEFAULT 0 CHECK (sticky IN (0, 1)),
    hold_until INTEGER,
    PRIMARY KEY (container_id, if_name),
    CHECK (state NOT IN ('ready', 'recycling', 'held') OR (eni_id IS NOT NULL AND result IS NOT NULL)),
    CHECK (state <> 'recycling' OR recycle_since IS NOT NULL),
    CHECK (state <> 'held' OR hold_until IS NOT NULL)
  );
  INSERT INTO attachments_v2 (container_id, if_name, pod, pod_uid, network, netns, netns_dev,
    netns_ino, mode, state, eni_id, mac, node_name, ifindex, result, recycle_since, gc_failures,
    last_error, created_at, updated_at)
    SELECT container_id, if_name, pod, pod_uid, network, netns, netns_dev, netns_ino, mode, state,
      eni_id, mac, node_name, ifindex, result, recycle_since, gc_failures, last_error, created_at,
      updated_at FROM attachments;
  DROP TABLE attachments;
  ALTER TABLE attachments_v2 RENAME TO attachments;
  CREATE UNIQUE INDEX attachments_eni ON attachments (eni_id) WHERE eni_id IS NOT NULL;
  CREATE INDEX attachments_pod ON attachments (pod);
  CREATE INDEX attachments_state ON attachments (state);`,
  // Zone-wide sticky pods: a held ENI's node hold ends at hold_until; it is then
  // parked in the VPC until park_until (null: node scope, freed at hold_until).
  `ALTER TABLE attachments ADD COLUMN park_until INTEGER;`,
  // The host link (issue 27): its two ends and Service CIDRs, as JSON, written before
  // the link is made, so a crash leaves what it takes to remove it. Each column only
  // when missing: a database of the issue-27 branch recorded version 3 with `host_link`
  // and without `park_until`, and takes the one it lacks here.
  (db) => {
    const columns = new Set(
      db.prepare("SELECT name FROM pragma_table_info('attachments')").all()
        .map((r) => String(r.name)),
    );
    if (!columns.has("park_until")) {
      db.exec("ALTER TABLE attachments ADD COLUMN park_until INTEGER;");
    }
    if (!columns.has("host_link")) db.exec("ALTER TABLE attachments ADD COLUMN host_link TEXT;");
  },
];

/**
 * Changes of the `state` component since 0.1.0, each one 0.1.0 opens (`Addition` in
 * lib/sqlite.ts; MIGRATIONS stay at 0.1.0's four).
 */
const ADDITIONS: Addition[] = [
  // Which versions of enim have opened this state, and when first and last: what an
  // operator (and a rolled-back agent's log) reads after an upgrade or a rollback.
  {
    name: "writers",
    up: `CREATE TABLE IF NOT EXISTS enim_writers (version TEXT PRIMARY KEY,
      first_at INTEGER NOT NULL, last_at INTEGER NOT NULL)`,
  },
];

/** The schema version this code writes: 0.1.0's, for 0.1.0 to open it (see ADDITIONS). */
export const SCHEMA_VERSION = MIGRATIONS.length;

/** A row of `attachments`, parsed. Times are epoch milliseconds. */
export const AttachmentRowSchema = z.object({
  containerId: z.string(),
  ifName: z.string(),
  pod: z.string(),
  podUid: z.nullable(z.string()),
  network: z.string(),
  netns: z.string(),
  netnsDev: z.nullable(z.number()),
  netnsIno: z.nullable(z.number()),
  mode: ModeSchema,
  state: AttachmentStateSchema,
  eniId: z.nullable(z.string()),
  mac: z.nullable(z.string()),
  nodeName: z.nullable(z.string()),
  ifindex: z.nullable(z.number()),
  result: z.nullable(z.string()),
  recycleSince: z.nullable(z.number()),
  gcFailures: z.number(),
  lastError: z.nullable(z.string()),
  createdAt: z.number(),
  updatedAt: z.number(),
  /** The profile whose ENI it holds. */
  profile: z.string(),
  /** Whether its pod asked to keep its ENI through a delete and re-create. */
  sticky: z.pipe(z.number(), z.transform((n) => n === 1)),
  /** When a held ENI goes back to the pool (state `held`), or is parked (zone scope). */
  holdUntil: z.nullable(z.number()),
  /** Zone scope: until when a held ENI, parked in the VPC after its node hold, waits for its pod. */
  parkUntil: z.nullable(z.number()),
  /** The attachment's host link as JSON ({@linkcode RecordedHostLinkSchema}), or null. */
  hostLink: z._default(z.nullable(z.string()), null),
});
/** A row of `attachments`. */
export type AttachmentRow = z.infer<typeof AttachmentRowSchema>;

import type { AttachmentKey } from "../providers/schema.ts";

const COLUMNS: Record<keyof AttachmentRow, string> = {
  containerId: "container_id",
  ifName: "if_name",
  pod: "pod",
  podUid: "pod_uid",
  network: "network",
  netns: "netns",
  netnsDev: "netns_dev",
  netnsIno: "netns_ino",
  mode: "mode",
  state: "state",
  eniId: "eni_id",
  mac: "mac",
  nodeName: "node_name",
  ifindex: "ifindex",
  result: "result",
  recycleSince: "recycle_since",
  gcFailures: "gc_failures",
  lastError: "last_error",
  createdAt: "created_at",
  updatedAt: "updated_at",
  profile: "profile",
  sticky: "sticky",
  holdUntil: "hold_until",
  parkUntil: "park_until",
  hostLink: "host_link",
};

/** What a row records of its host link (the `host_link` column). */
export const RecordedHostLinkSchema = z.object({
  nodeIfName: z.string(),
  podIfName: z.string(),
  serviceCidrs: z.array(z.string()),
  /**
   * The node-side table of the pod's own Service traffic (issue 34); absent on a link
   * made before it (the legacy layout: the node masquerades that traffic instead).
   */
  table: z.optional(z.number().check(z.int())),
});
/** What a row records of its host link. */
export type RecordedHostLink = z.infer<typeof RecordedHostLinkSchema>;

/** A row's host link, parsed; null when it has none. */
export function hostLinkOf(r: Pick<AttachmentRow, "hostLink">): RecordedHostLink | null {
  return r.hostLink === null ? null : RecordedHostLinkSchema.parse(JSON.parse(r.hostLink));
}
/** A row of {@linkcode StateStore.hostLinkTables}. */
const HostLinkTableRowSchema = z.object({
  containerId: z.string(),
  ifName: z.string(),
  table: z.number().check(z.int()),
});
const SELECT = `SELECT ${
  Object.entries(COLUMNS).map(([k, c]) => `${c} AS "${k}"`).join(", ")
} FROM attachments`;

/** What an ADD records as its intent. */
export interface NewAttachment {
  containerId: string;
  ifName: string;
  pod: string;
  podUid: string | null;
  network: string;
  netns: string;
  mode: Mode;
  /** The netns file's identity, when known at intent time. */
  netnsDev?: number | null;
  netnsIno?: number | null;
  profile?: string;
  sticky?: boolean;
}

type Patch = Partial<
  Omit<AttachmentRow, "containerId" | "ifName" | "createdAt" | "updatedAt" | "sticky">
>;

/** The state store. Create it with {@linkcode StateStore.open}. */
export class StateStore {
  readonly db: DatabaseSync;
  readonly #now: () => number;

  private constructor(db: DatabaseSync, now: () => number) {
    this.db = db;
    this.#now = now;
  }

  /** Migrates `db` to {@linkcode SCHEMA_VERSION} (idempotent) and returns the store. */
  static open(db: DatabaseSync, now: () => number = Date.now): StateStore {
    migrate(db, now);
    const t = now();
    prepared(
      db,
      `INSERT INTO enim_writers (version, first_at, last_at) VALUES (?, ?, ?)
         ON CONFLICT (version) DO UPDATE SET last_at = excluded.last_at`,
    ).run(VERSION, t, t);
    return new StateStore(db, now);
  }

  /** The versions of enim that opened this state, oldest first (since 0.2.0: 0.1.0 records none). */
  writers(): { version: string; firstAt: number; lastAt: number }[] {
    return prepared(
      this.db,
      "SELECT version, first_at, last_at FROM enim_writers ORDER BY first_at",
    )
      .all().map((r) => WriterRowSchema.parse(r)).map((r) => ({
        version: r.version,
        firstAt: r.first_at,
        lastAt: r.last_at,
      }));
  }

  /** The schema version recorded in the database. */
  version(): number {
    return schemaVersion(this.db);
  }

  #rows(where: string, ...params: (string | number | null)[]): AttachmentRow[] {
    return prepared(this.db, `${SELECT} ${where}`).all(...params).map((r) =>
      AttachmentRowSchema.parse(r)
    );
  }

  /** The attachment with this key, or null. */
  get(k: AttachmentKey): AttachmentRow | null {
    return this.#rows("WHERE container_id = ? AND if_name = ?", k.containerId, k.ifName)[0] ?? null;
  }

  /**
   * The per-pod routing tables the host links of rows not held record (issue 34), by
   * attachment key: what an ADD must not reuse. One narrow query, not every row parsed
   * whole: an ADD asks it each time.
   */
  hostLinkTables(): { key: AttachmentKey; table: number }[] {
    return prepared(
      this.db,
      `SELECT container_id AS "containerId", if_name AS "ifName",
         json_extract(host_link, '$.table') AS "table" FROM attachments
       WHERE state != 'held' AND json_extract(host_link, '$.table') IS NOT NULL`,
    ).all().map((r) => {
      const row = HostLinkTableRowSchema.parse(r);
      return { key: { containerId: row.containerId, ifName: row.ifName }, table: row.table };
    });
  }

  /** Every attachment, oldest first. */
  all(): AttachmentRow[] {
    return this.#rows("ORDER BY created_at, container_id, if_name");
  }

  /** Attachments in one of `states`. */
  inState(...states: AttachmentState[]): AttachmentRow[] {
    return this.#rows(
      `WHERE state IN (${states.map(() => "?").join(", ")}) ORDER BY created_at`,
      ...states,
    );
  }

  /** Attachments of one pod (`namespace/name`). */
  byPod(pod: string): AttachmentRow[] {
    return this.#rows("WHERE pod = ? ORDER BY created_at", pod);
  }

  /** The attachment that records `eniId`, or null. */
  byEni(eniId: string): AttachmentRow | null {
    return this.#rows("WHERE eni_id = ?", eniId)[0] ?? null;
  }

  /** Records an ADD's intent: a row in state `adding`. Throws when the key exists. */
  insertAdding(a: NewAttachment): AttachmentRow {
    const now = this.#now();
    transaction(this.db, () => {
      prepared(
        this.db,
        `INSERT INTO attachments (container_id, if_name, pod, pod_uid, network, netns, netns_dev,
           netns_ino, mode, state, created_at, updated_at, profile, sticky)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'adding', ?, ?, ?, ?)`,
      ).run(
        a.containerId,
        a.ifName,
        a.pod,
        a.podUid,
        a.network,
        a.netns,
        a.netnsDev ?? null,
        a.netnsIno ?? null,
        a.mode,
        now,
        now,
        a.profile ?? "default",
        a.sticky ? 1 : 0,
      );
    });
    return this.get(a)!;
  }

  /** Updates fields of one attachment in one transaction; returns the row or null when gone. */
  update(k: AttachmentKey, patch: Patch): AttachmentRow | null {
    transaction(this.db, () => this.#update(k, patch));
    return this.get(k);
  }

  #update(k: AttachmentKey, patch: Patch): void {
    const entries = Object.entries(patch).filter(([, v]) => v !== undefined);
    const sets = entries.map(([f]) => `${COLUMNS[f as keyof AttachmentRow]} = ?`);
    sets.push("updated_at = ?");
    prepared(
      this.db,
      `UPDATE attachments SET ${sets.join(", ")} WHERE container_id = ? AND if_name = ?`,
    ).run(
      ...entries.map(([, v]) => v as string | number | null),
      this.#now(),
      k.containerId,
      k.ifName,
    );
  }

  /**
   * Records an ADD's outcome in one transaction: the row becomes `ready` with its
   * result, and the pod's other ready attachments of older containers become
   * `recycling` (the seed's rule). Returns the keys marked recycling.
   */
  markReady(k: AttachmentKey, pod: string, patch: Patch): AttachmentKey[] {
    const now = this.#now();
    return transaction(this.db, () => {
      const older = this.#rows(
        "WHERE pod = ? AND state = 'ready' AND container_id <> ?",
        pod,
        k.containerId,
      );
      for (const o of older) this.#update(o, { state: "recycling", recycleSince: now });
      this.#update(k, { ...patch, state: "ready" });
      return older.map((o) => ({ containerId: o.containerId, ifName: o.ifName }));
    });
  }

  /**
   * The ENI a sticky pod left behind for this interface: its `held` row, if any
   * (one per pod and interface name).
   */
  heldFor(pod: string, ifName: string): AttachmentRow | null {
    return this.#rows(
      "WHERE pod = ? AND if_name = ? AND state = 'held' ORDER BY updated_at DESC",
      pod,
      ifName,
    )[0] ??
      null;
  }

  /**
   * A sticky pod's comeback, in one transaction: the `held` row goes, and the
   * `adding` row `k` records its ENI, MAC and node name (the ENI is then given to
   * `k`'s owner in the provider). Returns the held row, or null when it is no
   * longer held (GC freed it meanwhile).
   */
  takeOver(held: AttachmentKey, k: AttachmentKey): AttachmentRow | null {
    return transaction(this.db, () => {
      const h = this.get(held);
      if (!h || h.state !== "held") return null;
      prepared(this.db, "DELETE FROM attachments WHERE container_id = ? AND if_name = ?")
        .run(held.containerId, held.ifName);
      this.#update(k, { eniId: h.eniId, mac: h.mac, nodeName: h.nodeName });
      return h;
    });
  }

  /**
   * A sticky pod's container back under its own key (podman's restart, an ADD sent
   * again after the DEL), in one transaction: its `held` row becomes the `adding` row
   * of `a`, keeping the ENI, MAC and node name of the hold and dropping the rest of
   * the old attachment. Returns the held row as it was, or null when it is no longer
   * held (GC freed it meanwhile): then `a` is recorded as a new intent instead.
   */
  reviveHeld(a: NewAttachment): AttachmentRow | null {
    return transaction(this.db, () => {
      const h = this.get(a);
      if (!h) {
        this.insertAdding(a);
        return null;
      }
      if (h.state !== "held") {
        throw new Error(`Attachment "${a.containerId}/${a.ifName}" is ${h.state}, not held`);
      }
      this.#update(a, {
        pod: a.pod,
        podUid: a.podUid,
        network: a.network,
        netns: a.netns,
        netnsDev: a.netnsDev ?? null,
        netnsIno: a.netnsIno ?? null,
        mode: a.mode,
        state: "adding",
        ifindex: null,
        result: null,
        recycleSince: null,
        gcFailures: 0,
        lastError: null,
        profile: a.profile ?? "default",
        holdUntil: null,
        parkUntil: null,
        hostLink: null,
      });
      prepared(
        this.db,
        "UPDATE attachments SET sticky = ?, created_at = ? WHERE container_id = ? AND if_name = ?",
      ).run(a.sticky ? 1 : 0, this.#now(), a.containerId, a.ifName);
      return h;
    });
  }

  /**
   * Records a DEL of a sticky pod: the ENI stays its pod's on this node until
   * `holdUntil`, then (zone scope, `parkUntil` given) parked in the VPC until `parkUntil`.
   */
  markHeld(k: AttachmentKey, holdUntil: number, parkUntil: number | null = null): void {
    transaction(
      this.db,
      () => this.#update(k, { state: "held", holdUntil, parkUntil, lastError: null }),
    );
  }

  /** Records a failure of a reclaim or release on the row. */
  recordFailure(k: AttachmentKey, error: string): void {
    transaction(this.db, () => {
      prepared(
        this.db,
        `UPDATE attachments SET gc_failures = gc_failures + 1, last_error = ?, updated_at = ?
           WHERE container_id = ? AND if_name = ?`,
      ).run(error, this.#now(), k.containerId, k.ifName);
    });
  }

  /** Deletes the attachment (the outcome of a DEL, rollback or reclaim). */
  delete(k: AttachmentKey): void {
    transaction(this.db, () => {
      prepared(this.db, "DELETE FROM attachments WHERE container_id = ? AND if_name = ?")
        .run(k.containerId, k.ifName);
    });
  }

  /** Every row, in key order, for before/after comparisons in tests. */
  dump(): AttachmentRow[] {
    return this.#rows("ORDER BY container_id, if_name");
  }
}

/** The API view of a row. */
export function toAttachment(r: AttachmentRow): Attachment {
  return {
    containerId: r.containerId,
    ifName: r.ifName,
    pod: r.pod,
    podUid: r.podUid,
    network: r.network,
    netns: r.netns,
    mode: r.mode,
    state: r.state,
    eniId: r.eniId,
    mac: r.mac,
    nodeName: r.nodeName,
    createdAt: new Date(r.createdAt).toISOString(),
    updatedAt: new Date(r.updatedAt).toISOString(),
    profile: r.profile,
    sticky: r.sticky,
    holdUntil: r.holdUntil === null ? null : new Date(r.holdUntil).toISOString(),
    parkUntil: r.parkUntil === null ? null : new Date(r.parkUntil).toISOString(),
    hostLink: hostLinkOf(r),
    delAnsweredAt: null,
  };
}

function schemaVersion(db: DatabaseSync): number {
  const row = db.prepare(
    "SELECT max(version) AS v FROM enim_migrations WHERE component = 'state'",
  ).get() as { v: number | null } | undefined;
  return row?.v ?? 0;
}

/** Brings `db` to the current schema: every pending migration in one transaction. */
export function migrate(db: DatabaseSync, now: () => number = Date.now): void {
  migrateComponent(db, "state", MIGRATIONS, now, ADDITIONS);
}

const WriterRowSchema = z.object({
  version: z.string(),
  first_at: z.number(),
  last_at: z.number(),
});
