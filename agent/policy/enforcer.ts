/**
 * The agent's NetworkPolicy enforcer: the manager's {@linkcode PolicyHook} over the
 * cluster's caches (kube/) and the policy compiler (policy/), applied through the device
 * layer (netns/). What it promises is in `mod.ts`; its parts:
 *
 * - this class: start-up, the queue every change goes through, what a batch of changes
 *   does to the tables (`#flush`), and the hook's calls (ADD's prepare and commit, a
 *   release, the pods handed over at start-up);
 * - `_table_loads.ts`: each table's loads, in order; `_pod_table.ts`, `_node_table.ts`:
 *   what is rendered or edited in a pod's namespace and on the node;
 * - `_changes.ts`: the events waiting and what a batch changed; `_attachment.ts`: what
 *   is kept per attachment; `_status.ts`: what operators see.
 *
 * Why one file: the queue, the attachments it keeps and the compiler are one state
 * machine, whose every change goes through the queue.
 *
 * @module
 */
import { ApiError, type PodPolicyView, type PolicyStatus } from "../../api/schema.ts";
import type { DeviceLayer } from "../../netns/types.ts";
import type { PolicyHook, PolicyPod, RestoredPolicyPod } from "../../manager/types.ts";
import type { Kube, Namespace, NetworkPolicy, Pod } from "../../kube/mod.ts";
import {
  type CompiledPolicy,
  DEFAULT_JUDGED_MARK,
  type DropLog,
  FENCE_TABLE,
  fenceRemoval,
  fenceRuleset,
  fenceTimeoutSeconds,
  GUARD_TABLE,
  PodNotFoundError,
  podRuleset,
  POLICY_TABLE,
  PolicyEngine,
} from "../../policy/mod.ts";
import { type Logger, nullLogger } from "../../lib/log.ts";
import { userMessage } from "../../lib/message.ts";
import { sleep } from "../../lib/async.ts";
import { QueueStoppedError, SerialQueue } from "../../lib/serial_queue.ts";
import { PolicyLifecycle, type PolicyPhase } from "./lifecycle.ts";
import { listNodeAddresses, waitForCaches } from "./_startup.ts";
import { type Att, isolates, light, localOf, newestOf, sameSet } from "./_attachment.ts";
import { Changes, type PolicyEvent, retiredIn } from "./_changes.ts";
import { type LoadPlace, TableLoads } from "./_table_loads.ts";
import { NodeTable } from "./_node_table.ts";
import { editPod, type PodTableDeps, renderPod, syncGuard } from "./_pod_table.ts";
import { bypassOf, type RawGuardState } from "./_raw.ts";
import { type PolicyDrops, policyStatus, policyView, readDrops, ruleCounts } from "./_status.ts";
import { UnreadablePolicies } from "../policy_unreadable.ts";
import { ReuseWaits } from "../address_reuse.ts";
import type { PolicyMemory } from "./_memory.ts";
import { judgeTable, type TableFinding, type TableMark } from "../../netns/table_check.ts";

/** What the enforcer records in the agent's metrics (lib/metrics.ts implements it). */
export interface PolicyRecorder {
  /** A watch event was put in place, `ms` after it arrived. */
  policyEnforced(ms: number): void;
  /** A load in a pod's namespace or on the node failed (it is retried). */
  policyLoadFailed(place: "pod" | "node"): void;
  /** A policy table was found missing or changed by someone else, and is loaded again. */
  tableRepaired?(table: "policy" | "host_link", place: "pod" | "node"): void;
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
  /**
   * The backoff of a failed load's retry and of a failed change's recovery: the first
   * wait (default 1 s), doubling up to `maxMs` (default 30 s).
   */
  retry?: { initialMs: number; maxMs: number };
  metrics?: PolicyRecorder;
  /**
   * The kernel's raw-socket guard (`policy/raw_guard.ts`, probed at the agent's start:
   * `_raw.ts`): when on, every isolated pod gets one. Default: off.
   */
  rawGuard?: RawGuardState;
  /** What ADD does with an isolated pod that can reach past its policy (default `flag`). */
  rawCapablePods?: "flag" | "refuse";
  /** The runtime's default capabilities (default containerd's: `NET_RAW` among them). */
  runtimeDefaultCapabilities?: string[];
  /**
   * How often the tables are checked against what was loaded (`netns/table_check.ts`;
   * `networkPolicy.tableCheckSeconds`, default 2 s; 0: never): each pass the node's, and
   * the next {@linkcode PODS_PER_CHECK} pods'.
   */
  tableCheckMs?: number;
  /**
   * The judged bit of the packet mark (`policy/fence.ts`; `networkPolicy.judgedMark`,
   * default 0x20000; 0: no fence): the node's table stamps what it judged, and the fence,
   * armed at every table check, drops the first packets through node ends no table
   * judged. No fence without the table check (its writes keep it armed).
   */
  judgedMark?: number;
  /**
   * What is kept across a restart (`_memory.ts`): the pods the loaded rules knew each
   * address as, and the resourceVersions put in place. None: nothing is kept.
   */
  memory?: PolicyMemory;
}

/** The message of an ADD that cannot know its pod's policy yet (CNI code 11). */
export const NOT_SYNCED =
  "NetworkPolicy: the agent has not synced with the Kubernetes API server yet; the runtime retries";

/** How long an ADD's edits of other pods' tables and the node's sets wait after its answer. */
const DEFERRED_EDITS_DELAY_MS = 25;
/** Pods' tables checked per pass of the table check (a spawn each), in turn. */
export const PODS_PER_CHECK = 4;
/** How stale the drop counters may be (they cost a spawn per pod). */
const DROPS_TTL_MS = 10_000;

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
  readonly #events: PolicyEvent[] = [];
  /** What an ADD's prepare left for the pods' tables until the ADD has answered. */
  #deferred: Changes | null = null;
  /** Per kind, the resourceVersion put in place, and the flush that did (flushes overlap). */
  readonly #enforcedRv = new Map<string, { rv: string; flush: number }>();
  #flushes = 0;
  /** The last flush's end: a flush ends only after every earlier one (its versions count then). */
  #lastFlush: Promise<unknown> = Promise.resolve();
  #engine: PolicyEngine | null = null;
  readonly #life: PolicyLifecycle;
  /** The queue: the one place the engine and the tables change, one task at a time. */
  readonly #queue: SerialQueue;
  readonly #loads: TableLoads;
  readonly #node: NodeTable;
  readonly #podTables: PodTableDeps;
  readonly #rawGuard: RawGuardState;
  readonly #rawCapablePods: "flag" | "refuse";
  readonly #runtimeCaps: readonly string[];
  /** The pods flagged in the log as able to reach past their policy (once each). */
  readonly #flagged = new Set<string>();
  #scheduled = false;
  /** A task failed: the recovery (compile everything again, render every table) is queued. */
  #recovering = false;
  #seq = 0;
  #nodeAddrs: string[] = [];
  readonly #retryInitialMs: number;
  readonly #retryMaxMs: number;
  #retryMs = 0;
  #retryTimer: ReturnType<typeof setTimeout> | undefined;
  #loadFailures = 0;
  #drops: { at: number; value: Promise<PolicyDrops[]> } | null = null;
  readonly #unsubscribe: (() => void)[] = [];
  /** The cluster's policies it cannot read (each fails closed): logged, and listed. */
  readonly #unreadable: UnreadablePolicies;
  /** What the last check of the node's table saw (`netns/table_check.ts`). */
  #nodeMark: TableMark | null = null;
  /** The check of the node's table queued or running. */
  #nodeCheck: Promise<TableFinding> | null = null;
  /** The pods' tables are checked in turn: where the next pass begins. */
  #checkCursor = 0;
  /** Tables found missing or changed, and rendered again. */
  #repairs = 0;
  /** The judged bit (0: no fence), and the fence's timeout. */
  readonly #judgedMark: number;
  readonly #fenceTimeoutS: number;
  /** The fence was written (the drain takes it away). */
  #fenced = false;
  readonly #memory: PolicyMemory | null;
  /** The pods the confirmed rules knew each address as (`_memory.ts`; null: not read yet). */
  #owners: Map<string, string> | null = null;
  /** The confirmation of the addresses' pods running, and whether another is asked for. */
  #confirming: Promise<void> | null = null;
  #confirmAgain = false;

  /**
   * Starts the three caches' wait and the node's addresses' listing; once both are done
   * and the manager has handed over the node's pods ({@linkcode restore}), takes over.
   */
  constructor(o: PolicyEnforcerOptions) {
    this.#kube = o.kube;
    this.#devices = o.devices;
    this.#log = (o.log ?? nullLogger).child({ component: "policy" });
    this.#syncWaitMs = o.syncWaitMs ?? 10_000;
    this.#getPodMs = o.getPodTimeoutMs ?? 5_000;
    this.#reuseWaitMs = o.reuseWaitMs ?? 30_000;
    this.#dropLog = o.logDropsPerSecond ? { rate: o.logDropsPerSecond } : undefined;
    this.#metrics = o.metrics;
    this.#rawGuard = o.rawGuard ?? { on: false, why: "not probed" };
    this.#rawCapablePods = o.rawCapablePods ?? "flag";
    this.#runtimeCaps = o.runtimeDefaultCapabilities ?? ["NET_RAW"];
    this.#memory = o.memory ?? null;
    const checkMs = o.tableCheckMs ?? 2_000;
    this.#judgedMark = checkMs > 0 ? o.judgedMark ?? DEFAULT_JUDGED_MARK : 0;
    this.#fenceTimeoutS = fenceTimeoutSeconds(checkMs / 1000);
    // From the cache's first list on, apart from the queue; unsubscribed by the drain.
    this.#unreadable = new UnreadablePolicies(o.kube.networkPolicies, this.#log);
    this.#unsubscribe.push(() => this.#unreadable.close());
    this.#retryInitialMs = o.retry?.initialMs ?? 1_000;
    this.#retryMaxMs = o.retry?.maxMs ?? 30_000;
    const failed = (place: LoadPlace, netns: string | null, err: unknown) =>
      this.#failed(place, netns, err);
    const compile = (att: Att, members = true) => this.#compile(att, members);
    this.#loads = new TableLoads(o.devices, failed);
    this.#node = new NodeTable({
      loads: this.#loads,
      log: this.#log,
      dropLog: this.#dropLog,
      atts: () => this.#atts.values(),
      compile,
      peerSet: (key) => this.#engine!.peerSet(key),
      nodeAddresses: () => this.#nodeAddrs,
      judgedMark: this.#judgedMark || undefined,
      // The update of a table that is gone fails (its guard set is missing): a repair.
      updateFailed: () =>
        this.#devices.listTable(null, `inet ${POLICY_TABLE}`).then((listing) => {
          if (listing !== null) return;
          this.#nodeMark = null;
          this.#node.unclean = true;
          this.#repaired("node", null, "missing");
        }, () => {}),
    });
    this.#podTables = {
      devices: o.devices,
      loads: this.#loads,
      dropLog: this.#dropLog,
      guard: this.#rawGuard.on,
      has: (key) => this.#atts.has(key),
      synced: () => this.#engine !== null,
      compile,
      failed,
    };
    this.#queue = new SerialQueue({
      retryInitialMs: this.#retryInitialMs,
      retryMaxMs: this.#retryMaxMs,
      onError: (err, a) =>
        this.#log.error("NetworkPolicy: compiling every local pod again failed; trying again", {
          attempt: a.attempt,
          retryInMs: a.retryInMs,
          error: userMessage(err),
        }),
    });
    const everyMs = o.nodeAddressesEveryMs ?? 60_000;
    this.#life = new PolicyLifecycle({
      nodeAddresses: async (signal) => {
        const addrs = await listNodeAddresses(this.#devices, this.#log, signal);
        if (addrs) this.#nodeAddrs = addrs;
      },
      sync: async (signal) => {
        await waitForCaches(this.#kube, this.#log, signal);
        if (!signal.aborted) await this.#notOlderThanBefore(signal);
      },
      takeOver: () => this.#takeOver(),
      run: (signal) => {
        this.#watchNodeAddresses(everyMs, signal);
        if (checkMs > 0) this.#watchTables(checkMs, signal);
      },
      drain: () => this.#drain(),
    }, { log: this.#log });
  }

  /** Whether the caches have synced and the enforcer has taken over. */
  get synced(): boolean {
    return this.#engine !== null;
  }

  /** The enforcer's phase (lifecycle.ts). */
  get phase(): PolicyPhase {
    return this.#life.phase;
  }

  /** Waits until the enforcer has taken over (tests, the bench); false after `timeoutMs`. */
  waitSynced(timeoutMs: number): Promise<boolean> {
    return this.#life.served(timeoutMs);
  }

  /**
   * Resolves true once nothing is queued, no event waits, no load runs and no table waits
   * for a retry; false after `timeoutMs` (tests: what the enforcer knows is then loaded).
   */
  async idle(timeoutMs: number): Promise<boolean> {
    const until = performance.now() + timeoutMs;
    while (performance.now() < until) {
      await this.#queue.idle();
      await this.#loads.idle();
      await this.#lastFlush;
      await this.#confirming;
      if (
        this.#events.length === 0 && !this.#deferred && !this.#scheduled && !this.#recovering &&
        this.#queue.pending === 0 && !this.#anyStale() && !this.#confirming
      ) return true;
      await sleep(5);
    }
    return false;
  }

  // ---- start-up and stop (the phases are lifecycle.ts's) ----

  /**
   * The take-over, in one turn: the compiler indexes what the caches hold, the enforcer
   * subscribes to their changes, and the first render is queued: every attachment the
   * manager handed over is registered, and every table rendered (the node's whole, with
   * each local pod's chains). Resolves once that render has settled.
   */
  #takeOver(): Promise<void> {
    const t0 = performance.now();
    const engine = new PolicyEngine({
      pods: () => this.#kube.pods.values(),
      namespaces: () => this.#kube.namespaces.values(),
      networkPolicies: () => this.#kube.networkPolicies.values(),
    }, { nodeAddresses: this.#nodeAddrs });
    const on = (resource: PolicyEvent["resource"]) => (old: unknown, cur: unknown) => {
      this.#events.push({ resource, old, cur, at: performance.now() } as PolicyEvent);
      this.#schedule();
    };
    this.#unsubscribe.push(
      this.#kube.pods.subscribe(on("pods"), { replay: false }),
      this.#kube.namespaces.subscribe(on("namespaces"), { replay: false }),
      this.#kube.networkPolicies.subscribe(on("networkpolicies"), { replay: false }),
    );
    this.#engine = engine;
    this.#cachesEnforced(0);
    this.#log.info("NetworkPolicy: the caches have synced; enforcing", {
      pods: this.#kube.pods.size,
      namespaces: this.#kube.namespaces.size,
      networkPolicies: this.#kube.networkPolicies.size,
      localPods: this.#atts.size,
      indexMs: Math.round(performance.now() - t0),
    });
    return this.#run(() => {
      const ch = new Changes();
      ch.node = true;
      for (const att of this.#atts.values()) this.#register(att, ch);
      return { done: this.#flush(ch).all };
    }).then((r) => r.done);
  }

  /** The resourceVersions put in place, kept for the next take-over (`#notOlderThanBefore`). */
  #keepVersions(): void {
    if (!this.#memory) return;
    try {
      const kept = this.#memory.resourceVersions();
      for (const [resource, { rv }] of this.#enforcedRv) {
        const was = kept.get(resource);
        if (was !== rv && !olderVersion(rv, was ?? null)) {
          this.#memory.saveResourceVersion(resource, rv);
        }
      }
    } catch (err) {
      this.#log.warn("NetworkPolicy: cannot keep the resourceVersions put in place", {
        error: userMessage(err),
      });
    }
  }

  /** The caches' resourceVersions count as enforced once flush `flush` has settled. */
  #cachesEnforced(flush: number): void {
    for (const s of this.#kube.stats()) {
      if (s.resourceVersion) this.#enforcedRv.set(s.resource, { rv: s.resourceVersion, flush });
    }
  }

  /**
   * A take-over never puts in place an older state than the one it replaces: a cache
   * whose first list (`resourceVersion=0`, which a lagging watch cache of an HA API
   * server may answer from the past: kubernetes/kubernetes#59848) is older than the
   * resourceVersion an earlier agent put in place (`_memory.ts`) lists again from the
   * latest (a quorum read). Once: a quorum read older still is the cluster's truth (an
   * etcd restored from a backup), taken with a warning.
   */
  async #notOlderThanBefore(signal: AbortSignal): Promise<void> {
    const floors = this.#memory?.resourceVersions();
    if (!floors || floors.size === 0) return;
    const caches = [this.#kube.pods, this.#kube.namespaces, this.#kube.networkPolicies];
    await Promise.all(caches.map(async (c) => {
      const floor = floors.get(c.kind.resource);
      const rv = c.stats().resourceVersion;
      if (!floor || !olderVersion(rv, floor)) return;
      this.#log.warn(
        "NetworkPolicy: the cache's first list is older than what the agent before put in place; listing again from the latest",
        { resource: c.kind.resource, listed: rv, enforced: floor },
      );
      await c.relistLatest();
      const again = c.stats().resourceVersion;
      if (!signal.aborted && olderVersion(again, floor)) {
        this.#log.warn(
          "NetworkPolicy: the latest state is older than what the agent before put in place (an API server restored from a backup?); enforcing it",
          { resource: c.kind.resource, listed: again, enforced: floor },
        );
      }
    }));
  }

  #watchNodeAddresses(everyMs: number, signal: AbortSignal): void {
    const tick = async () => {
      if (signal.aborted) return;
      let now: string[] | null = null;
      try {
        now = (await this.#devices.nodeAddresses()).addresses;
      } catch (err) {
        this.#log.warn("Cannot list the node's addresses", { error: userMessage(err) });
      }
      if (now) await this.#run(() => this.#nodeAddressesAre(now)).catch(() => {});
      if (!signal.aborted) timer = setTimeout(tick, everyMs);
    };
    let timer = setTimeout(tick, everyMs);
    signal.addEventListener("abort", () => clearTimeout(timer), { once: true });
  }

  #nodeAddressesAre(addresses: string[]): void {
    if (!this.#engine || sameSet(addresses, this.#nodeAddrs)) return;
    this.#log.info("NetworkPolicy: the node's addresses changed", {
      was: this.#nodeAddrs,
      now: addresses,
    });
    this.#nodeAddrs = [...addresses];
    const ch = this.#takeEvents();
    ch.add(this.#engine.setNodeAddresses(addresses));
    ch.node = true;
    this.#flush(ch);
  }

  /** Checks the tables every `everyMs` (after each pass ends) until `signal`. */
  #watchTables(everyMs: number, signal: AbortSignal): void {
    let timer: ReturnType<typeof setTimeout>;
    const tick = async () => {
      if (signal.aborted) return;
      await this.checkTables().catch((err) =>
        this.#log.warn("NetworkPolicy: cannot check the policy tables", {
          error: userMessage(err),
        })
      );
      await this.#armFence();
      if (!signal.aborted) timer = setTimeout(tick, everyMs);
    };
    timer = setTimeout(tick, everyMs);
    signal.addEventListener("abort", () => clearTimeout(timer), { once: true });
  }

  /**
   * One pass of the table check (`netns/table_check.ts`): the node's table and the next
   * {@linkcode PODS_PER_CHECK} pods' (every pod's with `all`), each queued after its
   * table's loads. A table missing, or changed while no load of it ran, is rendered whole
   * again (queued now), counted and logged. Resolves with how many were found so.
   */
  async checkTables(o: { all?: boolean } = {}): Promise<number> {
    if (!this.#engine || this.#life.stopping) return 0;
    const pods = [...this.#atts.values()].filter((a) =>
      a.registered && a.netns !== null && !a.noTable && a.loaded !== null
    );
    let turn = pods;
    if (!o.all && pods.length > PODS_PER_CHECK) {
      const from = this.#checkCursor % pods.length;
      turn = [...pods, ...pods].slice(from, from + PODS_PER_CHECK);
      this.#checkCursor = from + PODS_PER_CHECK;
    }
    const found = await Promise.all([
      this.#checkNode(),
      ...turn.map((a) => this.#checkPod(a)),
    ]);
    const n = found.filter((f) => f !== "ok").length;
    if (n > 0) this.#schedule();
    return n;
  }

  /**
   * Checks the node's table (see {@linkcode checkTables}); a check queued or running is
   * joined, never queued twice (`GET /v1/status` may be asked often: checks piled up in a
   * table's queue would hold its loads back).
   */
  #checkNode(): Promise<TableFinding> {
    this.#nodeCheck ??= this.#checkNodeNow().finally(() => this.#nodeCheck = null);
    return this.#nodeCheck;
  }

  #checkNodeNow(): Promise<TableFinding> {
    let finding: TableFinding = "ok";
    return this.#loads.enqueue(
      null,
      async () => {
        // Nothing loaded yet, or a whole render due anyway.
        if (this.#node.loaded === null || this.#node.stale) return true;
        const listing = await this.#devices.listTable(null, `inet ${POLICY_TABLE}`);
        const r = judgeTable(listing, this.#nodeMark, this.#loads.runs(null));
        this.#nodeMark = r.mark;
        finding = r.finding;
        if (finding !== "ok") {
          this.#node.loaded = null;
          this.#node.unclean = true;
          this.#node.stale = true;
          this.#node.broken = true;
          this.#repaired("node", null, finding);
        }
        return true;
      },
      false,
      false,
      true,
    ).then(() => finding);
  }

  /** Checks a pod's table (see {@linkcode checkTables}); one queued or running is joined. */
  #checkPod(att: Att): Promise<TableFinding> {
    att.checking ??= this.#checkPodNow(att).finally(() => att.checking = undefined);
    return att.checking;
  }

  #checkPodNow(att: Att): Promise<TableFinding> {
    const netns = att.netns!;
    let finding: TableFinding = "ok";
    return this.#loads.enqueue(
      netns,
      () =>
        this.#loads.podLoads.run(async () => {
          if (!this.#atts.has(att.key) || att.stale || att.loaded === null || att.noTable) {
            return true;
          }
          let listing: string | null;
          try {
            listing = await this.#devices.listTable(netns, `inet ${POLICY_TABLE}`);
          } catch {
            return true; // a namespace going away
          }
          const r = judgeTable(listing, att.checked ?? null, this.#loads.runs(netns));
          att.checked = r.mark;
          finding = r.finding;
          if (finding !== "ok") {
            att.loaded = null;
            att.stale = true;
            att.broken = true;
            this.#repaired("pod", netns, finding);
            return true;
          }
          // The raw-socket guard's two tables, where it drops: there, or loaded again.
          if (this.#podTables.guard && att.guard === true) {
            const gone: string[] = [];
            for (const family of ["netdev", "inet"]) {
              const t = `${family} ${GUARD_TABLE}`;
              if ((await this.#devices.listTable(netns, t).catch(() => "")) === null) {
                gone.push(t);
              }
            }
            if (gone.length > 0) {
              att.guard = undefined;
              att.stale = true;
              att.broken = true;
              finding = "missing";
              this.#repaired("pod", netns, finding, gone.join(", "));
            }
          }
          return true;
        }),
      false,
      false,
      true,
    ).then(() => finding);
  }

  /**
   * Writes the fence again (`policy/fence.ts`), armed for its timeout: once this agent's
   * node table (which stamps what it judged) has loaded, and at every check after, even
   * while that table is found missing (the fence is what holds then).
   */
  async #armFence(): Promise<void> {
    if (!this.#judgedMark || !this.#engine || this.#life.stopping) return;
    if (!this.#fenced && (this.#node.renders === 0 || this.#node.loaded === null)) return;
    try {
      await this.#devices.loadRuleset(
        null,
        fenceRuleset({ mark: this.#judgedMark, timeoutSeconds: this.#fenceTimeoutS }),
      );
      if (!this.#fenced) {
        this.#log.info("NetworkPolicy: the fence is up", {
          table: `inet ${FENCE_TABLE}`,
          judgedMark: `0x${this.#judgedMark.toString(16)}`,
          timeoutSeconds: this.#fenceTimeoutS,
        });
      }
      this.#fenced = true;
    } catch (err) {
      this.#log.warn("NetworkPolicy: cannot write the fence", { error: userMessage(err) });
    }
  }

  /** Takes the fence away (a stopping agent: whatever runs next may stamp nothing). */
  async #takeFenceAway(): Promise<void> {
    if (!this.#fenced) return;
    try {
      await this.#devices.loadRuleset(null, fenceRemoval());
      this.#fenced = false;
    } catch (err) {
      this.#log.warn("NetworkPolicy: cannot take the fence away; it disarms by itself", {
        error: userMessage(err),
        afterSeconds: this.#fenceTimeoutS,
      });
    }
  }

  #repaired(
    place: "pod" | "node",
    netns: string | null,
    finding: TableFinding,
    table = `inet ${POLICY_TABLE}`,
  ): void {
    this.#repairs++;
    this.#metrics?.tableRepaired?.("policy", place);
    this.#log.warn(
      finding === "missing"
        ? "NetworkPolicy: a policy table is missing; loading it again"
        : "NetworkPolicy: a policy table is not what this agent loaded; loading it again",
      { place, table, finding, ...(netns ? { netns } : {}) },
    );
  }

  /** The lifecycle's drain: no more events, the caches closed, the queue and loads done. */
  async #drain(): Promise<void> {
    clearTimeout(this.#retryTimer);
    this.#retryTimer = undefined;
    for (const u of this.#unsubscribe.splice(0)) u();
    // Closing the caches ends the start-up's wait for their sync.
    await this.#kube.close();
    await this.#queue.stop();
    await this.#loads.idle();
    // It writes the state database: done before the agent closes it.
    await this.#confirming;
    await this.#loads.idle();
    await this.#takeFenceAway();
  }

  // ---- the queue ----

  /**
   * Runs `fn` after everything queued before it (the one place the engine and tables
   * change); with `first`, before everything queued but not started yet (an ADD waits for
   * the task running, never for the pods' edits queued behind it: a queued drain finds
   * its events taken by then, and applies what is left). A task that fails, but for an
   * {@linkcode ApiError} of its own, may have left the compiler half changed and its
   * changes unloaded: the recovery is queued (`#taskFailed`). Once stopping, tasks are
   * refused as `busy`.
   */
  #run<T>(fn: () => T, o: { first?: boolean } = {}): Promise<T> {
    return this.#queue.run(fn, o).catch((err) => {
      if (err instanceof QueueStoppedError) {
        throw new ApiError("busy", "The agent is shutting down");
      }
      if (!(err instanceof ApiError)) this.#taskFailed(err);
      throw err;
    });
  }

  /**
   * A task failed half way: what it changed in the compiler may be partly applied, and
   * what it took from the events (and an ADD's deferred edits) is not loaded. The
   * recovery, queued with a backoff until it succeeds, compiles everything again from the
   * caches and renders every table whole; meanwhile every table keeps what it holds.
   */
  #taskFailed(err: unknown): void {
    this.#log.error(
      "NetworkPolicy: applying a change failed; compiling every local pod again and rendering every table",
      {
        error: userMessage(err),
        ...(err instanceof Error && err.stack ? { stack: err.stack } : {}),
      },
    );
    for (const att of this.#atts.values()) if (att.registered) att.stale = true;
    if (this.#recovering || this.#queue.stopped) return;
    this.#recovering = true;
    this.#queue.retry(() => this.#recover(), { name: "recover" }).catch(() => {});
  }

  /** The recovery (`#taskFailed`): the compiler rebuilt from the caches, every table whole. */
  #recover(): void {
    const engine = this.#engine;
    if (!engine) return;
    // The caches hold every event delivered so far: the rebuild reads them all.
    this.#events.splice(0);
    this.#scheduled = false;
    this.#deferred = null;
    const ch = new Changes();
    ch.add(engine.resync({
      pods: () => this.#kube.pods.values(),
      namespaces: () => this.#kube.namespaces.values(),
      networkPolicies: () => this.#kube.networkPolicies.values(),
    }));
    ch.node = true;
    for (const att of this.#atts.values()) {
      if (att.registered) {
        att.stale = true;
        ch.changed.add(att.pod);
      } else this.#register(att, ch);
    }
    for (const st of this.#kube.stats()) {
      if (st.resourceVersion) ch.rvs.set(st.resource, st.resourceVersion);
    }
    this.#flush(ch);
    this.#recovering = false;
    this.#log.info("NetworkPolicy: every local pod compiled again; rendering every table");
  }

  #schedule(): void {
    if (this.#scheduled || this.#queue.stopped) return;
    this.#scheduled = true;
    this.#run(() => this.#drainEvents()).catch(() => {});
  }

  #drainEvents(): void {
    const ch = this.#takeEvents();
    if (ch.arrived.length > 0 || ch.deltas.length > 0 || ch.changed.size > 0 || this.#anyStale()) {
      this.#flush(ch);
    }
  }

  /** Applies every pending event to the engine; what they changed. */
  #takeEvents(): Changes {
    this.#scheduled = false;
    const ch = this.#deferred ?? new Changes();
    // The node's table was rendered whole since: the deferred deltas are in it.
    if (this.#deferred && this.#deferred.nodeRenders !== this.#node.renders) {
      ch.nodeDeltasFrom = ch.deltas.length;
    }
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
        // The compiler may be half changed: the recovery rebuilds it from the caches.
        this.#log.error("NetworkPolicy: a cache event could not be compiled", {
          resource: ev.resource,
          object: `${obj.metadata.namespace ?? ""}/${obj.metadata.name}`,
          error: userMessage(err),
        });
        this.#taskFailed(err);
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
      const r = engine.addLocal(localOf(att, newest.ips, newest.uid));
      ch.add(r);
      ch.changed.add(att.pod);
      // Its chains were kept as they were: the node's table is rendered whole, with the
      // new ones or (no policy isolating it now) without.
      if (att.unknown) ch.node = true;
      att.compiled = light(r.compiled);
      att.registered = true;
      att.unknown = false;
      att.stale = true;
    } catch (err) {
      if (!(err instanceof PodNotFoundError)) throw err;
      const was = att.unknown;
      att.unknown = true;
      // Nothing to render: its tables stay as they are until it comes back.
      att.stale = false;
      // Once: each event of another pod of that name (another uid) tries again.
      if (!was) {
        this.#log.warn(
          "NetworkPolicy: a pod of this node is not in the cluster; its rules stay as they are",
          { pod: att.pod, key: att.key, error: userMessage(err) },
        );
      }
    }
  }

  #newestOf(pod: string): Att | undefined {
    return newestOf(this.#atts.values(), pod);
  }

  #anyStale(): boolean {
    return this.#node.stale || [...this.#atts.values()].some((a) => a.stale && a.netns !== null);
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
      if (full) loads.push(renderPod(this.#podTables, att));
      else if (mine.length > 0) loads.push(editPod(this.#podTables, att, mine));
      // The connections its table admitted as an address's old pod's go, after its loads.
      const gone = retiredIn(ch, full ? null : mine);
      if (gone.length > 0 && !att.noTable) loads.push(this.#forget(att.netns, gone, true));
    }
    // With `deferPods` the node's set edits wait too (the node's update then holds only
    // the new pod's chains and the sets new to the node): the deferred flush applies them.
    const node = ch.node || this.#node.needsWhole
      ? this.#node.render()
      : this.#node.update(ch, !o.deferPods);
    if (!o.deferPods && ch.retired.size > 0) {
      loads.push(this.#forget(null, [...ch.retired], true));
    }
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
      d.nodeRenders = this.#node.renders;
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
      this.#keepVersions();
      this.#afterFlush();
      if (!this.#anyStale()) this.#confirmOwners();
    });
    this.#lastFlush = all.catch(() => {});
    return { node, all };
  }
  #afterFlush(): void {
    if (!this.#anyStale()) {
      this.#retryMs = 0;
      return;
    }
    if (this.#retryTimer !== undefined || this.#queue.stopped) return;
    this.#retryMs = Math.min(
      this.#retryMaxMs,
      this.#retryMs ? this.#retryMs * 2 : this.#retryInitialMs,
    );
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined;
      this.#schedule();
    }, this.#retryMs);
  }

  /**
   * Deletes the connections tracked for `addresses` in a table's namespace (null: the
   * node), queued after its loads (so its sets no longer admit them as their old pod's),
   * never superseded by a whole render: they were that pod's. A failure is logged (new
   * connections are denied all the same). A pod's namespace (`listedOnly`) runs
   * `conntrack` only for what it tracks: a DEL retires the pod's addresses in every local
   * pod whose sets held them, and most never talked to it (a `conntrack -D` per address and
   * direction in each took 10 processes a namespace, and most of the CPU of a back-to-back
   * ADD on a node of 50 such pods: `bench/compare.ts`); the node's, which may track many,
   * is searched with grep (netns/mod.ts).
   */
  #forget(netns: string | null, addresses: string[], listedOnly = false): Promise<boolean> {
    return this.#loads.enqueue(
      netns,
      () =>
        this.#devices.flushConntrack(netns, addresses, { listedOnly }).then(() => true, (err) => {
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

  /**
   * Once every table holds what the engine says (no table stale), the pods the rules know
   * each address as are compared with what was last confirmed (kept across a restart:
   * `_memory.ts`): the tracked connections of every address whose pod changed, or that no
   * pod has now, are deleted in every local pod's namespace and on the node (queued after
   * each table's loads), and only then is the new state written. So a take-over, a load
   * that failed and was made again, or one a SIGKILL interrupted, leaves no connection
   * tracked as the address's earlier pod's (issue 48, point 3). One at a time; a request
   * while one runs runs once more after it.
   */
  #confirmOwners(): void {
    if (!this.#memory || !this.#engine || this.#queue.stopped) return;
    if (this.#confirming) {
      this.#confirmAgain = true;
      return;
    }
    this.#confirming = this.#confirmOwnersNow().catch((err) =>
      this.#log.warn("NetworkPolicy: cannot confirm the pods of the addresses the rules know", {
        error: userMessage(err),
      })
    ).finally(() => {
      this.#confirming = null;
      if (this.#confirmAgain) {
        this.#confirmAgain = false;
        this.#confirmOwners();
      }
    });
  }

  async #confirmOwnersNow(): Promise<void> {
    const engine = this.#engine!, memory = this.#memory!;
    const was = this.#owners ??= memory.owners();
    const now = new Map(engine.addressOwners());
    const gone: string[] = [];
    for (const [a, o] of was) if (now.get(a) !== o) gone.push(a);
    if (gone.length > 0) {
      const atts = [...this.#atts.values()].filter((a) => a.netns !== null && !a.noTable);
      const node = this.#forget(null, gone);
      const pods = atts.map((a) => this.#forget(a.netns, gone, true).then((ok) => ({ a, ok })));
      const done = await Promise.all(pods);
      // A pod's attachment gone meanwhile took its connections with it.
      if (!(await node) || done.some((d) => !d.ok && this.#atts.has(d.a.key))) return;
      this.#log.info(
        "NetworkPolicy: deleted the tracked connections of addresses whose pod changed since the rules last loaded",
        { addresses: gone.length, sample: gone.slice(0, 8) },
      );
    }
    const set: [string, string][] = [];
    for (const [a, o] of now) if (was.get(a) !== o) set.push([a, o]);
    const del = [...was.keys()].filter((a) => !now.has(a));
    memory.saveOwners(set, del);
    this.#owners = now;
  }

  /** The pod's policy compiled now (its sets' current members); kept light as `att.compiled`. */
  #compile(att: Att, members = true): CompiledPolicy | null {
    const c = this.#engine?.compiled(att.namespace, att.name, { members });
    if (!c) return att.compiled;
    att.compiled = members ? light(c) : c;
    return c;
  }

  #failed(place: LoadPlace, netns: string | null, err: unknown): void {
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
    if (this.#life.serving) return null;
    const busy = () => new ApiError("busy", "The agent is shutting down");
    if (this.#life.stopping) return Promise.reject(busy());
    // As prepare: the caches' sync and the manager's hand-over of the node's pods.
    return this.#life.served(this.#syncWaitMs).then((served) => {
      if (!served) {
        throw this.#life.stopping ? busy() : new ApiError("policy_unavailable", NOT_SYNCED);
      }
    });
  }

  async prepare(p: PolicyPod): Promise<{ podRuleset: () => Promise<string> } | null> {
    const busy = () => new ApiError("busy", "The agent is shutting down");
    if (this.#life.stopping) throw busy();
    if (!(await this.#life.served(this.#syncWaitMs))) {
      throw this.#life.stopping ? busy() : new ApiError("policy_unavailable", NOT_SYNCED);
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
    return await this.#run(() => {
      const engine = this.#engine!;
      // What came before this ADD (cache events, an earlier ADD's deferred edits) goes in
      // now, as any drain puts it; only this ADD's own edits wait for its answer.
      const before = this.#takeEvents();
      if (!before.empty) this.#flush(before);
      const ch = new Changes();
      try {
        if (fetched && !this.#kube.pods.get(p.pod)) ch.add(engine.upsertPod(fetched));
        if (p.nodeAddresses.length > 0 && !sameSet(p.nodeAddresses, this.#nodeAddrs)) {
          this.#nodeAddrs = [...p.nodeAddresses];
          ch.add(engine.setNodeAddresses(p.nodeAddresses));
          // The node's own set holds them: its table is rendered whole.
          ch.node = true;
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
          r = engine.addLocal({ namespace, name, ips, ...(p.uid ? { uid: p.uid } : {}) });
        } catch (err) {
          if (!(err instanceof PodNotFoundError)) throw err;
          throw new ApiError(
            "policy_unavailable",
            `NetworkPolicy: the pod "${p.pod}" is not in the agent's cache yet; the runtime retries`,
          );
        }
        if (isolates(r.compiled)) {
          try {
            this.#checkRaw(p.pod, fetched ?? this.#kube.pods.get(p.pod));
          } catch (err) {
            // Refused: the engine forgets this attachment's addresses (the pod's other
            // attachment, an older sandbox's, gives the pod its own again).
            ch.add(r);
            const other = newestOf(this.#atts.values(), p.pod);
            ch.add(
              other
                ? engine.addLocal(localOf(other, other.ips, other.uid))
                : engine.removeLocal(namespace, name),
            );
            throw err;
          }
        }
        this.#atts.set(p.key, att);
        att.registered = true;
        att.compiled = light(r.compiled);
        // A pod no policy selects gets no table (see `isolates`).
        att.noTable = !isolates(r.compiled);
        att.loaded = att.noTable ? null : att.compiled;
        ch.add(r);
        // Its other attachments (an older sandbox's) render again, their node chains too
        // (the pod's addresses are this one's now); this one rides the plug.
        let others = false;
        for (const other of this.#atts.values()) {
          if (other.pod === p.pod && other !== att) {
            other.stale = true;
            other.compiled = att.compiled;
            others = true;
          }
        }
        if (!others) ch.changed.delete(p.pod);
        const text = att.noTable
          ? ""
          : podRuleset(r.compiled, { eni: p.eniIfName, log: this.#dropLog });
        // An address this pod takes from another (an object the API still shows with it,
        // after a restart forgot its DEL) leaves that one's sets before the ADD answers:
        // only what admits more waits for the answer.
        const restricts = ch.retired.size > 0;
        const flushed = this.#flush(ch, { deferPods: !restricts });
        att.nodeReady = restricts ? flushed.all.then(() => flushed.node) : flushed.node;
        return text;
      } catch (err) {
        // What this ADD changed before it failed still goes in (a failure of that, too,
        // is the recovery's); the ADD fails with its own error.
        try {
          this.#flush(ch);
        } catch (again) {
          this.#taskFailed(again);
        }
        throw err;
      }
    }, { first: true });
  }

  async committed(key: string, netns: string): Promise<void> {
    const att = this.#atts.get(key);
    if (!att) return;
    att.netns = netns;
    if (!(await (att.nodeReady ?? Promise.resolve(true)))) {
      // One more try, now: the ADD answers only with the pod's node chains in place.
      const ok = await (await this.#run(() => ({ p: this.#node.render() }))).p;
      if (!ok) {
        throw new ApiError(
          "device_error",
          `NetworkPolicy: cannot load the node's rules for pod "${att.pod}" (see the agent's log)`,
        );
      }
    }
    if (att.stale) {
      await (await this.#run(() => ({ p: renderPod(this.#podTables, att) }))).p;
    }
    // The plug loaded its table; its raw-socket guard, before the ADD answers (queued
    // behind its table's loads, from what that table holds then).
    if (this.#podTables.guard && att.loaded !== null && !att.noTable) {
      const ok = await this.#loads.enqueue(netns, async () => {
        if (!this.#atts.has(key) || att.loaded === null) return true;
        try {
          await syncGuard(this.#podTables, att, netns, isolates(att.loaded));
          return true;
        } catch (err) {
          this.#failed("pod", netns, err);
          return false;
        }
      });
      if (!ok) {
        throw new ApiError(
          "device_error",
          `NetworkPolicy: cannot load the raw-socket guard of pod "${att.pod}" (see the agent's log)`,
        );
      }
    }
    // The other pods' and the node's edits that prepare left for after the answer: a
    // little later, once the ADD's answer is on its way and its plugin process has exited
    // (rendering them and starting their `nft` processes took the main thread and the
    // CPUs while both waited). They only admit more; the pod's containers start later.
    // (Stopping ends the wait, and `#schedule` then does nothing.)
    if (this.#deferred) {
      sleep(DEFERRED_EDITS_DELAY_MS, this.#life.signal).then(() => this.#schedule());
    }
  }

  async removed(key: string): Promise<void> {
    if (!this.#atts.has(key)) return;
    const done = await this.#run(() => {
      const att = this.#atts.get(key);
      if (!att) return undefined;
      this.#atts.delete(key);
      const engine = this.#engine;
      if (!engine) return undefined;
      const ch = this.#takeEvents();
      if (!att.registered) {
        // Its chains were kept as an earlier agent loaded them: the node's table is
        // rendered whole without them.
        ch.node = true;
      } else {
        const other = this.#newestOf(att.pod);
        if (!other) ch.add(engine.removeLocal(att.namespace, att.name));
        else if (att.seq > other.seq && other.registered && !sameSet(other.ips, att.ips)) {
          // It gave the pod its addresses; the newest attachment left gives them now.
          this.#readdress(att, other, ch);
        }
      }
      return { all: this.#flush(ch).all };
    });
    await done?.all;
  }

  /**
   * The pod's newest attachment went: the one left (`other`) gives the pod its addresses
   * now. A pod the cluster no longer has cannot be compiled again: the compiler forgets
   * it (its addresses leave every set) and its attachments keep their tables and node
   * chains as they are, as a restored pod the cluster does not have.
   */
  #readdress(gone: Att, other: Att, ch: Changes): void {
    const engine = this.#engine!;
    try {
      ch.add(engine.addLocal(localOf(gone, other.ips, other.uid)));
      ch.changed.add(gone.pod);
      return;
    } catch (err) {
      // Not in the cache, or only as another pod (another uid): nothing changed yet.
      if (!(err instanceof PodNotFoundError)) throw err;
    }
    ch.add(engine.removeLocal(gone.namespace, gone.name));
    // Their chains are no longer this agent's to render: once they go, the table is made
    // again clean.
    this.#node.unclean = true;
    for (const a of this.#atts.values()) {
      if (a.pod !== gone.pod) continue;
      a.registered = false;
      a.unknown = true;
      a.stale = false;
    }
    this.#log.warn(
      "NetworkPolicy: a pod of this node is not in the cluster; its rules stay as they are",
      { pod: gone.pod, key: other.key },
    );
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
        nodeChains: true,
      };
      this.#atts.set(p.key, att);
      if (this.#engine) {
        this.#run(() => {
          const ch = this.#takeEvents();
          this.#register(att, ch);
          this.#flush(ch);
        }).catch(() => {});
      }
    }
    // The first call hands over the node's pods: the take-over may begin (lifecycle.ts).
    this.#life.restored();
  }

  reuseWait(addresses: string[], signal: AbortSignal): Promise<void> | null {
    if (this.#life.stopping || signal.aborted) return null;
    this.#reuse ??= new ReuseWaits(this.#kube.pods);
    return this.#reuse.wait(addresses, {
      boundMs: this.#reuseWaitMs,
      signal: AbortSignal.any([signal, this.#life.signal]),
      log: this.#log,
    });
  }

  // ---- what operators see ----

  /** The enforcer's state for `GET /v1/status`. */
  status(): PolicyStatus {
    return policyStatus({
      synced: this.#engine !== null,
      pendingEvents: this.#events.length + (this.#deferred ? 1 : 0),
      loadFailures: this.#loadFailures,
      caches: this.#kube.stats(),
      enforcedRv: (resource) => this.#enforcedRv.get(resource)?.rv ?? null,
      atts: this.#atts.values(),
      unreadable: this.#unreadable.list(),
      bypass: (pod, c) => this.bypass(pod, c),
      rawSocketGuard: this.#rawGuard,
      nodeStale: this.#node.stale || this.#node.broken,
    });
  }

  /** A local pod's effective policy (null: no attachment of it here, or not compiled yet). */
  view(pod: string): PodPolicyView | null {
    const att = this.#newestOf(pod);
    if (!att || !this.#engine || !att.registered) return null;
    const c = this.#engine.compiled(att.namespace, att.name);
    if (!c) return null;
    return {
      ...policyView(c),
      rawSocketGuard: isolates(c) && this.#rawGuard.on,
      bypass: this.bypass(att.pod, c),
    };
  }

  /**
   * Why a local pod can reach past its policy (null: it cannot, or no policy isolates
   * it): the capabilities its spec gives it, against the node's raw-socket guard.
   */
  bypass(
    pod: string,
    c: CompiledPolicy | null = this.#newestOf(pod)?.compiled ?? null,
  ): string | null {
    if (!c || !isolates(c)) return null;
    return bypassOf(this.#kube.pods.get(pod)?.netCaps, this.#runtimeCaps, this.#rawGuard.on);
  }

  /** The node's raw-socket guard, as probed at start. */
  rawGuard(): RawGuardState {
    return this.#rawGuard;
  }

  /**
   * ADD of a pod a policy isolates: refused (`rawCapablePods: refuse`) or flagged in the
   * log (once per pod) when its capabilities reach past its policy.
   */
  #checkRaw(pod: string, spec: Pod | undefined): void {
    const why = bypassOf(spec?.netCaps, this.#runtimeCaps, this.#rawGuard.on);
    if (why === null) return;
    if (this.#rawCapablePods === "refuse") {
      throw new ApiError(
        "policy_unenforceable",
        `NetworkPolicy cannot be enforced for pod "${pod}": ${why}; the pod is not started (drop NET_RAW and NET_ADMIN from its containers' securityContext, or set networkPolicy.rawCapablePods to flag)`,
      );
    }
    if (this.#flagged.has(pod)) return;
    this.#flagged.add(pod);
    this.#log.warn("NetworkPolicy: a pod a policy isolates can reach past it", { pod, why });
  }

  /** The compiled policy of a local pod (tests and the bench). */
  compiled(pod: string): CompiledPolicy | undefined {
    const att = this.#newestOf(pod);
    return att && this.#engine?.compiled(att.namespace, att.name);
  }

  /** Per pod and direction, how many rules its policy has (metrics). */
  ruleCounts(): { pod: string; direction: "ingress" | "egress"; rules: number }[] {
    return ruleCounts(this.#atts.values());
  }

  /**
   * The drop counters of every local pod, in its namespace and at its node end (read at
   * most every 10 s: a spawn per pod).
   */
  drops(): Promise<PolicyDrops[]> {
    const now = performance.now();
    if (!this.#drops || now - this.#drops.at > DROPS_TTL_MS) {
      this.#drops = {
        at: now,
        value: readDrops(this.#devices, this.#loads, [...this.#atts.values()]),
      };
    }
    return this.#drops.value;
  }

  /** Stops the caches and the queue (the kernel keeps every table). */
  async close(): Promise<void> {
    await this.#life.stop();
  }
}

/**
 * Whether resourceVersion `rv` is older than `than`. resourceVersions are opaque to
 * clients, but kube-apiserver's are etcd's revisions, which only grow: compared as
 * numbers when both are; anything else is never older (null `than`: nothing to compare).
 */
export function olderVersion(rv: string | null, than: string | null): boolean {
  if (rv === null || than === null || !/^\d{1,30}$/.test(rv) || !/^\d{1,30}$/.test(than)) {
    return false;
  }
  return BigInt(rv) < BigInt(than);
}
