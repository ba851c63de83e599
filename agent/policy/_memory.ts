/**
 * What the enforcer keeps across a restart, in the agent's state database (its own
 * component, `policy`, in `enim_migrations`; an older agent that knows no such component
 * leaves its tables alone):
 *
 * - `policy_address_owners`: each address the loaded rules knew, and the pod they knew it
 *   as (`namespace/name uid`), written only once those rules were loaded and the tracked
 *   connections of every address whose pod changed were deleted. A take-over (or an agent
 *   whose load failed or was interrupted) compares it with what its rules say now: an
 *   address whose pod changed meanwhile (deleted, its address given to another pod) has
 *   its tracked connections deleted before it is written again (issue 48, point 3).
 * - `policy_resource_versions`: per kind, the newest resourceVersion whose state was put
 *   in place; a take-over whose first list answers an older one lists again (point 5).
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { migrateComponent, prepared, transaction } from "../../lib/sqlite.ts";

const MIGRATIONS = [
  `CREATE TABLE IF NOT EXISTS policy_address_owners (
     address TEXT PRIMARY KEY NOT NULL,
     owner TEXT NOT NULL
   );
   CREATE TABLE IF NOT EXISTS policy_resource_versions (
     resource TEXT PRIMARY KEY NOT NULL,
     resource_version TEXT NOT NULL
   );`,
];

/** What the enforcer keeps across a restart (see the module doc). */
export interface PolicyMemory {
  /** The addresses the last confirmed rules knew, with their pods. */
  owners(): Map<string, string>;
  /** Writes what changed: addresses and their pods now (`set`), addresses gone (`del`). */
  saveOwners(set: [string, string][], del: string[]): void;
  /** Per kind (`pods`, `namespaces`, `networkpolicies`), the resourceVersion last put in place. */
  resourceVersions(): Map<string, string>;
  saveResourceVersion(resource: string, rv: string): void;
}

/** {@linkcode PolicyMemory} in the agent's SQLite database. */
export class SqlitePolicyMemory implements PolicyMemory {
  readonly #db: DatabaseSync;

  constructor(db: DatabaseSync) {
    this.#db = db;
    migrateComponent(db, "policy", MIGRATIONS);
  }

  owners(): Map<string, string> {
    const rows = prepared(this.#db, "SELECT address, owner FROM policy_address_owners").all();
    const out = new Map<string, string>();
    for (const r of rows) {
      if (typeof r.address === "string" && typeof r.owner === "string") out.set(r.address, r.owner);
    }
    return out;
  }

  saveOwners(set: [string, string][], del: string[]): void {
    if (set.length === 0 && del.length === 0) return;
    transaction(this.#db, () => {
      const put = prepared(
        this.#db,
        "INSERT INTO policy_address_owners (address, owner) VALUES (?, ?) ON CONFLICT (address) DO UPDATE SET owner = excluded.owner",
      );
      for (const [a, o] of set) put.run(a, o);
      const rm = prepared(this.#db, "DELETE FROM policy_address_owners WHERE address = ?");
      for (const a of del) rm.run(a);
    });
  }

  resourceVersions(): Map<string, string> {
    const rows = prepared(
      this.#db,
      "SELECT resource, resource_version FROM policy_resource_versions",
    ).all();
    const out = new Map<string, string>();
    for (const r of rows) {
      if (typeof r.resource === "string" && typeof r.resource_version === "string") {
        out.set(r.resource, r.resource_version);
      }
    }
    return out;
  }

  saveResourceVersion(resource: string, rv: string): void {
    prepared(
      this.#db,
      "INSERT INTO policy_resource_versions (resource, resource_version) VALUES (?, ?) ON CONFLICT (resource) DO UPDATE SET resource_version = excluded.resource_version",
    ).run(resource, rv);
  }
}

/** {@linkcode PolicyMemory} in memory (tests; an agent without a state database). */
export class InMemoryPolicyMemory implements PolicyMemory {
  readonly #owners = new Map<string, string>();
  readonly #rvs = new Map<string, string>();

  owners(): Map<string, string> {
    return new Map(this.#owners);
  }
  saveOwners(set: [string, string][], del: string[]): void {
    for (const [a, o] of set) this.#owners.set(a, o);
    for (const a of del) this.#owners.delete(a);
  }
  resourceVersions(): Map<string, string> {
    return new Map(this.#rvs);
  }
  saveResourceVersion(resource: string, rv: string): void {
    this.#rvs.set(resource, rv);
  }
}
