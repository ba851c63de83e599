/**
 * The BCE provider's tables: their DDL, the migrations that bring a database to
 * the newest schema, and the zod schema of each row (`_store.ts` queries them).
 *
 * The schema is versioned per component (`migrateComponent`, component `bce`):
 * version 1 is the tables as the first releases made them (a database of
 * theirs, which has no version yet, is brought to it in place), version 2 adds
 * the profile columns: each ENI and intent belongs to a profile (`default` for
 * the rows of an older database), an ENI row records its name, its description
 * and the groups BCE has on it when they are not its profile's. Version 3 adds
 * zone-wide sticky pods: an ENI row says whether a zone-sticky pod owns it
 * (`sticky`) and the name the cloud shows (`cloud_name`, its sticky name while
 * such a pod owns it); `park` and `claim` intents carry the pod, the interface,
 * the container (a claim) and the hold's expiry; `bce_parked` lists the ENIs
 * this node parked in the VPC while they are there, `bce_claims` the claims it
 * made (the last 100).
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import { hasColumn, type Migration } from "../../lib/sqlite.ts";

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
  // 3: zone-wide sticky pods.
  (db) => {
    addColumn(db, "bce_enis", "sticky", "INTEGER NOT NULL DEFAULT 0");
    addColumn(db, "bce_enis", "cloud_name", "TEXT");
    addColumn(db, "bce_intents", "owner_pod", "TEXT");
    addColumn(db, "bce_intents", "owner_container", "TEXT");
    addColumn(db, "bce_intents", "owner_if", "TEXT");
    addColumn(db, "bce_intents", "until_ms", "INTEGER");
    db.exec(`
      CREATE TABLE IF NOT EXISTS bce_parked (
        eni_id TEXT PRIMARY KEY,
        pod TEXT NOT NULL,
        if_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('parking', 'parked')),
        parked_ms INTEGER NOT NULL,
        until_ms INTEGER NOT NULL
      );
      CREATE TABLE IF NOT EXISTS bce_claims (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        eni_id TEXT NOT NULL,
        pod TEXT NOT NULL,
        if_name TEXT NOT NULL,
        from_instance TEXT,
        at_ms INTEGER NOT NULL
      );`);
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
  /** Whether a zone-sticky pod owns it (its record is kept in the cloud). */
  sticky: z._default(z.pipe(z.number(), z.transform((n) => n === 1)), false),
  /** The name BCE shows when it is not `name` (the pod's sticky name); null: `name`. */
  cloud_name: z._default(nullableString, null),
});
/** One row of `bce_enis`. */
export type EniRow = z.infer<typeof EniRowSchema>;

/** One row of `bce_intents`. */
export const IntentRowSchema = z.object({
  id: z.string(),
  /**
   * `create`, `release`; `park`: a zone-sticky pod's ENI on its way into the VPC;
   * `claim`: a parked ENI being attached here for its pod.
   */
  kind: z.enum(["create", "release", "park", "claim"]),
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
  /** A park's or claim's pod, container (a claim) and interface. */
  owner_pod: z._default(nullableString, null),
  owner_container: z._default(nullableString, null),
  owner_if: z._default(nullableString, null),
  /** A park's expiry: until when the ENI is kept for its pod (epoch ms). */
  until_ms: z._default(z.nullable(z.number()), null),
});
/** One row of `bce_intents`. */
export type IntentRow = z.infer<typeof IntentRowSchema>;
/** The columns of an intent that have defaults. */
type IntentDefaulted =
  | "profile"
  | "requested_ip6"
  | "security_groups"
  | "enterprise_security_groups"
  | "after_release"
  | "owner_pod"
  | "owner_container"
  | "owner_if"
  | "until_ms";
/** An intent as written (the profile columns optional). */
export type IntentInput =
  & Omit<IntentRow, IntentDefaulted>
  & Partial<Pick<IntentRow, IntentDefaulted>>;

/**
 * The columns every new intent starts with: a fresh id, which is also its client token
 * (the cloud's idempotency key for the call it records), active, created now.
 */
export function newIntent<K extends IntentRow["kind"]>(
  kind: K,
): Pick<IntentRow, "id" | "client_token" | "phase" | "created_ms"> & { kind: K } {
  const token = crypto.randomUUID();
  return { id: token, kind, client_token: token, phase: "active", created_ms: Date.now() };
}

/** An intent with the defaults of its profile columns filled in. */
export function fillIntent(i: IntentInput): IntentRow {
  return {
    profile: "default",
    requested_ip6: null,
    security_groups: null,
    enterprise_security_groups: null,
    after_release: null,
    owner_pod: null,
    owner_container: null,
    owner_if: null,
    until_ms: null,
    ...i,
  };
}

/** One row of `bce_parked`: an ENI this node parked in the VPC. */
export const ParkedRowSchema = z.object({
  eni_id: z.string(),
  pod: z.string(),
  if_name: z.string(),
  profile: z.string(),
  state: z.enum(["parking", "parked"]),
  parked_ms: z.number(),
  until_ms: z.number(),
});
/** One row of `bce_parked`. */
export type ParkedRow = z.infer<typeof ParkedRowSchema>;

/** One row of `bce_claims`: a claim this node made. */
export const ClaimRowSchema = z.object({
  eni_id: z.string(),
  pod: z.string(),
  if_name: z.string(),
  from_instance: nullableString,
  at_ms: z.number(),
});
/** One row of `bce_claims`. */
export type ClaimRow = z.infer<typeof ClaimRowSchema>;

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
