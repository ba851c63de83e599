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

  /** Adds an engine update's deltas and changed pods. */
  add(u: PolicyUpdate): void {
    this.deltas.push(...u.deltas);
    for (const c of u.changed) this.changed.add(c);
  }

  /** Whether the batch holds anything at all. */
  get empty(): boolean {
    return this.arrived.length === 0 && this.deltas.length === 0 && this.changed.size === 0 &&
      !this.node && this.rvs.size === 0;
  }
}
