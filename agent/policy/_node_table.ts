/**
 * The node's policy table: what this agent last loaded there, rendered whole (after what
 * it was last rendered as) or brought up to date by an update of what changed.
 *
 * @module
 */
import type { Logger } from "../../lib/log.ts";
import {
  type CompiledPolicy,
  type DropLog,
  type NodePod,
  nodeRuleset,
  nodeUpdate,
  type PeerSet,
  POLICY_TABLE,
  setDeltaCommands,
} from "../../policy/mod.ts";
import { type Att, isolates, light } from "./_attachment.ts";
import type { Changes } from "./_changes.ts";
import type { TableLoads } from "./_table_loads.ts";

const TABLE = `inet ${POLICY_TABLE}`;

/** What the node's table reads of the enforcer. */
export interface NodeTableDeps {
  loads: TableLoads;
  log: Logger;
  dropLog: DropLog | undefined;
  /** Every attachment under policy. */
  atts(): Iterable<Att>;
  /** The pod's policy compiled now (kept light as `att.compiled`); null: not compiled. */
  compile(att: Att, members: boolean): CompiledPolicy | null;
  /** A set in use, with its current members. */
  peerSet(key: string): PeerSet;
  /** The node's addresses as the enforcer knows them. */
  nodeAddresses(): string[];
}

/** The node's table (see the module doc). */
export class NodeTable {
  readonly #d: NodeTableDeps;
  /** What the table holds, as this agent last loaded it (null: unknown, render it whole). */
  loaded: NodePod[] | null = null;
  /** The node's table has not been rendered by this agent yet: its first load starts clean. */
  fresh = true;
  /** A load failed: what the table holds is unknown until a whole render loads. */
  stale = false;

  constructor(deps: NodeTableDeps) {
    this.#d = deps;
  }

  /** Whether the next change must render the table whole (not only update it). */
  get needsWhole(): boolean {
    return this.stale || this.fresh || this.loaded === null;
  }

  /**
   * The node's pods: each attachment's node end and its pod's policy, compiled now when
   * `fresh` says so (its sets' members left out when `members` is false), else as last
   * compiled (its rules current; enough for `nodeUpdate`,
   * which fills only new sets, and new sets come from the pods whose rules just changed).
   */
  #pods(fresh: (att: Att) => boolean, members = true): NodePod[] {
    const out: NodePod[] = [];
    for (const att of [...this.#d.atts()].sort((a, b) => a.seq - b.seq)) {
      const policy = att.registered && fresh(att)
        ? this.#d.compile(att, members)
        : att.registered
        ? att.compiled
        : att.loaded;
      if (policy && isolates(policy)) out.push({ nodeEnd: att.nodeEnd, policy });
    }
    return out;
  }

  /**
   * The node's table brought up to date without rendering it whole: the deltas of the sets
   * it keeps (unless `deltas` is false: an ADD's, applied after it answers), then the pods
   * that came, went or whose rules changed (`nodeUpdate`); a failure renders it whole.
   */
  update(ch: Changes, deltas = true): Promise<boolean> {
    const previous = this.loaded!;
    const had = new Set(previous.map((p) => p.nodeEnd));
    // Compiled again for the pods whose chains are made (only they bring new sets), their
    // rules alone; members only for the sets the node does not hold yet.
    const pods = this.#pods((a) => ch.changed.has(a.pod) || !had.has(a.nodeEnd), false);
    const keys = (list: NodePod[]) => new Set(list.flatMap((p) => p.policy.sets.map((s) => s.key)));
    const before = keys(previous), now = keys(pods);
    const filled = new Map<string, PeerSet>();
    try {
      for (const p of pods) {
        if (p.policy.sets.every((s) => before.has(s.key))) continue;
        const full = (key: string) => {
          let f = filled.get(key);
          if (!f) filled.set(key, f = this.#d.peerSet(key));
          return f;
        };
        p.policy = {
          ...p.policy,
          sets: p.policy.sets.map((s) => (before.has(s.key) ? s : full(s.key))),
        };
      }
    } catch {
      // A set no longer in use (the engine moved on): render the node whole.
      this.loaded = null;
      return this.render();
    }
    const changed = [...this.#d.atts()]
      .filter((a) => ch.changed.has(a.pod))
      .map((a) => a.nodeEnd);
    const text = (deltas ? ch.deltas : []).filter((d) => before.has(d.key) && now.has(d.key))
      .map(setDeltaCommands).join("") +
      nodeUpdate(pods, { previous, changed, log: this.#d.dropLog });
    if (text === "") return Promise.resolve(true);
    this.loaded = pods.map((p) => ({ nodeEnd: p.nodeEnd, policy: light(p.policy) }));
    return this.#d.loads.load(null, text).then((ok) => {
      if (ok) return true;
      this.#d.log.debug("NetworkPolicy: the node's update failed; rendering it whole");
      this.loaded = null;
      return this.render();
    });
  }

  /** The node's whole table, rendered now (after what it was last rendered as), queued. */
  render(): Promise<boolean> {
    const pods = this.#pods(() => true);
    const split = { ipv4: [] as string[], ipv6: [] as string[] };
    for (const a of this.#d.nodeAddresses()) (a.includes(":") ? split.ipv6 : split.ipv4).push(a);
    const node = pods[0]?.policy.node ?? split;
    let text = nodeRuleset(pods, {
      node,
      previous: this.loaded ?? undefined,
      log: this.#d.dropLog,
    });
    // This agent's first load replaces what an earlier one left (one transaction).
    if (this.fresh) text = `table ${TABLE} {}\ndelete table ${TABLE}\n${text}`;
    const fresh = this.fresh;
    this.loaded = pods.map((p) => ({ nodeEnd: p.nodeEnd, policy: light(p.policy) }));
    this.fresh = false;
    this.stale = false;
    return this.#d.loads.load(null, text).then((ok) => {
      if (!ok) {
        // What the table holds now is unknown: the next flush renders it whole again.
        this.stale = true;
        this.loaded = null;
        this.fresh ||= fresh;
      }
      return ok;
    });
  }
}
