/**
 * A test's copy of what a node's peer sets hold, kept by replaying the compiler's updates
 * (the enforcer's `add element`/`delete element`) on it, for the policy property tests
 * (policy/compile_test.ts, policy/identity_test.ts) to compare with compiling afresh.
 *
 * @module
 */
import { assert } from "../../lib/assert.ts";
import type { PolicyEngine, PolicyUpdate } from "../../policy/compile.ts";
import type { CompiledPolicy } from "../../policy/types.ts";

/** Per local pod (`namespace/name`), each set's elements as text, by set key. */
export type Tables = Map<string, Map<string, Set<string>>>;

/** A set element as text: an address, or `address . port` for a named port's element. */
export const elText = (e: string | { addr: string; port: number }): string =>
  typeof e === "string" ? e : `${e.addr} . ${e.port}`;

/** The sets of one compiled policy, as {@linkcode Tables} holds them. */
export function tableOf(p: CompiledPolicy): Map<string, Set<string>> {
  return new Map(p.sets.map((s) => [s.key, new Set([...s.ipv4, ...s.ipv6].map(elText))]));
}

/**
 * Applies update `u` to `tables` as the enforcer would: each delta to every set of its
 * users (asserting a delete removes a present element and an add a new one), and each
 * changed pod's sets taken whole from `engine`'s compiled policy.
 */
export function applyUpdate(engine: PolicyEngine, tables: Tables, u: PolicyUpdate): void {
  for (const d of u.deltas) {
    for (const user of d.users) {
      const set = tables.get(user)?.get(d.key);
      assert(set, `${user} has no set ${d.key}`);
      for (const e of [...d.ipv4.delete, ...d.ipv6.delete].map(elText)) {
        assert(set.delete(e), `delete of absent ${e} from ${d.key} in ${user}`);
      }
      for (const e of [...d.ipv4.add, ...d.ipv6.add].map(elText)) {
        assert(!set.has(e), `add of present ${e} to ${d.key} in ${user}`);
        set.add(e);
      }
    }
  }
  for (const key of u.changed) {
    const [ns, name] = key.split("/");
    const c = engine.compiled(ns, name);
    if (c) tables.set(key, tableOf(c));
  }
}
