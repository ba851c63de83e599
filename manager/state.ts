/**
 * The agent's state store over node:sqlite: one row per CNI attachment, keyed
 * by (container_id, if_name), with the intent/outcome state the manager needs
 * to finish or roll back any half-done operation after a crash.
 *
 * Every write is one transaction (committed before the manager goes on to the
 * next step); every row read is parsed with zod.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import type { DatabaseSync } from "node:sqlite";
import { prepared, transaction } from "../lib/sqlite.ts";
import type { Attachment } from "./api_schema.ts";

/** The attachment states: the intent (adding, deleting) or the outcome (ready, recycling). */
export const AttachmentStateSchema = z.enum(["adding", "ready", "recycling", "deleting"]);
/** An attachment state. */
export type AttachmentState = z.infer<typeof AttachmentStateSchema>;

/** Migrations, in order: index i brings the schema to version i + 1. */
const MIGRATIONS: string[] = [
  `CREATE TABLE attachments (
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
  CREATE INDEX attachments_state ON attachments (state);`,
];

/** The schema version this code writes. */
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
  mode: z.enum(["interface", "ipam"]),
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
});
/** A row of `attachments`. */
export type AttachmentRow = z.infer<typeof AttachmentRowSchema>;

/** An attachment's key. */
export interface AttachmentKey {
  containerId: string;
  ifName: string;
}

/** The key as one string (for maps and locks). */
export function keyOf(k: AttachmentKey): string {
  return `${k.containerId}/${k.ifName}`;
}

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
};
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
  mode: "interface" | "ipam";
  /** The netns file's identity, when known at intent time. */
  netnsDev?: number | null;
  netnsIno?: number | null;
}

type Patch = Partial<Omit<AttachmentRow, "containerId" | "ifName" | "createdAt" | "updatedAt">>;

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
    return new StateStore(db, now);
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
           netns_ino, mode, state, created_at, updated_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'adding', ?, ?)`,
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
  };
}

function schemaVersion(db: DatabaseSync): number {
  const row = db.prepare("SELECT max(version) AS v FROM enim_schema").get() as
    | { v: number | null }
    | undefined;
  return row?.v ?? 0;
}

/** Brings `db` to the current schema: every pending migration in one transaction. */
export function migrate(db: DatabaseSync, now: () => number = Date.now): void {
  db.exec(
    "CREATE TABLE IF NOT EXISTS enim_schema (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
  );
  transaction(db, () => {
    const v = schemaVersion(db);
    if (v > MIGRATIONS.length) {
      throw new Error(
        `The state database has schema version ${v}; this enim knows up to ${MIGRATIONS.length}`,
      );
    }
    for (let i = v; i < MIGRATIONS.length; i++) {
      db.exec(MIGRATIONS[i]);
      db.prepare("INSERT INTO enim_schema (version, applied_at) VALUES (?, ?)").run(i + 1, now());
    }
  });
}
