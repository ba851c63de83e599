/**
 * The NetworkPolicy compiler: from the cluster cache (pods, namespaces, policies) and
 * the node's local enim pods, each local pod's effective policy (see `types.ts`), with
 * the full `networking.k8s.io/v1` semantics. Pure: it spawns nothing and does no I/O.
 *
 * Why one file: every change moves, in one step, a pod's record, its set contributions
 * and those of the pods that share one of its addresses (whose that address is:
 * `_pod_index.ts`), and the rules of the local pods it concerns; split, each part would
 * reach into the others' state.
 *
 * {@linkcode PolicyEngine} keeps its own index (pods by namespace and label, see
 * `_pod_index.ts`), each local pod's rules (`_rules.ts`) and the peer sets they use,
 * with their members counted by element (`_sets.ts`). The cache feeds it every change
 * (`upsertPod`, `deletePod`, …); each change answers a {@linkcode PolicyUpdate}:
 *
 * - a pod's labels or addresses change: only the members of the sets that select it
 *   change (`deltas`: elements to add and delete), unless the pod is itself a local pod
 *   whose selecting policies changed;
 * - a namespace's labels change: the members of the namespace-selector sets it enters
 *   or leaves;
 * - a policy changes: the local pods of its namespace are compiled again, and those
 *   whose rules differ are `changed` (render them again).
 *
 * Readings of the API (besides those of `_prepare.ts` and `_pod_index.ts`):
 *
 * - A pod is isolated for a direction when a policy of its namespace selects it and
 *   applies to that direction; then it admits what the union of those policies' rules
 *   of that direction admit, plus replies (connection tracking), its own node's
 *   addresses and itself. Not isolated: everything.
 * - A named port of an ingress rule is looked up in the target pod's own container
 *   ports (name and protocol); of an egress rule, in each destination pod's ports — a
 *   named-port set of (address, port) — and matches nothing for an ipBlock peer (the API
 *   calls it "a named port on a pod"; an ipBlock names cluster-external addresses). An
 *   egress rule with a named port and no `to` admits that port of every pod.
 * - `endPort` makes a range (`port`..`endPort`); `protocol` defaults to TCP; a port
 *   item without `port` admits every port of its protocol.
 *
 * @module
 */
import type { Namespace, NetworkPolicy, Pod } from "../kube/objects.ts";
import { type PreparedPolicy, preparePolicy } from "./_prepare.ts";
import { listedOf, PodIndex, podKey, type PodRec, splitFamilies } from "./_pod_index.ts";
import { sameUid } from "./_local_addrs.ts";
import { podRules, type Rules } from "./_rules.ts";
import { DeltaLog, SetStore } from "./_sets.ts";
import type { CompiledPolicy, PeerSet, SetDelta } from "./types.ts";

export { podKey } from "./_pod_index.ts";

/** What the compiler reads from the cluster cache: every object of each kind. */
export interface PolicyView {
  /** Every pod of every namespace. */
  pods(): Iterable<Pod>;
  /** Every namespace. */
  namespaces(): Iterable<Namespace>;
  /** Every NetworkPolicy of every namespace. */
  networkPolicies(): Iterable<NetworkPolicy>;
}

/** A local enim pod: who it is and the addresses enim assigned it. */
export interface LocalPod {
  /** The pod's namespace. */
  namespace: string;
  /** The pod's name. */
  name: string;
  /**
   * The pod's uid (CNI_ARGS `K8S_POD_UID`): its API object must be this pod's, not an
   * earlier or later pod's of the same name. Absent: any pod of that name.
   */
  uid?: string;
  /** The addresses enim gave the pod (its ENI's), before kubelet writes them to its status. */
  ips: string[];
}

/** Options of {@linkcode PolicyEngine}. */
export interface EngineOptions {
  /** The node's own addresses: always allowed to and from its pods. */
  nodeAddresses: string[];
}

/**
 * What a change means for the rulesets: `deltas` to apply to sets that existed before
 * the change and still do (to the table of each of their `users`, and to the node's
 * table), then `changed`, the local pods to render again (their
 * {@linkcode PolicyEngine.compiled} is current; a delta's `users` never lists them).
 */
export interface PolicyUpdate {
  /** Membership edits of sets (`add element`/`delete element`). */
  deltas: SetDelta[];
  /** The local pods (`namespace/name`) whose rules changed: render them again. */
  changed: string[];
  /**
   * Addresses that stopped being a pod's, which some set had admitted as that pod's (its
   * DEL here, its final status or deletion, another pod claiming them): the connections
   * tracked for them were that pod's, and go with it (present only when there are any).
   */
  retired?: string[];
}

/**
 * Thrown when a local pod is not in the cache yet (its labels are unknown), or the cache
 * holds another pod of its name (another uid: an earlier one not gone from the cache
 * yet, or a later one).
 */
export class PodNotFoundError extends Error {
  /** `key`: the pod, `namespace/name`; `uids`: its own and the one the cache holds. */
  constructor(key: string, uids?: { want: string; cached: string }) {
    super(
      uids
        ? `Cannot compile the policy of pod "${key}" (uid "${uids.want}"): the cache holds another pod of that name (uid "${uids.cached}")`
        : `Cannot compile the policy of pod "${key}": the pod is not in the cache`,
    );
    this.name = "PodNotFoundError";
  }
}

interface LocalState {
  key: string;
  namespace: string;
  name: string;
  /** Its uid (null: unknown, any pod of its name). */
  uid: string | null;
  self: { v4: string[]; v6: string[] };
  rules: Rules;
  /** The rules' signature (all but the sets' members): equal signatures, same ruleset. */
  sig: string;
}

const noRules = (): Rules => ({
  ingress: { isolated: false, entries: [] },
  egress: { isolated: false, entries: [] },
  policies: [],
  warnings: [],
  specs: new Map(),
});

/**
 * The compiler, kept in step with the cluster cache by its handlers.
 *
 * @example
 * ```ts ignore
 * const engine = new PolicyEngine(cache, { nodeAddresses: ["10.0.0.2"] });
 * const { compiled } = engine.addLocal({ namespace: "web", name: "a", ips: ["10.0.1.7"] });
 * // later, from the cache's pod handler:
 * const update = engine.upsertPod(pod); // update.deltas → `add element`/`delete element`
 * ```
 */
export class PolicyEngine {
  readonly #index = new PodIndex();
  readonly #sets = new SetStore(this.#index);
  /**
   * NetworkPolicies by namespace and name: as the cache holds them until a local pod of
   * their namespace needs them, then prepared (most namespaces have no local pod: at
   * 3,000 policies, preparing them all cost 5 MB of heap for nothing).
   */
  readonly #policies = new Map<string, Map<string, NetworkPolicy | PreparedPolicy>>();
  readonly #locals = new Map<string, LocalState>();
  #node: { v4: string[]; v6: string[] };

  /** Indexes `view` (see {@linkcode resync}); no local pod yet. */
  constructor(view: PolicyView, opts: EngineOptions) {
    this.#node = splitFamilies(opts.nodeAddresses);
    this.resync(view);
  }

  /**
   * Rebuilds everything from `view` (after the cache listed again) and compiles every
   * local pod again: render every table again (no delta is given).
   */
  resync(view: PolicyView): PolicyUpdate {
    this.#index.clear();
    for (const ns of view.namespaces()) {
      this.#index.setNamespaceLabels(ns.metadata.name, ns.metadata.labels);
    }
    for (const pod of view.pods()) this.#index.put(this.#index.record(pod));
    // What depends on other pods (an address two list, one the last pass had not met
    // yet) and on local truth (its releases the cache no longer backs): recorded again.
    const again = new Set<string>();
    for (const key of this.#index.local.releasers()) {
      for (const a of this.#index.local.prune(key, this.#index.pods.get(key)?.pod)) again.add(a);
    }
    for (const a of this.#index.contested()) again.add(a);
    for (const a of this.#index.local.addresses()) again.add(a);
    for (const a of again) {
      for (const rec of this.#index.listers(a)) this.#index.put(this.#index.record(rec.pod));
    }
    this.#policies.clear();
    for (const p of view.networkPolicies()) this.#putPolicy(p);
    this.#sets.clear();
    for (const st of this.#locals.values()) {
      const specs = st.rules.specs;
      st.rules = { ...st.rules, specs: new Map() };
      st.sig = "";
      if (this.#localRec(st)) this.#recompile(st);
      else {
        // Not in the cache any more: its last rules stay, with their sets.
        for (const spec of specs.values()) this.#sets.acquire(spec, st.key);
        st.rules.specs = specs;
      }
    }
    return { deltas: [], changed: this.locals() };
  }

  /**
   * Registers a local pod with the addresses enim assigned it and compiles its policy
   * (again, when it is registered already). Its addresses join the sets that select it
   * at once: `deltas` carries them to the other local pods' tables.
   *
   * @throws {PodNotFoundError} when the pod is not in the cache (retry once it is)
   */
  addLocal(local: LocalPod): PolicyUpdate & { compiled: CompiledPolicy } {
    const key = podKey(local.namespace, local.name);
    const known = this.#index.pods.get(key);
    if (!known) throw new PodNotFoundError(key);
    const uid = local.uid ?? null;
    const cached = known.pod.metadata.uid;
    if (!sameUid(uid, cached)) throw new PodNotFoundError(key, { want: uid!, cached: cached! });
    const log = new DeltaLog();
    // Its addresses are its alone on this node from now on; those it held before and
    // holds no longer (an older attachment's) are no longer its.
    const moved = this.#index.local.set(key, uid, local.ips);
    this.#replacePod(key, known.pod, log);
    this.#refresh(moved, key, log);
    const st: LocalState = this.#locals.get(key) ?? {
      key,
      namespace: local.namespace,
      name: local.name,
      uid,
      self: { v4: [], v6: [] },
      rules: noRules(),
      sig: "",
    };
    st.uid = uid;
    st.self = splitFamilies(local.ips);
    this.#locals.set(key, st);
    this.#recompile(st, true);
    return { ...this.#finish(log, [key]), compiled: this.#materialize(st) };
  }

  /**
   * Forgets a local pod (its DEL): its sets lose a user, and its addresses are no longer
   * its on this node, whatever its API object still lists (`status.podIPs` stays until
   * kubelet's final status): they leave every set they were in as its, here, at once.
   */
  removeLocal(namespace: string, name: string): PolicyUpdate {
    const key = podKey(namespace, name);
    const st = this.#locals.get(key);
    if (!st) return { deltas: [], changed: [] };
    const log = new DeltaLog();
    this.#locals.delete(key);
    for (const k of st.rules.specs.keys()) this.#sets.release(k, key);
    const freed = this.#index.local.set(key, st.uid, null);
    const rec = this.#index.pods.get(key);
    if (rec) this.#replacePod(key, rec.pod, log);
    this.#refresh(freed, key, log);
    return this.#finish(log, []);
  }

  /**
   * The current compiled policy of a local pod: its sets with their current members, or
   * with `members: false` without (its rules alone: sorting a set of thousands of members
   * is most of the cost, and what holds them in memory).
   */
  compiled(
    namespace: string,
    name: string,
    opts: { members?: boolean } = {},
  ): CompiledPolicy | undefined {
    const st = this.#locals.get(podKey(namespace, name));
    return st ? this.#materialize(st, opts.members ?? true) : undefined;
  }

  /** A set in use, with its current members. */
  peerSet(key: string): PeerSet {
    return this.#sets.peerSet(key);
  }

  /**
   * Each address a pod contributes to peer sets now, with the pod it is there
   * (`namespace/name uid`): what a rule that admits the address admits it as. An agent
   * keeps it across a restart (`agent/policy/_identities.ts`): an address whose pod
   * changed meanwhile has its tracked connections deleted.
   */
  *addressOwners(): Iterable<[string, string]> {
    for (const rec of this.#index.all()) {
      const who = `${rec.key} ${rec.pod.metadata.uid ?? ""}`;
      for (const a of rec.a4) yield [a.text, who];
      for (const a of rec.a6) yield [a.text, who];
    }
  }

  /** The keys (`namespace/name`) of the local pods, sorted. */
  locals(): string[] {
    return [...this.#locals.keys()].sort();
  }

  /** The local pods whose policy uses set `key`, sorted. */
  setUsers(key: string): string[] {
    return this.#sets.users(key);
  }

  /**
   * The node's addresses changed: every local pod is to be rendered again (one the cache
   * no longer has, or has only as another pod, keeps its last rules, with the node's new
   * addresses).
   */
  setNodeAddresses(addresses: string[]): PolicyUpdate {
    this.#node = splitFamilies(addresses);
    const changed: string[] = [];
    for (const st of this.#locals.values()) {
      if (!this.#localRec(st) || this.#recompile(st)) changed.push(st.key);
    }
    return { deltas: [], changed: changed.sort() };
  }

  /** A pod was added or changed in the cache. */
  upsertPod(pod: Pod): PolicyUpdate {
    const key = podKey(pod.metadata.namespace ?? "default", pod.metadata.name);
    const log = new DeltaLog();
    this.#replacePod(key, pod, log);
    const st = this.#locals.get(key);
    return this.#finish(log, st && this.#localRec(st) && this.#recompile(st) ? [key] : []);
  }

  /** A pod left the cache (a local pod keeps its rules until {@linkcode removeLocal}). */
  deletePod(namespace: string, name: string): PolicyUpdate {
    const log = new DeltaLog();
    this.#replacePod(podKey(namespace, name), undefined, log);
    return this.#finish(log, []);
  }

  /** A namespace was added or changed: its pods enter or leave namespace-selector sets. */
  upsertNamespace(ns: Namespace): PolicyUpdate {
    return this.#namespace(ns.metadata.name, ns.metadata.labels ?? {});
  }

  /** A namespace was deleted. */
  deleteNamespace(name: string): PolicyUpdate {
    return this.#namespace(name, null);
  }

  /** A NetworkPolicy was added or changed: its namespace's local pods are compiled again. */
  upsertPolicy(p: NetworkPolicy): PolicyUpdate {
    return this.#policyChanged(this.#putPolicy(p));
  }

  /** A NetworkPolicy was deleted. */
  deletePolicy(namespace: string, name: string): PolicyUpdate {
    this.#policies.get(namespace)?.delete(name);
    return this.#policyChanged(namespace);
  }

  #putPolicy(p: NetworkPolicy): string {
    const namespace = p.metadata.namespace ?? "default";
    let inNs = this.#policies.get(namespace);
    if (!inNs) this.#policies.set(namespace, inNs = new Map());
    inNs.set(p.metadata.name, p);
    return namespace;
  }

  /** The namespace's policies, prepared (each once, when first needed). */
  #preparedIn(namespace: string): PreparedPolicy[] {
    const inNs = this.#policies.get(namespace);
    if (!inNs) return [];
    const out: PreparedPolicy[] = [];
    for (const [name, p] of inNs) {
      if ("spec" in p) {
        const prepared = preparePolicy(p);
        inNs.set(name, prepared);
        out.push(prepared);
      } else out.push(p);
    }
    return out;
  }

  #policyChanged(namespace: string): PolicyUpdate {
    const changed: string[] = [];
    for (const st of this.#locals.values()) {
      if (st.namespace === namespace && this.#localRec(st) && this.#recompile(st)) {
        changed.push(st.key);
      }
    }
    return { deltas: [], changed: changed.sort() };
  }

  #namespace(name: string, labels: Record<string, string> | null): PolicyUpdate {
    const log = new DeltaLog();
    const was = this.#index.setNamespaceLabels(name, labels);
    this.#sets.namespaceChanged(name, was, labels ?? undefined, log);
    return this.#finish(log, []);
  }

  /**
   * Replaces a pod's record (undefined: removes it) and moves its set contributions; then
   * the other pods that list an address whose standing changed with it (it now lists
   * it too, or no longer does; a release of it the API no longer backs) are recorded
   * again.
   */
  #replacePod(key: string, pod: Pod | undefined, log: DeltaLog): void {
    const pruned = this.#index.local.prune(key, pod);
    const rec = pod ? this.#index.record(pod) : undefined;
    const old = rec ? this.#index.put(rec) : this.#index.remove(key);
    this.#move(old, rec, log);
    const was = old ? listedOf(old) : [], now = rec ? listedOf(rec) : [];
    const touched = new Set(pruned);
    for (const a of was) if (!now.some((b) => b.text === a.text)) touched.add(a.text);
    for (const a of now) if (!was.some((b) => b.text === a.text)) touched.add(a.text);
    this.#refresh(touched, key, log);
  }

  /** Moves a pod's set contributions, noting the addresses it no longer contributes. */
  #move(old: PodRec | undefined, rec: PodRec | undefined, log: DeltaLog): void {
    this.#sets.movePod(old, rec, log);
    if (!old) return;
    for (const a of [...old.a4, ...old.a6]) {
      if (!rec || ![...rec.a4, ...rec.a6].some((b) => b.text === a.text)) log.lost.add(a.text);
    }
  }

  /** Records again the pods (but `skip`) that list one of `addrs`, moving what changed. */
  #refresh(addrs: Iterable<string>, skip: string, log: DeltaLog): void {
    for (const a of addrs) {
      for (const rec of this.#index.listers(a)) {
        if (rec.key === skip || this.#index.pods.get(rec.key) !== rec) continue;
        const next = this.#index.record(rec.pod);
        if (sameAddrs(rec, next)) continue;
        this.#index.put(next);
        this.#move(rec, next, log);
      }
    }
  }

  /** A local pod's record, while it is the same pod's (its uid). */
  #localRec(st: LocalState): PodRec | undefined {
    const rec = this.#index.pods.get(st.key);
    return rec && sameUid(st.uid, rec.pod.metadata.uid) ? rec : undefined;
  }

  /** Compiles a local pod again; true when its rules changed (its sets are then swapped). */
  #recompile(st: LocalState, force = false): boolean {
    const rec = this.#localRec(st);
    if (!rec) throw new PodNotFoundError(st.key);
    const rules = podRules(rec, this.#preparedIn(rec.namespace));
    const sig = JSON.stringify([
      rules.ingress,
      rules.egress,
      rules.policies,
      rules.warnings,
      st.self,
      this.#node,
    ]);
    if (sig === st.sig && !force) return false;
    // Acquire before release: a set both keep is never dropped and rebuilt.
    for (const spec of rules.specs.values()) this.#sets.acquire(spec, st.key);
    for (const k of st.rules.specs.keys()) if (!rules.specs.has(k)) this.#sets.release(k, st.key);
    const changed = sig !== st.sig;
    st.rules = rules;
    st.sig = sig;
    return changed;
  }

  #materialize(st: LocalState, members = true): CompiledPolicy {
    return {
      pod: { namespace: st.namespace, name: st.name, ipv4: st.self.v4, ipv6: st.self.v6 },
      node: { ipv4: this.#node.v4, ipv6: this.#node.v6 },
      ingress: st.rules.ingress,
      egress: st.rules.egress,
      sets: [...st.rules.specs.keys()].sort().map((k) => this.#sets.peerSet(k, members)),
      policies: st.rules.policies,
      warnings: st.rules.warnings,
    };
  }

  #finish(log: DeltaLog, changed: string[]): PolicyUpdate {
    const skip = new Set(changed);
    const deltas = this.#sets.deltas(log, skip);
    const update: PolicyUpdate = { deltas, changed: [...skip].sort() };
    if (log.lost.size === 0) return update;
    // Of the addresses a pod let go, those some local pod admitted as its.
    const deleted = new Set<string>();
    for (const d of deltas) {
      for (const e of [...d.ipv4.delete, ...d.ipv6.delete]) {
        deleted.add(typeof e === "string" ? e : e.addr);
      }
    }
    const retired = [...log.lost].filter((a) => deleted.has(a)).sort();
    return retired.length > 0 ? { ...update, retired } : update;
  }
}

/** Whether two records of a pod contribute the same addresses. */
function sameAddrs(a: PodRec, b: PodRec): boolean {
  const eq = (x: { text: string }[], y: { text: string }[]) =>
    x.length === y.length && x.every((e, i) => e.text === y[i].text);
  return eq(a.a4, b.a4) && eq(a.a6, b.a6);
}

/** Compiles one local pod's policy from a view of the cache, once (no engine kept). */
export function compilePolicy(
  view: PolicyView,
  local: LocalPod,
  opts: EngineOptions,
): CompiledPolicy {
  return new PolicyEngine(view, opts).addLocal(local).compiled;
}
