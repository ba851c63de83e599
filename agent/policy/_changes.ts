/**
 * The cache events waiting for the enforcer's queue, and what a batch of them changed.
 *
 * @module
 */
import type { Namespace, NetworkPolicy, Pod } from "../../kube/mod.ts";
import type { PolicyUpdate, SetDelta } from "../../policy/mod.ts";

/** A cache event waiting for the queue. */
export interface PolicyEvent {
  resource: "pods" | "namespaces" | "networkpolicies";
  old: Pod | Namespace | NetworkPolicy | undefined;
  cur: Pod | Namespace | NetworkPolicy | undefined;
  /** When it arrived (`performance.now()`). */
  at: number;
}

/**
 * What a batch changed: set deltas, pods to render again, and whether the node's whole
 * table must be rendered again (else it gets an update: `nodeUpdate`).
 */
export class Changes {
  readonly deltas: SetDelta[] = [];
  readonly changed = new Set<string>();
  node = false;
  /** When each event of the batch arrived (`performance.now()`). */
  readonly arrived: number[] = [];
  /** The resourceVersion of the batch's last event of each kind (enforced once flushed). */
  readonly rvs = new Map<string, string>();
  /**
   * The node's table applies `deltas` from this index on: those before it were made before
   * its last whole render, which put their members in already (applied again, a delete
   * would find its element gone, and the load fail).
   */
  nodeDeltasFrom = 0;
  /** Deferred: the node's whole renders made when these deltas were (`NodeTable.renders`). */
  nodeRenders = -1;
  /** Addresses no longer their pod's: their tracked connections go (`PolicyUpdate.retired`). */
  readonly retired = new Set<string>();

  /** Adds an engine update's deltas, changed pods and retired addresses. */
  add(u: PolicyUpdate): void {
    this.deltas.push(...u.deltas);
    for (const c of u.changed) this.changed.add(c);
    for (const a of u.retired ?? []) this.retired.add(a);
  }

  /** Whether the batch holds anything at all. */
  get empty(): boolean {
    return this.arrived.length === 0 && this.deltas.length === 0 && this.changed.size === 0 &&
      !this.node && this.rvs.size === 0 && this.retired.size === 0;
  }
}

/**
 * The retired addresses of `ch` that a pod's table held: those `mine` (its sets' deltas)
 * deletes, or all of them (null: the table is rendered whole).
 */
export function retiredIn(ch: Changes, mine: SetDelta[] | null): string[] {
  if (ch.retired.size === 0) return [];
  if (mine === null) return [...ch.retired];
  const out = new Set<string>();
  for (const d of mine) {
    for (const e of [...d.ipv4.delete, ...d.ipv6.delete]) {
      const a = typeof e === "string" ? e : e.addr;
      if (ch.retired.has(a)) out.add(a);
    }
  }
  return [...out];
}
