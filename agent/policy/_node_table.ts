/**
 * The node's policy table: what this agent last loaded there, rendered whole (after what
 * it was last rendered as) or brought up to date by an update of what changed.
 *
 * Every local pod's chains are in each load: the new ones, or those already there. A pod
 * the compiler does not know (a restored pod the cluster does not have) keeps its chains
 * as they are, whoever loaded them: its verdict-map elements are added back after the
 * whole render's flush of the maps, its chains are declared (a no-op when they exist)
 * and never flushed, and no set is deleted while such a pod is there (its chains may use
 * any). What an earlier agent left is dropped by the first whole render made while no
 * such pod is there (the table deleted and made again, in one transaction).
 *
 * @module
 */
import type { Logger } from "../../lib/log.ts";
import {
  type CompiledPolicy,
  type DropLog,
  nodeNames,
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

/**
 * An empty set every whole render declares and every update flushes first: an update of a
 * table that is gone (`nft flush ruleset`, an operator's `nft delete table`) fails as a
 * whole (the set is missing) and the table is rendered whole again, instead of the update
 * making a table of its own few declarations, which a check would take for the loaded one.
 */
const GUARD = `table ${TABLE} {\n\tset enim_guard { type inet_service; }\n}\n`;
const GUARDED = `flush set ${TABLE} enim_guard\n`;

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
  /** The judged bit the table stamps (`policy/fence.ts`); unset: none. */
  judgedMark?: number;
  /**
   * An update failed: whether the table is gone (counted and logged as a repair: the
   * whole render that follows loads it again). Never rejects.
   */
  updateFailed?(): Promise<void>;
}

/** The node's table (see the module doc). */
export class NodeTable {
  readonly #d: NodeTableDeps;
  /** What the table holds, as this agent last loaded it (null: unknown, render it whole). */
  loaded: NodePod[] | null = null;
  /**
   * The table may hold what this agent does not know of (an earlier agent's, chains kept
   * for a pod the compiler forgot, a load that failed): the next whole render made while
   * no chains are kept starts clean.
   */
  unclean = true;
  /** A load failed: what the table holds is unknown until a whole render loads. */
  stale = false;
  /**
   * A check found the table missing or changed (`netns/table_check.ts`): what it holds
   * is not enforced until a whole render has loaded.
   */
  broken = false;
  /** Whole renders made (each from the compiler's state then, every set's members in). */
  renders = 0;

  constructor(deps: NodeTableDeps) {
    this.#d = deps;
  }

  /** Whether the next change must render the table whole (not only update it). */
  get needsWhole(): boolean {
    return this.stale || this.loaded === null || (this.unclean && this.#kept().length === 0);
  }

  /** The node ends whose chains are kept as they are: attachments the compiler does not know. */
  #kept(): string[] {
    return [...this.#d.atts()].filter((a) => !a.registered).sort((a, b) => a.seq - b.seq)
      .map((a) => a.nodeEnd);
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
      if (!att.registered) continue;
      const policy = fresh(att) ? this.#d.compile(att, members) : att.compiled;
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
    const kept = this.#kept();
    const keep = new Set(kept);
    const previous = this.loaded!.filter((p) => !keep.has(p.nodeEnd));
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
      return this.render();
    }
    const changed = [...this.#d.atts()]
      .filter((a) => ch.changed.has(a.pod))
      .map((a) => a.nodeEnd);
    let text = (deltas ? ch.deltas.slice(ch.nodeDeltasFrom) : [])
      .filter((d) => before.has(d.key) && now.has(d.key))
      .map(setDeltaCommands).join("") +
      nodeUpdate(pods, { previous, changed, log: this.#d.dropLog });
    if (kept.length > 0) text = withoutSetDeletes(text);
    if (text === "") return Promise.resolve(true);
    text = GUARDED + text;
    const was = this.loaded!;
    this.loaded = pods.map((p) => ({ nodeEnd: p.nodeEnd, policy: light(p.policy) }));
    const ends = new Set(pods.map((p) => p.nodeEnd));
    this.#chainsMaybe(ends);
    return this.#d.loads.load(null, text, { quiet: true }).then((ok) => {
      if (ok) {
        this.#chainsGone((a) => had.has(a.nodeEnd) && !ends.has(a.nodeEnd));
        return true;
      }
      this.#d.log.debug("NetworkPolicy: the node's update failed; rendering it whole");
      this.loaded = mayHold(was, this.loaded!);
      return (this.#d.updateFailed?.() ?? Promise.resolve()).then(() => this.render());
    });
  }

  /** The node's whole table, rendered now (after what it was last rendered as), queued. */
  render(): Promise<boolean> {
    const kept = this.#kept();
    const keep = new Set(kept);
    const pods = this.#pods(() => true);
    const split = { ipv4: [] as string[], ipv6: [] as string[] };
    for (const a of this.#d.nodeAddresses()) (a.includes(":") ? split.ipv6 : split.ipv4).push(a);
    const node = pods[0]?.policy.node ?? split;
    const clean = this.unclean && kept.length === 0;
    const previous = (this.loaded ?? []).filter((p) => !keep.has(p.nodeEnd));
    if (!clean) {
      // A local pod no policy isolates may still have chains this agent does not know of
      // (a load that failed, an earlier agent's): they go too (declared first, so this
      // holds whether they are there or not). Left, they would come back with their old
      // rules were the pod's chains ever kept.
      const listed = new Set([...pods, ...previous].map((p) => p.nodeEnd));
      for (const a of this.#d.atts()) {
        if (!a.registered || !a.nodeChains || listed.has(a.nodeEnd) || !a.compiled) continue;
        previous.push({ nodeEnd: a.nodeEnd, policy: { ...a.compiled, sets: [] } });
      }
    }
    const ends = new Set(pods.map((p) => p.nodeEnd));
    this.#chainsMaybe(ends);
    this.renders++;
    let text = nodeRuleset(pods, {
      node,
      previous,
      log: this.#d.dropLog,
      judgedMark: this.#d.judgedMark,
    });
    // What an earlier agent left goes, in the same transaction as the new table.
    if (clean) text = `table ${TABLE} {}\ndelete table ${TABLE}\n${text}`;
    if (kept.length > 0) text = withoutSetDeletes(text) + keptChains(kept);
    text += GUARD;
    this.loaded = pods.map((p) => ({ nodeEnd: p.nodeEnd, policy: light(p.policy) }));
    if (clean) this.unclean = false;
    this.stale = false;
    return this.#d.loads.load(null, text).then((ok) => {
      if (!ok) {
        // The table holds what it held (the transaction failed): the next flush renders it
        // whole again, after all that it may hold, and made again clean when it can (what
        // failed may be something this agent does not know of).
        this.stale = true;
        this.loaded = mayHold(previous, this.loaded!);
        this.unclean = true;
      } else {
        this.broken = false;
        this.#chainsGone((a) => a.registered && !ends.has(a.nodeEnd));
      }
      return ok;
    });
  }

  /** The pods of `ends` have chains on the node now, or will once the load in flight is in. */
  #chainsMaybe(ends: Set<string>): void {
    for (const a of this.#d.atts()) if (ends.has(a.nodeEnd)) a.nodeChains = true;
  }

  /** A load that succeeded deleted the chains of the attachments `gone` says. */
  #chainsGone(gone: (a: Att) => boolean): void {
    for (const a of this.#d.atts()) if (gone(a)) a.nodeChains = false;
  }
}

/**
 * The chains of pods kept as they are (see the module doc): declared (made empty when
 * missing: an empty chain returns, as no chain does) and jumped to again.
 */
function keptChains(ends: string[]): string {
  const names = ends.map((end) => ({ end, ...nodeNames(end) }));
  return [
    `table ${TABLE} {`,
    ...names.flatMap((n) => [`\tchain ${n.ingress} { }`, `\tchain ${n.egress} { }`]),
    "}",
    ...names.flatMap((n) => [
      `add element ${TABLE} ingress_links { "${n.end}" : jump ${n.ingress} }`,
      `add element ${TABLE} egress_links { "${n.end}" : jump ${n.egress} }`,
    ]),
  ].join("\n") + "\n";
}

/**
 * What the node's table may hold after a load of `tried` failed over `held`: every pod and
 * set of either (a later whole render declares what it deletes, so each may be missing).
 */
function mayHold(held: NodePod[], tried: NodePod[]): NodePod[] {
  const out = new Map<string, NodePod>();
  for (const p of [...held, ...tried]) {
    const had = out.get(p.nodeEnd);
    if (!had) {
      out.set(p.nodeEnd, p);
      continue;
    }
    const keys = new Set(had.policy.sets.map((x) => x.key));
    const sets = [...had.policy.sets, ...p.policy.sets.filter((x) => !keys.has(x.key))];
    out.set(p.nodeEnd, { nodeEnd: p.nodeEnd, policy: { ...p.policy, sets } });
  }
  return [...out.values()];
}

/** `text` without its set deletions: a kept chain may use any set. */
function withoutSetDeletes(text: string): string {
  return text.split("\n").filter((l) => !l.startsWith(`delete set ${TABLE} `)).join("\n");
}
