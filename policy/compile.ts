/**
 * The NetworkPolicy compiler: from the cluster cache (pods, namespaces, policies) and
 * the node's local enim pods, each local pod's effective policy (see `types.ts`), with
 * the full `networking.k8s.io/v1` semantics. Pure: it spawns nothing and does no I/O.
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
import { PodIndex, podKey, splitFamilies } from "./_pod_index.ts";
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
}

/** Thrown when a local pod is not in the cache yet: its labels are unknown. */
export class PodNotFoundError extends Error {
  /** `key`: the pod, `namespace/name`. */
  constructor(key: string) {
    super(`Cannot compile the policy of pod "${key}": the pod is not in the cache`);
    this.name = "PodNotFoundError";
  }
}

interface LocalState {
  key: string;
  namespace: string;
  name: string;
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
    this.#policies.clear();
    for (const p of view.networkPolicies()) this.#putPolicy(p);
    this.#sets.clear();
    for (const st of this.#locals.values()) {
      const specs = st.rules.specs;
      st.rules = { ...st.rules, specs: new Map() };
      st.sig = "";
      if (this.#index.pods.has(st.key)) this.#recompile(st);
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
    const log = new DeltaLog();
    this.#index.setOverride(key, local.ips);
    this.#replacePod(key, known.pod, log);
    const st: LocalState = this.#locals.get(key) ?? {
      key,
      namespace: local.namespace,
      name: local.name,
      self: { v4: [], v6: [] },
      rules: noRules(),
      sig: "",
    };
    st.self = splitFamilies(local.ips);
    this.#locals.set(key, st);
    this.#recompile(st, true);
    return { ...this.#finish(log, [key]), compiled: this.#materialize(st) };
  }

  /** Forgets a local pod (after DEL): its sets lose a user, its address override goes. */
  removeLocal(namespace: string, name: string): PolicyUpdate {
    const key = podKey(namespace, name);
    const st = this.#locals.get(key);
    if (!st) return { deltas: [], changed: [] };
    const log = new DeltaLog();
    this.#locals.delete(key);
    for (const k of st.rules.specs.keys()) this.#sets.release(k, key);
    this.#index.setOverride(key, null);
    const rec = this.#index.pods.get(key);
    if (rec) this.#replacePod(key, rec.pod, log);
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
   * no longer has keeps its last rules, with the node's new addresses).
   */
  setNodeAddresses(addresses: string[]): PolicyUpdate {
    this.#node = splitFamilies(addresses);
    const changed: string[] = [];
    for (const st of this.#locals.values()) {
      if (!this.#index.pods.has(st.key) || this.#recompile(st)) changed.push(st.key);
    }
    return { deltas: [], changed: changed.sort() };
  }

  /** A pod was added or changed in the cache. */
  upsertPod(pod: Pod): PolicyUpdate {
    const key = podKey(pod.metadata.namespace ?? "default", pod.metadata.name);
    const log = new DeltaLog();
    this.#replacePod(key, pod, log);
    const st = this.#locals.get(key);
    return this.#finish(log, st && this.#recompile(st) ? [key] : []);
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
      if (st.namespace === namespace && this.#index.pods.has(st.key) && this.#recompile(st)) {
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

  /** Replaces a pod's record (undefined: removes it) and moves its set contributions. */
  #replacePod(key: string, pod: Pod | undefined, log: DeltaLog): void {
    const rec = pod ? this.#index.record(pod) : undefined;
    const old = rec ? this.#index.put(rec) : this.#index.remove(key);
    this.#sets.movePod(old, rec, log);
  }

  /** Compiles a local pod again; true when its rules changed (its sets are then swapped). */
  #recompile(st: LocalState, force = false): boolean {
    const rec = this.#index.pods.get(st.key);
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
    return { deltas: this.#sets.deltas(log, skip), changed: [...skip].sort() };
  }
}

/** Compiles one local pod's policy from a view of the cache, once (no engine kept). */
export function compilePolicy(
  view: PolicyView,
  local: LocalPod,
  opts: EngineOptions,
): CompiledPolicy {
  return new PolicyEngine(view, opts).addLocal(local).compiled;
}
