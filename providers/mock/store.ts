/**
 * The mock cloud's table (`mock_enis`, component `mock` in `enim_migrations`),
 * its rows parsed on the way out, and how a row reads as an ENI.
 *
 * @module
 */
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import type { Eni, Owner } from "../contract.ts";
import type { DatabaseSync } from "node:sqlite";
import { hasColumn, type Migration, prepared } from "../../lib/sqlite.ts";

/** The tables of the mock cloud, by version (`migrateComponent`, component `mock`). */
export const MIGRATIONS: Migration[] = [
  `CREATE TABLE IF NOT EXISTS mock_enis (
    id TEXT PRIMARY KEY,
    idx INTEGER NOT NULL UNIQUE,
    mac TEXT NOT NULL UNIQUE,
    ipv4 TEXT, ipv4_prefix INTEGER, ipv4_gw TEXT,
    ipv6 TEXT, ipv6_prefix INTEGER, ipv6_gw TEXT,
    subnet_id TEXT,
    attach TEXT NOT NULL CHECK (attach IN ('detached', 'attaching', 'attached')),
    owner_pod TEXT, owner_container TEXT, owner_if TEXT,
    CHECK ((owner_container IS NULL) = (owner_if IS NULL) AND (owner_if IS NULL) = (owner_pod IS NULL)),
    CHECK (attach <> 'detached' OR owner_container IS NULL)
  );
  CREATE UNIQUE INDEX IF NOT EXISTS mock_enis_owner
    ON mock_enis (owner_container, owner_if) WHERE owner_container IS NOT NULL;`,
  (db) => {
    // Profiles, security groups and descriptions (tables of older agents lack them).
    const add = (col: string, decl: string) => {
      if (!hasColumn(db, "mock_enis", col)) {
        db.exec(`ALTER TABLE mock_enis ADD COLUMN ${col} ${decl}`);
      }
    };
    add("profile", "TEXT NOT NULL DEFAULT 'default'");
    add("security_groups", "TEXT NOT NULL DEFAULT '[]'");
    add("enterprise_security_groups", "TEXT NOT NULL DEFAULT '[]'");
    add("description", "TEXT");
  },
  // What the simulated cloud says of the node, changed behind the agent's back by tests
  // (a new quota, another program's ENIs, an outage): one row.
  `CREATE TABLE IF NOT EXISTS mock_node (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    max_enis INTEGER CHECK (max_enis IS NULL OR max_enis >= 0),
    foreign_enis INTEGER NOT NULL DEFAULT 0 CHECK (foreign_enis >= 0),
    unreachable TEXT
  );
  INSERT OR IGNORE INTO mock_node (id) VALUES (1);`,
];

/**
 * What the simulated cloud says of the node (`mock_node`), besides its ENIs:
 * `maxEnis`, the node's ENI quota now (null: `maxEnisPerNode` of the config, or
 * the inventory); `foreignEnis`, ENIs attached to the node that are not enim's
 * (each takes a slot of the quota); `unreachable`, set while the cloud does not
 * answer (the message its calls fail with).
 */
export interface MockNode {
  maxEnis: number | null;
  foreignEnis: number;
  unreachable: string | null;
}

const NodeRowSchema = z.object({
  max_enis: z.nullable(z.number()),
  foreign_enis: z.number(),
  unreachable: z.nullable(z.string()),
});

/** Reads the node's row. */
export function readMockNode(db: DatabaseSync): MockNode {
  const r = NodeRowSchema.parse(
    prepared(db, "SELECT max_enis, foreign_enis, unreachable FROM mock_node WHERE id = 1").get(),
  );
  return { maxEnis: r.max_enis, foreignEnis: r.foreign_enis, unreachable: r.unreachable };
}

/**
 * Changes what the simulated cloud says of the node, as a cloud changes behind
 * the agent's back (tests, the demo): the fields given are set.
 */
export function setMockNode(db: DatabaseSync, patch: Partial<MockNode>): void {
  const now = { ...readMockNode(db), ...patch };
  prepared(
    db,
    "UPDATE mock_node SET max_enis = ?, foreign_enis = ?, unreachable = ? WHERE id = 1",
  ).run(now.maxEnis, now.foreignEnis, now.unreachable);
}

const Groups = z.pipe(z.string(), z.transform((s): string[] => JSON.parse(s)));

export const RowSchema = z.object({
  id: z.string(),
  idx: z.number(),
  mac: z.string(),
  ipv4: z.nullable(z.string()),
  ipv4_prefix: z.nullable(z.number()),
  ipv4_gw: z.nullable(z.string()),
  ipv6: z.nullable(z.string()),
  ipv6_prefix: z.nullable(z.number()),
  ipv6_gw: z.nullable(z.string()),
  subnet_id: z.nullable(z.string()),
  attach: z.enum(["detached", "attaching", "attached"]),
  owner_pod: z.nullable(z.string()),
  owner_container: z.nullable(z.string()),
  owner_if: z.nullable(z.string()),
  profile: z.string(),
  security_groups: Groups,
  enterprise_security_groups: Groups,
  description: z.nullable(z.string()),
});
export type Row = z.infer<typeof RowSchema>;

export function rowToEni(r: Row): Eni {
  return {
    id: r.id,
    mac: r.mac,
    ipv4: r.ipv4 ? { address: r.ipv4, prefixLength: r.ipv4_prefix!, gateway: r.ipv4_gw! } : null,
    ipv6: r.ipv6 ? { address: r.ipv6, prefixLength: r.ipv6_prefix!, gateway: r.ipv6_gw! } : null,
    subnetId: r.subnet_id,
    state: r.owner_container ? "owned" : "free",
    owner: r.owner_container
      ? { pod: r.owner_pod!, containerId: r.owner_container, ifName: r.owner_if! }
      : null,
    profile: r.profile,
    securityGroupIds: r.security_groups,
    enterpriseSecurityGroupIds: r.enterprise_security_groups,
    description: r.description,
    cloudState: "ok",
  };
}

export function sameOwner(r: Row, o: Owner): boolean {
  return r.owner_container === o.containerId && r.owner_if === o.ifName;
}

export const hex = (b: number) => (b & 0xff).toString(16).padStart(2, "0");

const DataVersionSchema = z.object({ data_version: z.number() });
const ChangesSchema = z.object({ t: z.number() });

/**
 * What changes whenever the table may have: SQLite's `data_version` (another connection
 * wrote: another node of the simulated VPC) and `total_changes()` (this one did).
 */
export function changeStamp(db: DatabaseSync): string {
  const v = DataVersionSchema.parse(prepared(db, "PRAGMA data_version").get()).data_version;
  const t = ChangesSchema.parse(prepared(db, "SELECT total_changes() AS t").get()).t;
  return `${v}/${t}`;
}
