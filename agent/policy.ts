/**
 * NetworkPolicy enforcement on the node (issue 35): the manager's
 * {@linkcode PolicyHook} over the cluster's caches (kube/) and the policy compiler
 * (policy/), applied through the device layer (netns/, the only code that spawns).
 *
 * - **From the first packet.** An ADD waits (bounded: `networkPolicy.syncWaitSeconds`)
 *   for the caches' first full list, fetches a pod the cache has not seen yet (5 s), and
 *   fails with CNI code 11 when it cannot know the pod's policy: the runtime retries.
 *   Otherwise `prepare` hands the plug a way to the pod's own table: called once the
 *   ENI's move has started (the compiling overlaps it), it compiles the pod's policy,
 *   loads the node's table with the pod's chains (at its node end, in parallel with the
 *   plug; `committed` waits for it) and gives the text, which the plug loads in the
 *   pod's namespace with the host link's ruleset before the ENI is configured.
 * - **Kept in step.** Every cache event (pods, namespaces, NetworkPolicies) goes to one
 *   serialized queue; a batch of events is applied to the compiler at once, then to the
 *   kernel: set deltas as element edits in each pod that uses the set and on the node
 *   (a failed edit replaces the sets whole), pods whose rules changed rendered again
 *   (with what was loaded before, so what went is deleted), then the node's table.
 *   A load that fails is retried with a backoff; nothing is ever flushed open.
 * - **Never fail open.** Once synced, an API server outage leaves the caches as they
 *   are, and they are enforced. An agent that starts while the API server is away
 *   touches no table (the kernel keeps what the last agent loaded) until its caches
 *   have synced; its ADDs answer 11 until then.
 *
 * Why one file: the queue, the attachments it keeps, the compiler and what was loaded
 * where are one state machine; split, every part would reach into the others' state.
 *
 * @module
 */
import { ApiError, type PodPolicyView, type PolicyStatus } from "../api/schema.ts";
import type { DeviceLayer } from "../netns/types.ts";
import type { PolicyHook, PolicyPod, RestoredPolicyPod } from "../manager/types.ts";
import { Kube, type Namespace, type NetworkPolicy, type Pod } from "../kube/mod.ts";
import { type KubeEnv, kubeEnv } from "../kube/access.ts";
import type { AgentConfig } from "./config.ts";
import type { Metrics } from "../lib/metrics.ts";
import {
  type CompiledPolicy,
  type DropLog,
  nodeNames,
  type NodePod,
  nodeRuleset,
  nodeUpdate,
  parseDropCounters,
  type PeerSet,
  PodNotFoundError,
  podRuleset,
  POLICY_TABLE,
  PolicyEngine,
  type PolicyUpdate,
  type SetDelta,
  setDeltaCommands,
  setReplaceCommands,
} from "../policy/mod.ts";
import { type Logger, nullLogger } from "../lib/log.ts";
import { userMessage } from "../lib/message.ts";
import { sleep, Slots } from "../lib/async.ts";
import { UnreadablePolicies } from "./policy_unreadable.ts";
import { ReuseWaits } from "./address_reuse.ts";

/** What the enforcer records in the agent's metrics (lib/metrics.ts implements it). */
export interface PolicyRecorder {
  /** A watch event was put in place, `ms` after it arrived. */
  policyEnforced(ms: number): void;
  /** A load in a pod's namespace or on the node failed (it is retried). */
  policyLoadFailed(place: "pod" | "node"): void;
}

/** Options of {@linkcode PolicyEnforcer}. */
export interface PolicyEnforcerOptions {
  kube: Kube;
  devices: DeviceLayer;
  log?: Logger;
  /** How long an ADD waits for the first sync (`networkPolicy.syncWaitSeconds`, default 10 s). */
  syncWaitMs?: number;
  /** Dropped packets logged per second and chain (`networkPolicy.logDropsPerSecond`; 0: off). */
  logDropsPerSecond?: number;
  /** How long the GET of a pod the cache lacks may take (default 5 s). */
  getPodTimeoutMs?: number;
  /** How often the node's addresses are listed again (default 60 s). */
  nodeAddressesEveryMs?: number;
  /**
   * The most a freed ENI waits for the API to stop showing its pod
   * (`networkPolicy.reuseWaitSeconds`, default 30 s).
   */
  reuseWaitMs?: number;
  metrics?: PolicyRecorder;
}

/** One attachment under policy: a pod's ENI and its host link. */
interface Att {
  key: string;
  /** `namespace/name`. */
  pod: string;
  /** The pod's uid (CNI_ARGS `K8S_POD_UID`; null: the runtime did not say). */
  uid: string | null;
  namespace: string;
  name: string;
  ips: string[];
  /** The ENI's name in the pod. */
  eni: string;
  /** The host link's node end. */
  nodeEnd: string;
  /** The pod's namespace; null until the ADD has recorded it (`committed`). */
  netns: string | null;
  /** Registration order (the newest attachment of a pod gives the pod its addresses). */
  seq: number;
  /** What the pod's table holds, as last rendered there (null: not known to this agent). */
  loaded: CompiledPolicy | null;
  /**
   * The pod's policy as last compiled (its rules current: compiled again whenever they
   * change; its sets' members may lag behind the deltas): what the node's incremental
   * updates and the status read, without materializing every set again.
   */
  compiled: CompiledPolicy | null;
  /** The pod's table missed an edit (no namespace yet, a failed load): render it again. */
  stale: boolean;
  /** The compiler knows it (false: not synced yet, or the pod is not in the cluster). */
  registered: boolean;
  /** A restored pod the cluster does not have: its tables stay as they are. */
  unknown: boolean;
  /** Known to have no table in its namespace (ADDed while no policy selected it). */
  noTable?: boolean;
  /** The node's load that put its chains in place (prepare's). */
  nodeReady?: Promise<boolean>;
}

/** One load waiting for its table: `run` loads (and renders, when it is whole); true when it loaded. */
interface TableWork {
  run: () => Promise<boolean>;
  /** A whole render: what is queued before it and has not started is superseded. */
  whole: boolean;
  /** Never superseded: runs after the whole render that would have (a conntrack flush). */
  keep?: boolean;
  resolve: (ok: boolean) => void;
}

/** A table's loads, in order: one at a time. */
interface TableQueue {
  items: TableWork[];
  /** The loop running them, while it runs. */
  running: Promise<void> | null;
}

/** A cache event waiting for the queue. */
interface Event {
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
class Changes {
  readonly deltas: SetDelta[] = [];
  readonly changed = new Set<string>();
  node = false;
  /** When each event of the batch arrived (`performance.now()`). */
  readonly arrived: number[] = [];
  /** The resourceVersion of the batch's last event of each kind (enforced once flushed). */
  readonly rvs = new Map<string, string>();
  /** Addresses no longer their pod's: their tracked connections go (`PolicyUpdate.retired`). */
  readonly retired = new Set<string>();

  add(u: PolicyUpdate): void {
    this.deltas.push(...u.deltas);
    for (const c of u.changed) this.changed.add(c);
    for (const a of u.retired ?? []) this.retired.add(a);
  }
}

/** The message of an ADD that cannot know its pod's policy yet (CNI code 11). */
export const NOT_SYNCED =
  "NetworkPolicy: the agent has not synced with the Kubernetes API server yet; the runtime retries";

const TABLE = `inet ${POLICY_TABLE}`;
/**
 * The most pod namespaces loaded at once (set edits, the drop counters' reads): a
 * namespace's label change edits every local pod's sets, and fifty `nft` processes at
 * once only share the same CPUs, each with its spawn's buffers in the agent.
 */
const PARALLEL_LOADS = 8;
/** The most whole renders at once: each holds its pod's sets' members and text in memory. */
const PARALLEL_RENDERS = 2;
/** How long an ADD's edits of other pods' tables and the node's sets wait after its answer. */
const DEFERRED_EDITS_DELAY_MS = 25;
/** How stale the drop counters may be (they cost a spawn per pod). */
const DROPS_TTL_MS = 10_000;

/**
 * A compiled policy without its sets' members: all that a `previous` render, the node's
 * update of an unchanged pod and the status read (rules, set keys and kinds). Keeping
 * the members of every pod's big sets three times over cost the agent tens of MB.
 */
const light = (c: CompiledPolicy): CompiledPolicy => ({
  ...c,
  sets: c.sets.map((s) => ({ ...s, ipv4: [], ipv6: [] }) as typeof s),
});

/**
 * Whether a policy isolates the pod in some direction. A pod no policy selects (most pods
 * of most clusters) gets no table in its namespace and no chains on the node: what is not
 * jumped to is accepted. Its table and chains are made when a policy first selects it.
 */
const isolates = (c: CompiledPolicy): boolean => c.ingress.isolated || c.egress.isolated;

/**
 * The retired addresses of `ch` that a pod's table held: those `mine` (its sets' deltas)
 * deletes, or all of them (null: the table is rendered whole).
 */
function retiredIn(ch: Changes, mine: SetDelta[] | null): string[] {
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

/** The local pod of an attachment, for the engine. */
const localOf = (att: Att) => ({ namespace: att.namespace, name: att.name });

const sameSet = (a: string[], b: string[]) =>
  a.length === b.length && [...a].sort().join() === [...b].sort().join();

/** A dropped-packet count of one pod, direction and place. */
export interface PolicyDrops {
  pod: string;
  direction: "ingress" | "egress";
  place: "pod" | "node";
  packets: number;
}

/** The agent's NetworkPolicy enforcer (see the module doc). */
export class PolicyEnforcer implements PolicyHook {
  readonly #kube: Kube;
  readonly #devices: DeviceLayer;
  readonly #log: Logger;
  readonly #syncWaitMs: number;
  readonly #getPodMs: number;
  readonly #reuseWaitMs: number;
  /** Freed ENIs waiting for the API to stop showing their pods (`address_reuse.ts`). */
  #reuse: ReuseWaits | null = null;
  readonly #dropLog: DropLog | undefined;
  readonly #metrics: PolicyRecorder | undefined;
  readonly #atts = new Map<string, Att>();
  readonly #events: Event[] = [];
  /** What an ADD's prepare left for the pods' tables until the ADD has answered. */
  #deferred: Changes | null = null;
  /** Per kind, the resourceVersion put in place, and the flush that did (flushes overlap). */
  readonly #enforcedRv = new Map<string, { rv: string; flush: number }>();
  #flushes = 0;
  /** The last flush's end: a flush ends only after every earlier one (its versions count then). */
  #lastFlush: Promise<unknown> = Promise.resolve();
  readonly #stop = new AbortController();
  #engine: PolicyEngine | null = null;
  #ready!: () => void;
  readonly #readyP = new Promise<void>((r) => (this.#ready = r));
  /** Each table's chain of loads: a pod's namespace path, or "" for the node. */
  readonly #tables = new Map<string, TableQueue>();
  /** Whole renders (at most {@linkcode PARALLEL_RENDERS} at once). */
  readonly #renders = new Slots(PARALLEL_RENDERS);
  /** The loads in pods' namespaces other than whole renders: set edits, counter reads. */
  readonly #podLoads = new Slots(PARALLEL_LOADS);
  /** The queue: tasks not started yet, in order, and the loop running them. */
  readonly #tasks: (() => Promise<void>)[] = [];
  #pump: Promise<void> | null = null;
  #scheduled = false;
  #seq = 0;
  #nodeAddrs: string[] = [];
  #nodeLoaded: NodePod[] | null = null;
  /** The node's table has not been rendered by this agent yet: its first load starts clean. */
  #nodeFresh = true;
  #nodeStale = false;
  #retryMs = 0;
  #retryTimer: ReturnType<typeof setTimeout> | undefined;
  #loadFailures = 0;
  #drops: { at: number; value: Promise<PolicyDrops[]> } | null = null;
  readonly #started: Promise<void>;
  readonly #unsubscribe: (() => void)[] = [];
  /** The cluster's policies it cannot read (each fails closed): logged, and listed. */
  readonly #unreadable: UnreadablePolicies;

  /** Starts the three caches and, once they have synced, takes over the node's pods. */
  constructor(o: PolicyEnforcerOptions) {
    this.#kube = o.kube;
    this.#devices = o.devices;
    this.#log = (o.log ?? nullLogger).child({ component: "policy" });
    this.#syncWaitMs = o.syncWaitMs ?? 10_000;
    this.#getPodMs = o.getPodTimeoutMs ?? 5_000;
    this.#reuseWaitMs = o.reuseWaitMs ?? 30_000;
    this.#dropLog = o.logDropsPerSecond ? { rate: o.logDropsPerSecond } : undefined;
    this.#metrics = o.metrics;
    this.#unreadable = new UnreadablePolicies(o.kube.networkPolicies, this.#log);
    this.#unsubscribe.push(() => this.#unreadable.close());
    this.#started = this.#start(o.nodeAddressesEveryMs ?? 60_000);
  }

  /** Whether the caches have synced and the enforcer has taken over. */
  get synced(): boolean {
    return this.#engine !== null;
  }

  /** Waits until the enforcer has taken over (tests, the bench); false after `timeoutMs`. */
  async waitSynced(timeoutMs: number): Promise<boolean> {
    if (this.#engine) return true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<boolean>((r) => (timer = setTimeout(() => r(false), timeoutMs)));
    try {
      return await Promise.race([this.#readyP.then(() => true), late]);
    } finally {
      clearTimeout(timer);
    }
  }

  // ---- start-up ----

  async #start(nodeEveryMs: number): Promise<void> {
    const signal = this.#stop.signal;
    const caches = [this.#kube.pods, this.#kube.namespaces, this.#kube.networkPolicies];
    // The node's addresses first, so that the engine is made in the same turn as the
    // caches' last sync (no event can slip in between).
    for (;;) {
      try {
        this.#nodeAddrs = (await this.#devices.nodeAddresses()).addresses;
        break;
      } catch (err) {
        this.#log.warn("Cannot list the node's addresses; trying again", {
          error: userMessage(err),
        });
        await sleep(2_000, signal).catch(() => {});
        if (signal.aborted) return;
      }
    }
    for (;;) {
      const t0 = performance.now();
      const synced = await Promise.all(caches.map((c) => c.waitSynced(30_000)));
      if (signal.aborted) return;
      if (synced.every(Boolean)) break;
      this.#log.warn(
        "NetworkPolicy is not enforced for new pods yet: the Kubernetes caches have not synced (ADDs answer 11; existing pods keep their rules)",
        {
          caches: this.#kube.stats().map((s) => ({
            resource: s.resource,
            synced: s.synced,
            error: s.lastError,
          })),
        },
      );
      // A stopped cache answers at once: do not spin.
      if (performance.now() - t0 < 1_000) await sleep(5_000, signal).catch(() => {});
      if (signal.aborted) return;
    }
    // Same turn as the sync: subscribe, then index what the caches hold.
    const on = (resource: Event["resource"]) => (old: unknown, cur: unknown) => {
      this.#events.push({ resource, old, cur, at: performance.now() } as Event);
      this.#schedule();
    };
    this.#unsubscribe.push(
      this.#kube.pods.subscribe(on("pods"), { replay: false }),
      this.#kube.namespaces.subscribe(on("namespaces"), { replay: false }),
      this.#kube.networkPolicies.subscribe(on("networkpolicies"), { replay: false }),
    );
    const t0 = performance.now();
    this.#engine = new PolicyEngine({
      pods: () => this.#kube.pods.values(),
      namespaces: () => this.#kube.namespaces.values(),
      networkPolicies: () => this.#kube.networkPolicies.values(),
    }, { nodeAddresses: this.#nodeAddrs });
    for (const s of this.#kube.stats()) {
      if (s.resourceVersion) this.#enforcedRv.set(s.resource, { rv: s.resourceVersion, flush: 0 });
    }
    this.#log.info("NetworkPolicy: the caches have synced; enforcing", {
      pods: this.#kube.pods.size,
      namespaces: this.#kube.namespaces.size,
      networkPolicies: this.#kube.networkPolicies.size,
      localPods: this.#atts.size,
      indexMs: Math.round(performance.now() - t0),
    });
    const init = this.#run(() => {
      const ch = new Changes();
      ch.node = true;
      for (const att of this.#atts.values()) this.#register(att, ch);
      return Promise.resolve({ done: this.#flush(ch).all });
    });
    this.#ready();
    await (await init).done;
    this.#watchNodeAddresses(nodeEveryMs);
  }

  #watchNodeAddresses(everyMs: number): void {
    if (this.#stop.signal.aborted) return;
    const tick = async () => {
      if (this.#stop.signal.aborted) return;
      try {
        const now = (await this.#devices.nodeAddresses()).addresses;
        await this.#run(() => this.#nodeAddressesAre(now));
      } catch (err) {
        this.#log.warn("Cannot list the node's addresses", { error: userMessage(err) });
      }
      if (!this.#stop.signal.aborted) timer = setTimeout(tick, everyMs);
    };
    let timer = setTimeout(tick, everyMs);
    this.#stop.signal.addEventListener("abort", () => clearTimeout(timer), { once: true });
  }

  #nodeAddressesAre(addresses: string[]): Promise<void> {
    if (!this.#engine || sameSet(addresses, this.#nodeAddrs)) return Promise.resolve();
    this.#log.info("NetworkPolicy: the node's addresses changed", {
      was: this.#nodeAddrs,
      now: addresses,
    });
    this.#nodeAddrs = [...addresses];
    const ch = this.#takeEvents();
    ch.add(this.#engine.setNodeAddresses(addresses));
    ch.node = true;
    this.#flush(ch);
    return Promise.resolve();
  }

  // ---- the queue ----

  /**
   * Runs `fn` after everything queued before it (the one place the engine and tables
   * change); with `first`, before everything queued but not started yet (an ADD waits for
   * the task running, never for the pods' edits queued behind it: a queued drain finds
   * its events taken by then, and applies what is left).
   */
  #run<T>(fn: () => Promise<T>, o: { first?: boolean } = {}): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const task = () => fn().then(resolve, reject);
      if (o.first) this.#tasks.unshift(task);
      else this.#tasks.push(task);
      this.#pump ??= (async () => {
        while (this.#tasks.length > 0) await this.#tasks.shift()!();
        this.#pump = null;
      })();
    });
  }

  #schedule(): void {
    if (this.#scheduled || this.#stop.signal.aborted) return;
    this.#scheduled = true;
    this.#run(() => this.#drain()).catch((err) =>
      this.#log.error("NetworkPolicy: applying cache events failed", { error: userMessage(err) })
    );
  }

  #drain(): Promise<void> {
    const ch = this.#takeEvents();
    if (ch.arrived.length > 0 || ch.deltas.length > 0 || ch.changed.size > 0 || this.#anyStale()) {
      this.#flush(ch);
    }
    return Promise.resolve();
  }

  /** Applies every pending event to the engine; what they changed. */
  #takeEvents(): Changes {
    this.#scheduled = false;
    const ch = this.#deferred ?? new Changes();
    this.#deferred = null;
    const batch = this.#events.splice(0);
    const engine = this.#engine;
    if (!engine) return ch;
    for (const ev of batch) {
      ch.arrived.push(ev.at);
      const obj = (ev.cur ?? ev.old)!;
      const rv = obj.metadata.resourceVersion;
      try {
        if (ev.resource === "pods") {
          const pod = ev.cur as Pod | undefined;
          if (pod) {
            ch.add(engine.upsertPod(pod));
            this.#podCameBack(`${pod.metadata.namespace}/${pod.metadata.name}`, ch);
          } else {
            ch.add(engine.deletePod(obj.metadata.namespace ?? "default", obj.metadata.name));
          }
        } else if (ev.resource === "namespaces") {
          ch.add(
            ev.cur
              ? engine.upsertNamespace(ev.cur as Namespace)
              : engine.deleteNamespace(obj.metadata.name),
          );
        } else {
          ch.add(
            ev.cur
              ? engine.upsertPolicy(ev.cur as NetworkPolicy)
              : engine.deletePolicy(obj.metadata.namespace ?? "default", obj.metadata.name),
          );
        }
      } catch (err) {
        this.#log.error("NetworkPolicy: a cache event could not be compiled", {
          resource: ev.resource,
          object: `${obj.metadata.namespace ?? ""}/${obj.metadata.name}`,
          error: userMessage(err),
        });
      }
      if (rv) ch.rvs.set(ev.resource, rv);
    }
    return ch;
  }

  /** A restored pod the cluster did not have is back in the cache: enforce it now. */
  #podCameBack(pod: string, ch: Changes): void {
    for (const att of this.#atts.values()) {
      if (att.pod === pod && !att.registered) this.#register(att, ch);
    }
  }

  /** Registers `att` with the engine (its pod's newest attachment gives the addresses). */
  #register(att: Att, ch: Changes): void {
    const engine = this.#engine!;
    const newest = this.#newestOf(att.pod) ?? att;
    try {
      const r = engine.addLocal({ ...localOf(att), ips: newest.ips, uid: newest.uid ?? undefined });
      ch.add(r);
      ch.changed.add(att.pod);
      att.compiled = light(r.compiled);
      att.registered = true;
      att.unknown = false;
      att.stale = true;
    } catch (err) {
      if (!(err instanceof PodNotFoundError)) throw err;
      att.unknown = true;
      this.#log.warn(
        "NetworkPolicy: a pod of this node is not in the cluster; its rules stay as they are",
        { pod: att.pod, key: att.key },
      );
    }
  }

  #newestOf(pod: string): Att | undefined {
    let best: Att | undefined;
    for (const a of this.#atts.values()) {
      if (a.pod === pod && (!best || a.seq > best.seq)) best = a;
    }
    return best;
  }

  #anyStale(): boolean {
    return this.#nodeStale || [...this.#atts.values()].some((a) => a.stale && a.netns !== null);
  }

  /**
   * Puts `ch` in place: each pod's table (its deltas, or all of it when its rules changed
   * or it missed an edit), and the node's. The texts are rendered now, in the engine's
   * order; their loads go to each table's own chain (`#load`), so a table never sees them
   * out of order while the queue goes on. `node` settles when the node's load has (true
   * when it succeeded), `all` when every load has. With `deferPods`, the pods' part waits
   * for the next drain.
   */
  #flush(ch: Changes, o: { deferPods?: boolean } = {}): {
    node: Promise<boolean>;
    all: Promise<void>;
  } {
    const loads: Promise<unknown>[] = [];
    for (const att of o.deferPods ? [] : this.#atts.values()) {
      if (!att.registered) continue;
      const mine = ch.deltas.filter((d) => d.users.includes(att.pod));
      const full = ch.changed.has(att.pod) || att.stale;
      if (att.netns === null) {
        if (full || mine.length > 0) att.stale = true;
        continue;
      }
      if (full) loads.push(this.#renderPod(att));
      else if (mine.length > 0) loads.push(this.#editPod(att, mine));
      const gone = retiredIn(ch, full ? null : mine);
      if (gone.length > 0 && !att.noTable) loads.push(this.#forget(att.netns, gone));
    }
    // With `deferPods` the node's set edits wait too (the node's update then holds only
    // the new pod's chains and the sets new to the node): the deferred flush applies them.
    const node = ch.node || this.#nodeStale || this.#nodeFresh || this.#nodeLoaded === null
      ? this.#renderNode()
      : this.#updateNode(ch, !o.deferPods);
    if (!o.deferPods && ch.retired.size > 0) loads.push(this.#forget(null, [...ch.retired]));
    if (o.deferPods) {
      // The other pods' edits, and the node's edits of its sets, that an ADD's own change
      // brings wait until it has answered (they only ever admit more: the new pod joining
      // the sets); the next drain applies them first.
      const d = new Changes();
      d.deltas.push(...ch.deltas);
      for (const c of ch.changed) d.changed.add(c);
      d.arrived.push(...ch.arrived.splice(0));
      for (const [k, v] of ch.rvs) d.rvs.set(k, v);
      ch.rvs.clear();
      for (const a of ch.retired) d.retired.add(a);
      this.#deferred = d;
    }
    const flush = ++this.#flushes;
    const all = Promise.all([this.#lastFlush, node, ...loads]).then(() => {
      const now = performance.now();
      for (const t of ch.arrived) this.#metrics?.policyEnforced(now - t);
      // An earlier flush may end after this one: it never takes the version back.
      for (const [resource, rv] of ch.rvs) {
        if ((this.#enforcedRv.get(resource)?.flush ?? -1) < flush) {
          this.#enforcedRv.set(resource, { rv, flush });
        }
      }
      this.#afterFlush();
    });
    this.#lastFlush = all.catch(() => {});
    return { node, all };
  }

  /**
   * Queues a load for a table (a pod's namespace path, or null: the node) after whatever
   * was queued for it before, one at a time; a whole render supersedes what is queued and
   * not started (it renders when it runs, from the engine's state then, so a burst of
   * changes costs one render, and no text waits in memory).
   */
  #enqueue(
    netns: string | null,
    run: () => Promise<boolean>,
    whole = false,
    keep = false,
  ): Promise<boolean> {
    const key = netns ?? "";
    let q = this.#tables.get(key);
    if (!q) this.#tables.set(key, q = { items: [], running: null });
    const queue = q;
    return new Promise<boolean>((resolve) => {
      // What must run after the table's next load (`keep`: a flush of tracked
      // connections) is not superseded: it runs after the whole render.
      const kept = whole ? queue.items.filter((it) => it.keep) : [];
      if (whole) { for (const it of queue.items.splice(0)) if (!it.keep) it.resolve(true); }
      queue.items.push({ run, whole, resolve, ...(keep ? { keep } : {}) }, ...kept);
      queue.running ??= (async () => {
        while (queue.items.length > 0) {
          const it = queue.items.shift()!;
          it.resolve(await it.run().catch(() => false));
        }
        queue.running = null;
        if (this.#tables.get(key) === queue) this.#tables.delete(key);
      })();
    });
  }

  /**
   * Deletes the connections tracked for `addresses` in a table's namespace (null: the
   * node), queued after its loads (so its sets no longer admit them as their old pod's):
   * they were that pod's. A failure is logged (new connections are denied all the same).
   */
  #forget(netns: string | null, addresses: string[]): Promise<boolean> {
    return this.#enqueue(
      netns,
      () =>
        this.#devices.flushConntrack(netns, addresses).then(() => true, (err) => {
          this.#log.warn(
            "NetworkPolicy: cannot delete the tracked connections of addresses no longer their pod's",
            { ...(netns ? { netns } : {}), addresses, error: userMessage(err) },
          );
          return false;
        }),
      false,
      true,
    );
  }

  /** Loads `text` in a table, queued after its earlier loads; true when it loaded. */
  #load(netns: string | null, text: string): Promise<boolean> {
    const load = () =>
      this.#devices.loadRuleset(netns, text).then(() => true, (err) => {
        this.#failed(netns === null ? "node" : "pod", netns, err);
        return false;
      });
    // The node's table (an ADD may be waiting for it) never queues behind the pods'.
    return this.#enqueue(netns, netns === null ? load : () => this.#podLoads.run(load));
  }

  #afterFlush(): void {
    if (!this.#anyStale()) {
      this.#retryMs = 0;
      return;
    }
    if (this.#retryTimer !== undefined || this.#stop.signal.aborted) return;
    this.#retryMs = Math.min(30_000, this.#retryMs ? this.#retryMs * 2 : 1_000);
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined;
      this.#schedule();
    }, this.#retryMs);
  }

  /** The pod's policy compiled now (its sets' current members); kept light as `att.compiled`. */
  #compile(att: Att, members = true): CompiledPolicy | null {
    const c = this.#engine?.compiled(att.namespace, att.name, { members });
    if (!c) return att.compiled;
    att.compiled = members ? light(c) : c;
    return c;
  }

  /**
   * The pod's whole table, queued: rendered when its turn comes, from the engine's state
   * then and after what the table holds (`loaded`, which only a load that succeeded sets).
   */
  #renderPod(att: Att): Promise<boolean> {
    const netns = att.netns;
    if (netns === null || !this.#engine) return Promise.resolve(true);
    att.stale = false;
    return this.#enqueue(netns, async () => {
      if (!this.#atts.has(att.key)) return true;
      return await this.#renders.run(() => this.#renderPodNow(att, netns));
    }, true);
  }

  /** Renders the pod's table from the engine's state now and loads it. */
  async #renderPodNow(att: Att, netns: string): Promise<boolean> {
    const c = this.#compile(att);
    if (!c) return true;
    // Still open and no table made: nothing to load.
    if (att.noTable && !isolates(c)) return true;
    const text = podRuleset(c, {
      eni: att.eni,
      previous: att.loaded ?? undefined,
      log: this.#dropLog,
    });
    try {
      await this.#devices.loadRuleset(netns, text);
      att.loaded = light(c);
      att.noTable = false;
      return true;
    } catch (err) {
      // The transaction left what was there: rendered whole again later.
      this.#failed("pod", netns, err);
      att.stale = true;
      return false;
    }
  }

  /** The deltas of the pod's sets, queued; a failed edit replaces those sets whole. */
  #editPod(att: Att, deltas: SetDelta[]): Promise<boolean> {
    const text = deltas.map(setDeltaCommands).join("");
    if (text === "" || att.netns === null) return Promise.resolve(true);
    const netns = att.netns;
    return this.#load(netns, text).then((ok) => {
      if (ok) return true;
      // An element to delete was missing: the sets' current members, whole.
      const c = this.#compile(att);
      const keys = new Set(deltas.map((d) => d.key));
      const sets = c?.sets.filter((s) => keys.has(s.key)) ?? [];
      return this.#load(netns, sets.map(setReplaceCommands).join("")).then((again) => {
        if (!again) att.stale = true;
        return again;
      });
    });
  }

  /**
   * The node's pods: each attachment's node end and its pod's policy, compiled now when
   * `fresh` says so (its sets' members left out when `members` is false), else as last
   * compiled (its rules current; enough for `nodeUpdate`,
   * which fills only new sets, and new sets come from the pods whose rules just changed).
   */
  #nodePods(fresh: (att: Att) => boolean, members = true): NodePod[] {
    const out: NodePod[] = [];
    for (const att of [...this.#atts.values()].sort((a, b) => a.seq - b.seq)) {
      const policy = att.registered && fresh(att)
        ? this.#compile(att, members)
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
  #updateNode(ch: Changes, deltas = true): Promise<boolean> {
    const previous = this.#nodeLoaded!;
    const had = new Set(previous.map((p) => p.nodeEnd));
    // Compiled again for the pods whose chains are made (only they bring new sets), their
    // rules alone; members only for the sets the node does not hold yet.
    const pods = this.#nodePods((a) => ch.changed.has(a.pod) || !had.has(a.nodeEnd), false);
    const keys = (list: NodePod[]) => new Set(list.flatMap((p) => p.policy.sets.map((s) => s.key)));
    const before = keys(previous), now = keys(pods);
    const filled = new Map<string, PeerSet>();
    try {
      for (const p of pods) {
        if (p.policy.sets.every((s) => before.has(s.key))) continue;
        const full = (key: string) => {
          let f = filled.get(key);
          if (!f) filled.set(key, f = this.#engine!.peerSet(key));
          return f;
        };
        p.policy = {
          ...p.policy,
          sets: p.policy.sets.map((s) => (before.has(s.key) ? s : full(s.key))),
        };
      }
    } catch {
      // A set no longer in use (the engine moved on): render the node whole.
      this.#nodeLoaded = null;
      return this.#renderNode();
    }
    const changed = [...this.#atts.values()]
      .filter((a) => ch.changed.has(a.pod))
      .map((a) => a.nodeEnd);
    const text = (deltas ? ch.deltas : []).filter((d) => before.has(d.key) && now.has(d.key))
      .map(setDeltaCommands).join("") +
      nodeUpdate(pods, { previous, changed, log: this.#dropLog });
    if (text === "") return Promise.resolve(true);
    this.#nodeLoaded = pods.map((p) => ({ nodeEnd: p.nodeEnd, policy: light(p.policy) }));
    return this.#load(null, text).then((ok) => {
      if (ok) return true;
      this.#log.debug("NetworkPolicy: the node's update failed; rendering it whole");
      this.#nodeLoaded = null;
      return this.#renderNode();
    });
  }

  /** The node's whole table, rendered now (after what it was last rendered as), queued. */
  #renderNode(): Promise<boolean> {
    const pods = this.#nodePods(() => true);
    const split = { ipv4: [] as string[], ipv6: [] as string[] };
    for (const a of this.#nodeAddrs) (a.includes(":") ? split.ipv6 : split.ipv4).push(a);
    const node = pods[0]?.policy.node ?? split;
    let text = nodeRuleset(pods, {
      node,
      previous: this.#nodeLoaded ?? undefined,
      log: this.#dropLog,
    });
    // This agent's first load replaces what an earlier one left (one transaction).
    if (this.#nodeFresh) text = `table ${TABLE} {}\ndelete table ${TABLE}\n${text}`;
    const fresh = this.#nodeFresh;
    this.#nodeLoaded = pods.map((p) => ({ nodeEnd: p.nodeEnd, policy: light(p.policy) }));
    this.#nodeFresh = false;
    this.#nodeStale = false;
    return this.#load(null, text).then((ok) => {
      if (!ok) {
        // What the table holds now is unknown: the next flush renders it whole again.
        this.#nodeStale = true;
        this.#nodeLoaded = null;
        this.#nodeFresh ||= fresh;
      }
      return ok;
    });
  }

  #failed(place: "pod" | "node", netns: string | null, err: unknown): void {
    this.#loadFailures++;
    this.#metrics?.policyLoadFailed(place);
    this.#log.warn(
      place === "pod"
        ? "NetworkPolicy: loading a pod's table failed; trying again"
        : "NetworkPolicy: loading the node's table failed; trying again",
      { ...(netns ? { netns } : {}), error: userMessage(err) },
    );
  }

  // ---- the manager's hook ----

  whenSynced(): Promise<void> | null {
    if (this.#engine) return null;
    if (this.#stop.signal.aborted) {
      return Promise.reject(new ApiError("busy", "The agent is shutting down"));
    }
    return this.waitSynced(this.#syncWaitMs).then((synced) => {
      if (!synced) throw new ApiError("policy_unavailable", NOT_SYNCED);
    });
  }

  async prepare(p: PolicyPod): Promise<{ podRuleset: () => Promise<string> } | null> {
    if (this.#stop.signal.aborted) throw new ApiError("busy", "The agent is shutting down");
    if (!(await this.waitSynced(this.#syncWaitMs))) {
      throw new ApiError("policy_unavailable", NOT_SYNCED);
    }
    const slash = p.pod.indexOf("/");
    const namespace = p.pod.slice(0, slash), name = p.pod.slice(slash + 1);
    let fetched: Pod | null = null;
    if (!this.#kube.pods.get(p.pod)) {
      try {
        fetched = await this.#kube.getPod(namespace, name, { timeoutMs: this.#getPodMs });
      } catch (err) {
        throw new ApiError(
          "policy_unavailable",
          `NetworkPolicy: the pod "${p.pod}" is not in the agent's cache yet and the Kubernetes API server did not say what it is (${
            userMessage(err)
          }); the runtime retries`,
        );
      }
      if (!fetched) {
        throw new ApiError(
          "policy_unavailable",
          `NetworkPolicy: the Kubernetes API server has no pod "${p.pod}" (yet); the runtime retries`,
        );
      }
    }
    const ips = [p.addresses.ipv4, p.addresses.ipv6].filter((a): a is string => !!a);
    return { podRuleset: () => this.#admit(p, namespace, name, ips, fetched) };
  }

  /**
   * ADD's own change, queued first: the pod registered with the engine (its addresses in
   * the sets it belongs to), its node chains loading, and its table's text, which the
   * plug loads in the pod (empty: no policy isolates it).
   */
  async #admit(
    p: PolicyPod,
    namespace: string,
    name: string,
    ips: string[],
    fetched: Pod | null,
  ): Promise<string> {
    let deliver!: (text: string) => void;
    let refuse!: (err: unknown) => void;
    const result = new Promise<string>((res, rej) => [deliver, refuse] = [res, rej]);
    const task = this.#run(() => {
      const engine = this.#engine!;
      // What came before this ADD (cache events, an earlier ADD's deferred edits) goes in
      // now, as any drain puts it; only this ADD's own edits wait for its answer.
      const before = this.#takeEvents();
      if (
        before.arrived.length > 0 || before.deltas.length > 0 || before.changed.size > 0 ||
        before.node || before.rvs.size > 0
      ) this.#flush(before);
      const ch = new Changes();
      try {
        if (fetched && !this.#kube.pods.get(p.pod)) ch.add(engine.upsertPod(fetched));
        if (p.nodeAddresses.length > 0 && !sameSet(p.nodeAddresses, this.#nodeAddrs)) {
          this.#nodeAddrs = [...p.nodeAddresses];
          ch.add(engine.setNodeAddresses(p.nodeAddresses));
        }
        const att: Att = {
          key: p.key,
          pod: p.pod,
          uid: p.uid ?? null,
          namespace,
          name,
          ips,
          eni: p.eniIfName,
          nodeEnd: p.nodeIfName,
          netns: null,
          seq: ++this.#seq,
          loaded: null,
          compiled: null,
          stale: false,
          registered: false,
          unknown: false,
        };
        let r: ReturnType<PolicyEngine["addLocal"]>;
        try {
          r = engine.addLocal({ namespace, name, ips, uid: p.uid });
        } catch (err) {
          if (!(err instanceof PodNotFoundError)) throw err;
          throw new ApiError(
            "policy_unavailable",
            `NetworkPolicy: the pod "${p.pod}" is not in the agent's cache yet; the runtime retries`,
          );
        }
        this.#atts.set(p.key, att);
        att.registered = true;
        att.compiled = light(r.compiled);
        // A pod no policy selects gets no table (see `isolates`).
        att.noTable = !isolates(r.compiled);
        att.loaded = att.noTable ? null : att.compiled;
        ch.add(r);
        ch.changed.delete(p.pod);
        // Its other attachments (an older container's) render again; this one rides the plug.
        for (const other of this.#atts.values()) {
          if (other.pod === p.pod && other !== att) {
            other.stale = true;
            other.compiled = att.compiled;
          }
        }
        const text = att.noTable
          ? ""
          : podRuleset(r.compiled, { eni: p.eniIfName, log: this.#dropLog });
        // An address this pod takes from another (an object the API still shows with it,
        // after a restart forgot its DEL) leaves that one's sets before the ADD answers:
        // only what admits more waits for the answer.
        const restricts = ch.retired.size > 0;
        const flushed = this.#flush(ch, { deferPods: !restricts });
        att.nodeReady = restricts ? flushed.all.then(() => flushed.node) : flushed.node;
        deliver(text);
      } catch (err) {
        // What this ADD changed before it failed still goes in.
        this.#flush(ch);
        refuse(err);
      }
      return Promise.resolve();
    }, { first: true });
    task.catch(() => {});
    return await result;
  }

  async committed(key: string, netns: string): Promise<void> {
    const att = this.#atts.get(key);
    if (!att) return;
    att.netns = netns;
    if (!(await (att.nodeReady ?? Promise.resolve(true)))) {
      // One more try, now: the ADD answers only with the pod's node chains in place.
      const ok = await (await this.#run(() => Promise.resolve({ p: this.#renderNode() }))).p;
      if (!ok) {
        throw new ApiError(
          "device_error",
          `NetworkPolicy: cannot load the node's rules for pod "${att.pod}" (see the agent's log)`,
        );
      }
    }
    if (att.stale) await (await this.#run(() => Promise.resolve({ p: this.#renderPod(att) }))).p;
    // The other pods' and the node's edits that prepare left for after the answer: a
    // little later, once the ADD's answer is on its way and its plugin process has exited
    // (rendering them and starting their `nft` processes took the main thread and the
    // CPUs while both waited). They only admit more; the pod's containers start later.
    // (Stopping ends the wait, and `#schedule` then does nothing.)
    if (this.#deferred) {
      sleep(DEFERRED_EDITS_DELAY_MS, this.#stop.signal).then(() => this.#schedule());
    }
  }

  async removed(key: string): Promise<void> {
    if (!this.#atts.has(key)) return;
    const done = await this.#run(() => {
      const att = this.#atts.get(key);
      if (!att) return Promise.resolve(undefined);
      this.#atts.delete(key);
      const engine = this.#engine;
      if (!engine) return Promise.resolve(undefined);
      const ch = this.#takeEvents();
      if (att.registered) {
        const other = this.#newestOf(att.pod);
        if (!other) ch.add(engine.removeLocal(att.namespace, att.name));
        else if (other.registered && !sameSet(other.ips, att.ips)) {
          ch.add(engine.addLocal({ ...localOf(att), ips: other.ips, uid: other.uid ?? undefined }));
          ch.changed.add(att.pod);
        }
      }
      return Promise.resolve({ all: this.#flush(ch).all });
    });
    await done?.all;
  }

  restore(pods: RestoredPolicyPod[]): void {
    for (const p of pods) {
      if (this.#atts.has(p.key)) continue;
      const slash = p.pod.indexOf("/");
      const att: Att = {
        key: p.key,
        pod: p.pod,
        uid: p.uid ?? null,
        namespace: p.pod.slice(0, slash),
        name: p.pod.slice(slash + 1),
        ips: [p.addresses.ipv4, p.addresses.ipv6].filter((a): a is string => !!a),
        eni: p.eniIfName,
        nodeEnd: p.nodeIfName,
        netns: p.netns,
        seq: ++this.#seq,
        loaded: null,
        compiled: null,
        stale: true,
        registered: false,
        unknown: false,
      };
      this.#atts.set(p.key, att);
      if (this.#engine) {
        this.#run(() => {
          const ch = this.#takeEvents();
          this.#register(att, ch);
          this.#flush(ch);
          return Promise.resolve();
        }).catch(() => {});
      }
    }
  }

  reuseWait(addresses: string[], signal: AbortSignal): Promise<void> | null {
    if (this.#stop.signal.aborted || signal.aborted) return null;
    this.#reuse ??= new ReuseWaits(this.#kube.pods);
    return this.#reuse.wait(addresses, {
      boundMs: this.#reuseWaitMs,
      signal: AbortSignal.any([signal, this.#stop.signal]),
      log: this.#log,
    });
  }

  // ---- what operators see ----

  /** The enforcer's state for `GET /v1/status`. */
  status(): PolicyStatus {
    const engine = this.#engine;
    const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());
    return {
      synced: engine !== null,
      pendingEvents: this.#events.length + (this.#deferred ? 1 : 0),
      loadFailures: this.#loadFailures,
      caches: this.#kube.stats().map((s) => ({
        resource: s.resource,
        synced: s.synced,
        objects: s.objects,
        relists: s.relists,
        watchRestarts: s.watchRestarts,
        errors: s.errors,
        lastError: s.lastError,
        lastEventAt: iso(s.lastEventAt),
        bookmarks: s.bookmarkSupport,
        silentWatches: s.silentWatches,
        enforcedResourceVersion: this.#enforcedRv.get(s.resource)?.rv ?? null,
      })),
      pods: [...this.#atts.values()].sort((a, b) => a.pod.localeCompare(b.pod)).map((a) => {
        const c = a.registered ? a.compiled : null;
        return {
          pod: a.pod,
          key: a.key,
          nodeIfName: a.nodeEnd,
          policies: c?.policies.length ?? 0,
          ingressIsolated: c?.ingress.isolated ?? false,
          egressIsolated: c?.egress.isolated ?? false,
          state: !engine ? "waiting" : a.unknown ? "unknown" : a.stale ? "retrying" : "enforced",
        };
      }),
      unreadable: this.#unreadable.list(),
    };
  }

  /** A local pod's effective policy (null: no attachment of it here, or not compiled yet). */
  view(pod: string): PodPolicyView | null {
    const att = this.#newestOf(pod);
    if (!att || !this.#engine || !att.registered) return null;
    const c = this.#engine.compiled(att.namespace, att.name);
    return c ? policyView(c) : null;
  }

  /** The compiled policy of a local pod (tests and the bench). */
  compiled(pod: string): CompiledPolicy | undefined {
    const att = this.#newestOf(pod);
    return att && this.#engine?.compiled(att.namespace, att.name);
  }

  /** Per pod and direction, how many rules its policy has (metrics). */
  ruleCounts(): { pod: string; direction: "ingress" | "egress"; rules: number }[] {
    const out: { pod: string; direction: "ingress" | "egress"; rules: number }[] = [];
    const seen = new Set<string>();
    for (const a of this.#atts.values()) {
      if (seen.has(a.pod) || !a.registered) continue;
      seen.add(a.pod);
      const c = a.compiled;
      if (!c) continue;
      for (const d of ["ingress", "egress"] as const) {
        out.push({ pod: a.pod, direction: d, rules: c[d].isolated ? c[d].entries.length : 0 });
      }
    }
    return out;
  }

  /**
   * The drop counters of every local pod, in its namespace and at its node end (read at
   * most every 10 s: a spawn per pod).
   */
  drops(): Promise<PolicyDrops[]> {
    const now = performance.now();
    if (!this.#drops || now - this.#drops.at > DROPS_TTL_MS) {
      this.#drops = { at: now, value: this.#readDrops() };
    }
    return this.#drops.value;
  }

  async #readDrops(): Promise<PolicyDrops[]> {
    const out: PolicyDrops[] = [];
    const atts = [...this.#atts.values()].filter((a) => a.netns !== null && !a.noTable);
    await Promise.all(atts.map((a) =>
      this.#podLoads.run(async () => {
        try {
          const json = await this.#devices.listCounters(a.netns, TABLE);
          for (const c of parseDropCounters(json)) {
            out.push({ pod: a.pod, direction: c.direction, place: "pod", packets: c.packets });
          }
        } catch { /* a namespace going away: no counters */ }
      })
    ));
    try {
      const byLink = new Map(
        [...this.#atts.values()].map((a) => [nodeNames(a.nodeEnd).ingress.slice(3), a.pod]),
      );
      for (const c of parseDropCounters(await this.#devices.listCounters(null, TABLE))) {
        const pod = c.link ? byLink.get(c.link) : undefined;
        if (pod) out.push({ pod, direction: c.direction, place: "node", packets: c.packets });
      }
    } catch { /* no table on the node yet */ }
    return out;
  }

  /** Stops the caches and the queue (the kernel keeps every table). */
  async close(): Promise<void> {
    if (this.#stop.signal.aborted) return;
    this.#stop.abort();
    clearTimeout(this.#retryTimer);
    for (const u of this.#unsubscribe) u();
    // Closing the caches ends the start-up's wait for their sync.
    await this.#kube.close();
    await this.#started.catch(() => {});
    while (this.#pump) await this.#pump;
    while (this.#tables.size > 0) {
      await Promise.all([...this.#tables.values()].map((q) => q.running));
    }
  }
}

/** What `enim policy` shows of a compiled policy. */
export function policyView(c: CompiledPolicy): PodPolicyView {
  const direction = (d: CompiledPolicy["ingress"]) => ({
    isolated: d.isolated,
    rules: d.entries.map((e) => {
      const set = e.peer === null ? undefined : c.sets.find((s) => s.key === e.peer);
      const ports = e.ports === null
        ? ["any"]
        : e.ports.map((m) =>
          m.name !== undefined
            ? `${m.protocol} port ${m.name}`
            : m.port === undefined
            ? `${m.protocol} any port`
            : m.endPort !== undefined
            ? `${m.protocol} ${m.port}-${m.endPort}`
            : `${m.protocol} ${m.port}`
        );
      if (!set) return { kind: "any" as const, peer: "any address", ports, members: [] };
      const members = set.kind === "namedPort"
        ? [...set.ipv4, ...set.ipv6].map((m) => `${m.addr} ${m.port}`)
        : [...set.ipv4, ...set.ipv6];
      return { kind: set.kind, peer: set.text, ports, members };
    }),
  });
  return {
    pod: `${c.pod.namespace}/${c.pod.name}`,
    addresses: [...c.pod.ipv4, ...c.pod.ipv6],
    nodeAddresses: [...c.node.ipv4, ...c.node.ipv6],
    policies: c.policies,
    ingress: direction(c.ingress),
    egress: direction(c.egress),
    warnings: c.warnings,
  };
}

/** Whether `networkPolicy.enabled` turns enforcement on, and why (for the log). */
export function policyEnabled(
  cfg: Pick<AgentConfig, "networkPolicy" | "kubernetes">,
  env: KubeEnv,
): { on: boolean; why: string } {
  const e = cfg.networkPolicy.enabled;
  if (e !== "auto") return { on: e, why: `networkPolicy.enabled is ${e}` };
  if (cfg.kubernetes.kubeconfig) return { on: true, why: "kubernetes.kubeconfig is set" };
  if (env.KUBECONFIG) return { on: true, why: "KUBECONFIG is set" };
  if (env.KUBERNETES_SERVICE_HOST) {
    return { on: true, why: "the agent runs in a pod (KUBERNETES_SERVICE_HOST)" };
  }
  return {
    on: false,
    why: "no Kubernetes API is configured (kubernetes.kubeconfig, KUBECONFIG, in-cluster)",
  };
}

/**
 * The agent's enforcer when `networkPolicy` is on (null when off): the Kubernetes API
 * found (a configuration error stops the agent: it never runs open by mistake), the
 * caches started. Registers its metrics.
 */
export async function startPolicyEnforcer(
  cfg: AgentConfig,
  o: { devices: DeviceLayer; metrics: Metrics; log: Logger; env?: KubeEnv },
): Promise<PolicyEnforcer | null> {
  const env = o.env ?? kubeEnv();
  const { on, why } = policyEnabled(cfg, env);
  if (!on) {
    o.log.info("NetworkPolicy enforcement is off", { why });
    return null;
  }
  const k = cfg.kubernetes;
  const kube = await Kube.connect({
    kubeconfig: k.kubeconfig,
    context: k.context,
    nodeName: k.nodeName,
    pageSize: k.pageSize,
    requestTimeoutSeconds: k.requestTimeoutSeconds,
    watchTimeoutSeconds: k.watchTimeoutSeconds,
    watchBookmarkSeconds: k.watchBookmarkSeconds,
    env,
    log: o.log,
  });
  o.log.info("NetworkPolicy enforcement is on", { why });
  const enforcer = new PolicyEnforcer({
    kube,
    devices: o.devices,
    log: o.log,
    syncWaitMs: cfg.networkPolicy.syncWaitSeconds * 1000,
    logDropsPerSecond: cfg.networkPolicy.logDropsPerSecond,
    reuseWaitMs: cfg.networkPolicy.reuseWaitSeconds * 1000,
    metrics: o.metrics,
  });
  o.metrics.setPolicySource(async () => {
    const s = enforcer.status();
    return {
      synced: s.synced,
      caches: s.caches,
      rules: enforcer.ruleCounts(),
      drops: await enforcer.drops(),
      unreadable: s.unreadable.map((u) => u.policy),
    };
  });
  return enforcer;
}
