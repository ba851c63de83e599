/**
 * The agent's Prometheus metrics (served at `GET /metrics`), on the small
 * in-house client of `prometheus.ts` (prom-client's exposition format, without
 * the ~3 MB of Node modules prom-client loads). Only the agent loads it (never
 * the plugin).
 *
 * Per-phase timing: every ADD/DEL/GC records the time it spent in each phase
 * (queue wait, provider, device lookup, move, configure, state write) in
 * `enim_phase_duration_seconds`, so operators and the next optimisation can see
 * where the time goes.
 *
 * Why one file: every metric the agent serves is declared here, on one registry, and the
 * pool gauges share one read of the pool per scrape; the list is what an operator reads
 * to learn the names.
 *
 * @module
 */
import { Counter, Gauge, Histogram, Registry } from "./prometheus.ts";
import { VERSION } from "./version.ts";

/** Phases of an operation. */
export type Phase =
  | "queue_wait"
  | "del_wait"
  | "netns_check"
  | "provider"
  | "device_lookup"
  | "move"
  | "configure"
  | "shape"
  | "unplug"
  | "inspect"
  | "policy_sync"
  | "policy"
  | "policy_commit"
  | "reuse_wait"
  | "state_write";

/**
 * What the manager records per operation; {@linkcode Metrics} implements it, and
 * the manager needs only this (so it never loads the metrics themselves).
 */
export interface PhaseRecorder {
  /** Records one phase's duration of `op`. */
  phase(op: string, phase: Phase, ms: number): void;
  /** Records a finished operation. */
  operation(op: string, result: string, ms: number): void;
  /** Records one ENI a GC pass reclaimed (or failed to). */
  gcReclaim(result: string): void;
  /** Records a sticky pod's hold that expired (its ENI went back to the pool). */
  holdExpired?(profile: string): void;
  /** Records a table of enim's found missing or changed and loaded again. */
  tableRepaired?(table: "policy" | "host_link", place: "pod" | "node"): void;
  /**
   * Records a state write that failed after its DEL had answered the runtime (which,
   * told success, never retries it): the manager tries it again.
   */
  answeredDelStateFailed?(): void;
}

/** One profile's pool counts. */
export interface ProfileCounts {
  free: number;
  owned: number;
  recycling: number;
  held: number;
}

/** Pool counts for the gauges, read at scrape time. */
export interface PoolCounts {
  /** How many more ENIs the node can attach (shared by every profile). */
  attachable: number;
  profiles: Record<string, ProfileCounts>;
  /** Owned ENIs the cloud no longer has (deleted or detached out of band). */
  lost?: number;
  /** The provider's numeric status details (BCE: lost, quarantined, creating, …). */
  details?: Record<string, unknown>;
  /** Whether the agent is ready: reconciled and serving (what CNI STATUS reports). */
  ready?: boolean;
  /** Per profile: no free ENI of it and no room on the node to attach another. */
  exhausted?: Record<string, boolean>;
}

/** What the device plugin shows in the metrics, read at scrape time. */
export interface DevicePluginCounts {
  /** Whether kubelet has accepted the registration. */
  registered: boolean;
  healthy: number;
  /** Unhealthy devices by reason. */
  unhealthy: Partial<Record<typeof UNHEALTHY_REASONS[number], number>>;
}

/** What NetworkPolicy enforcement shows in the metrics, read at scrape time. */
export interface PolicyCounts {
  /** The caches have synced and the enforcer has taken over. */
  synced: boolean;
  /** Per cache (`pods`, `namespaces`, `networkpolicies`): watches restarted, lists after the first. */
  caches: { resource: string; watchRestarts: number; relists: number }[];
  /** Per local pod and direction: how many (peer, ports) rules its policy admits. */
  rules: { pod: string; direction: string; rules: number }[];
  /** Per local pod, direction and place (`pod`: its namespace, `node`: its node end): drops. */
  drops: { pod: string; direction: string; place: string; packets: number }[];
  /** The cluster's NetworkPolicies the agent cannot read (`namespace/name`; each fails closed). */
  unreadable?: string[];
  /** Local pods a policy isolates that can reach past it with their capabilities, and why. */
  unenforced?: { pod: string; why: string }[];
}

/** Why a device plugin device is Unhealthy (the label values of its gauge). */
export const UNHEALTHY_REASONS = [
  "foreign",
  "quarantined",
  "parking",
  "sticky_hold",
  "no_device",
  "provider_unreachable",
  "agent_not_ready",
] as const;

const LATENCY_BUCKETS = [
  0.0005,
  0.001,
  0.0025,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
];

/** The agent's metric set; one per agent (tests make their own). */
export class Metrics implements PhaseRecorder {
  readonly registry: Registry;
  readonly operationDuration: Histogram<"op" | "result">;
  readonly operations: Counter<"op" | "result">;
  readonly phaseDuration: Histogram<"op" | "phase">;
  readonly gcReclaims: Counter<"result">;
  readonly providerLatency: Histogram<"provider" | "call" | "result">;
  readonly holdExpiries: Counter<"profile">;
  readonly answeredDelStateFailures: Counter;
  readonly stickyZone: Counter<"event" | "profile">;
  readonly descriptions: Counter<"result">;
  readonly devicePluginRegistrations: Counter<"result">;
  readonly devicePluginLists: Counter;
  #devicePlugin: () => DevicePluginCounts | null = () => null;
  #pool: () => Promise<PoolCounts> | PoolCounts = () => ({ attachable: 0, profiles: {} });
  #policy: (() => Promise<PolicyCounts>) | null = null;
  #ipvs: (() => boolean) | null = null;
  readonly policyEnforcement: Histogram;
  readonly policyLoadFailures: Counter<"place">;
  readonly tableRepairs: Counter<"table" | "place">;

  /** `started`: when the agent started, epoch milliseconds. */
  constructor(started: number = Date.now()) {
    this.registry = new Registry();
    const registers = [this.registry];
    new Gauge({
      name: "enim_agent_up",
      help: "Whether the enim agent is serving",
      registers,
      collect() {
        this.set({}, 1);
      },
    });
    new Gauge<"version">({
      name: "enim_build_info",
      help: "The running agent's enim version (always 1)",
      labelNames: ["version"],
      registers,
      collect() {
        this.set({ version: VERSION }, 1);
      },
    });
    new Gauge({
      name: "enim_agent_start_time_seconds",
      help: "When the agent started, in Unix seconds",
      registers,
      collect() {
        this.set({}, Math.floor(started / 1000));
      },
    });
    this.operationDuration = new Histogram({
      name: "enim_operation_duration_seconds",
      help: "Time the agent spent on an API operation, by operation and result",
      labelNames: ["op", "result"],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.operations = new Counter({
      name: "enim_operations_total",
      help: "API operations, by operation and result",
      labelNames: ["op", "result"],
      registers,
    });
    this.phaseDuration = new Histogram({
      name: "enim_phase_duration_seconds",
      help:
        "Time spent in each phase of an operation (queue_wait, del_wait, netns_check, provider, device_lookup, move, configure, shape, unplug, inspect, policy_sync, policy, policy_commit, state_write)",
      labelNames: ["op", "phase"],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.gcReclaims = new Counter({
      name: "enim_gc_reclaims_total",
      help: "ENIs reclaimed by garbage collection, by result",
      labelNames: ["result"],
      registers,
    });
    this.providerLatency = new Histogram({
      name: "enim_provider_call_duration_seconds",
      help: "Latency of provider calls (the cloud API for bce), by call and result",
      labelNames: ["provider", "call", "result"],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    new Gauge({
      name: "enim_agent_memory_bytes",
      help: "The agent's memory: rss, heap_used, heap_total, external (Deno.memoryUsage)",
      labelNames: ["kind"],
      registers,
      collect() {
        const m = Deno.memoryUsage();
        this.set({ kind: "rss" }, m.rss);
        this.set({ kind: "heap_used" }, m.heapUsed);
        this.set({ kind: "heap_total" }, m.heapTotal);
        this.set({ kind: "external" }, m.external);
      },
    });
    this.holdExpiries = new Counter({
      name: "enim_sticky_hold_expiries_total",
      help: "Sticky pods' held ENIs freed because the pod did not come back in time, by profile",
      labelNames: ["profile"],
      registers,
    });
    this.answeredDelStateFailures = new Counter({
      name: "enim_del_state_write_failures_total",
      help:
        "State writes that failed after their DEL had answered the runtime early (the runtime will not retry it); the agent retries each until it is written",
      registers,
    });
    this.stickyZone = new Counter({
      name: "enim_sticky_zone_events_total",
      help:
        "Zone-wide sticky pods' ENIs: parked in the VPC by this node (park), claimed by it (claim), claims refused because another node has the ENI (claim_conflict), parked ENIs whose hold expired, deleted by this node (expiry); by profile",
      labelNames: ["event", "profile"],
      registers,
    });
    this.descriptions = new Counter({
      name: "enim_eni_descriptions_total",
      help: "ENI descriptions set or restored in the cloud (who owns the ENI), by result",
      labelNames: ["result"],
      registers,
    });
    // One read of the pool per scrape, shared by its gauges (a scrape collects them all at once).
    let reading: Promise<PoolCounts> | null = null;
    const pool = () => {
      reading ??= Promise.resolve(this.#pool()).finally(() => reading = null);
      return reading;
    };
    new Gauge({
      name: "enim_pool_enis",
      help:
        "ENIs on this node by profile and pool state (free, owned, recycling, held; owned counts recycling and held too)",
      labelNames: ["profile", "state"],
      registers,
      async collect() {
        const p = await pool();
        for (const [profile, counts] of Object.entries(p.profiles)) {
          for (const [state, n] of Object.entries(counts)) this.set({ profile, state }, n);
        }
      },
    });
    new Gauge({
      name: "enim_sticky_held_enis",
      help: "Sticky pods' ENIs held for them after their DEL, by profile",
      labelNames: ["profile"],
      registers,
      async collect() {
        const p = await pool();
        for (const [profile, counts] of Object.entries(p.profiles)) {
          this.set({ profile }, counts.held);
        }
      },
    });
    new Gauge({
      name: "enim_ready",
      help:
        "Whether the agent is ready: reconciled and serving (CNI STATUS answers 0; a full pool does not change it, see enim_pool_exhausted)",
      registers,
      async collect() {
        this.set({}, (await pool()).ready ? 1 : 0);
      },
    });
    new Gauge({
      name: "enim_pool_exhausted",
      help:
        "Whether a profile's pool is exhausted: no free ENI of it and no room on the node to attach another (new pods of it wait; the node stays Ready)",
      labelNames: ["profile"],
      registers,
      async collect() {
        for (const [profile, full] of Object.entries((await pool()).exhausted ?? {})) {
          this.set({ profile }, full ? 1 : 0);
        }
      },
    });
    new Gauge({
      name: "enim_lost_enis",
      help:
        "ENIs a pod owns that the cloud no longer has (deleted or detached out of band; should be 0)",
      registers,
      async collect() {
        this.set({}, (await pool()).lost ?? 0);
      },
    });
    new Gauge({
      name: "enim_provider_status",
      help:
        "The provider's own counters (BCE: quarantined stuck ENIs, lost, creating, releasing, cleanup, otherAttached, maxEnisPerNode), by field",
      labelNames: ["field"],
      registers,
      async collect() {
        for (const [field, v] of Object.entries((await pool()).details ?? {})) {
          if (typeof v === "number" && Number.isFinite(v)) this.set({ field }, v);
        }
      },
    });
    this.devicePluginRegistrations = new Counter({
      name: "enim_device_plugin_registrations_total",
      help: "Registrations of the enim.dev/eni device plugin with kubelet, by result (ok, failed)",
      labelNames: ["result"],
      registers,
    });
    this.devicePluginLists = new Counter({
      name: "enim_device_plugin_lists_sent_total",
      help: "Device lists sent to kubelet on ListAndWatch streams (one per change of the list)",
      registers,
    });
    const plugin = () => this.#devicePlugin();
    new Gauge({
      name: "enim_device_plugin_registered",
      help: "Whether kubelet has accepted the enim.dev/eni device plugin (0 also when it is off)",
      registers,
      collect() {
        this.set({}, plugin()?.registered ? 1 : 0);
      },
    });
    new Gauge({
      name: "enim_device_plugin_devices",
      help: "enim.dev/eni devices advertised to kubelet, by health (Healthy, Unhealthy)",
      labelNames: ["health"],
      registers,
      collect() {
        const p = plugin();
        if (!p) return;
        this.set({ health: "Healthy" }, p.healthy);
        this.set(
          { health: "Unhealthy" },
          Object.values(p.unhealthy).reduce((a, b) => a + b, 0),
        );
      },
    });
    new Gauge({
      name: "enim_device_plugin_unhealthy_devices",
      help:
        "Unhealthy enim.dev/eni devices by reason (foreign, quarantined, provider_unreachable, agent_not_ready)",
      labelNames: ["reason"],
      registers,
      collect() {
        const p = plugin();
        if (!p) return;
        // Every reason each time, so one that no longer holds reads 0.
        for (const reason of UNHEALTHY_REASONS) this.set({ reason }, p.unhealthy[reason] ?? 0);
      },
    });
    this.policyEnforcement = new Histogram({
      name: "enim_policy_enforcement_seconds",
      help:
        "NetworkPolicy: time from a Kubernetes watch event's arrival to its rules being in place in every pod and on the node",
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.policyLoadFailures = new Counter({
      name: "enim_policy_load_failures_total",
      help:
        "NetworkPolicy: nftables loads that failed (each is retried), by place (pod: a pod's namespace, node)",
      labelNames: ["place"],
      registers,
    });
    this.tableRepairs = new Counter({
      name: "enim_table_repairs_total",
      help:
        "nftables tables of enim found missing or not what was loaded, and loaded again, by table (policy: inet enim_policy; host_link: inet enim) and place (pod, node)",
      labelNames: ["table", "place"],
      registers,
    });
    // One read of the enforcer per scrape, shared by its metrics.
    let policyReading: Promise<PolicyCounts> | null = null;
    const policy = () => {
      const source = this.#policy;
      if (!source) return null;
      policyReading ??= source().finally(() => policyReading = null);
      return policyReading;
    };
    const ipvs = () => this.#ipvs?.() ?? false;
    new Gauge({
      name: "enim_policy_ipvs_refusing",
      help:
        "NetworkPolicy: 1 while kube-proxy's IPVS mode is found on the node (or cannot be ruled out) and ADDs are refused with CNI code 111; 0 otherwise and when policy is off",
      registers,
      collect() {
        this.set({}, ipvs() ? 1 : 0);
      },
    });
    new Gauge({
      name: "enim_policy_synced",
      help:
        "NetworkPolicy: whether the agent has synced with the Kubernetes API server and enforces (0 also when policy is off)",
      registers,
      async collect() {
        this.set({}, (await policy())?.synced ? 1 : 0);
      },
    });
    new Counter({
      name: "enim_policy_watch_restarts_total",
      help:
        "NetworkPolicy: watches of the Kubernetes API started again other than after a list (a timeout, a failure), by resource",
      labelNames: ["resource"],
      registers,
      async collect() {
        for (const c of (await policy())?.caches ?? []) {
          this.mirror({ resource: c.resource }, c.watchRestarts);
        }
      },
    });
    new Counter({
      name: "enim_policy_relists_total",
      help: "NetworkPolicy: lists of the Kubernetes API after the first (a 410 Gone), by resource",
      labelNames: ["resource"],
      registers,
      async collect() {
        for (const c of (await policy())?.caches ?? []) {
          this.mirror({ resource: c.resource }, c.relists);
        }
      },
    });
    new Gauge({
      name: "enim_policy_rules",
      help:
        "NetworkPolicy: the (peer, ports) rules a local pod's policy admits, by pod and direction (0: not isolated)",
      labelNames: ["pod", "direction"],
      registers,
      async collect() {
        this.reset();
        for (const r of (await policy())?.rules ?? []) {
          this.set({ pod: r.pod, direction: r.direction }, r.rules);
        }
      },
    });
    new Gauge({
      name: "enim_policy_unreadable",
      help:
        "NetworkPolicy: 1 for each policy of the cluster the agent cannot read, by policy (namespace/name); each fails closed: it isolates the pods it selects (its whole namespace when its podSelector cannot be read) and admits nothing",
      labelNames: ["policy"],
      registers,
      async collect() {
        this.reset();
        for (const p of (await policy())?.unreadable ?? []) this.set({ policy: p }, 1);
      },
    });
    new Gauge({
      name: "enim_policy_pods_unenforced",
      help:
        "NetworkPolicy: 1 for each local pod a policy isolates that can reach past it with the capabilities it holds (NET_ADMIN; NET_RAW where the node has no raw-socket guard), by pod",
      labelNames: ["pod"],
      registers,
      async collect() {
        this.reset();
        for (const u of (await policy())?.unenforced ?? []) this.set({ pod: u.pod }, 1);
      },
    });
    new Counter({
      name: "enim_policy_dropped_packets_total",
      help:
        "NetworkPolicy: packets dropped by a local pod's policy, by pod, direction and place (pod: in its namespace, what crossed its ENI; node: at its host link's node end); read from nftables at most every 10 s",
      labelNames: ["pod", "direction", "place"],
      registers,
      async collect() {
        this.reset();
        for (const d of (await policy())?.drops ?? []) {
          this.mirror({ pod: d.pod, direction: d.direction, place: d.place }, d.packets);
        }
      },
    });
    new Gauge({
      name: "enim_node_attachable_enis",
      help: "How many more ENIs the node can attach (the limit is shared by every profile)",
      registers,
      async collect() {
        this.set({}, (await pool()).attachable);
      },
    });
  }

  /** Records a sticky pod's hold that expired. */
  holdExpired(profile: string): void {
    this.holdExpiries.inc({ profile });
  }

  answeredDelStateFailed(): void {
    this.answeredDelStateFailures.inc({});
  }

  /** Records a zone-wide sticky event (park, claim, claim_conflict, expiry). */
  stickyEvent(event: string, profile: string): void {
    this.stickyZone.inc({ event, profile });
  }

  /** Records one ENI description set or restored in the cloud. */
  description(result: "ok" | "failed"): void {
    this.descriptions.inc({ result });
  }

  /** Records one ENI a GC pass reclaimed (or failed to). */
  gcReclaim(result: string): void {
    this.gcReclaims.inc({ result });
  }

  /** Records one provider call. */
  providerCall(provider: string, call: string, result: string, ms: number): void {
    this.providerLatency.observe({ provider, call, result }, ms / 1000);
  }

  /** Records one Register call of the device plugin. */
  devicePluginRegistration(result: "ok" | "failed"): void {
    this.devicePluginRegistrations.inc({ result });
  }

  /** Records one device list sent to kubelet. */
  devicePluginListSent(): void {
    this.devicePluginLists.inc({});
  }

  /** Sets where the device plugin's gauges read from (null while it is off). */
  setDevicePluginSource(fn: () => DevicePluginCounts | null): void {
    this.#devicePlugin = fn;
  }

  /** Sets where the NetworkPolicy metrics read from (when policy is on). */
  setPolicySource(fn: () => Promise<PolicyCounts>): void {
    this.#policy = fn;
  }

  /** Sets where `enim_policy_ipvs_refusing` reads from (when policy is on). */
  setIpvsSource(fn: () => boolean): void {
    this.#ipvs = fn;
  }

  /** Records a watch event put in place `ms` after it arrived. */
  policyEnforced(ms: number): void {
    this.policyEnforcement.observe({}, ms / 1000);
  }

  /** Records a failed nftables load of NetworkPolicy (`pod` or `node`). */
  policyLoadFailed(place: "pod" | "node"): void {
    this.policyLoadFailures.inc({ place });
  }

  /** Records a table found missing or changed and loaded again. */
  tableRepaired(table: "policy" | "host_link", place: "pod" | "node"): void {
    this.tableRepairs.inc({ table, place });
  }

  /** Sets where the pool gauges read their counts from. */
  setPoolSource(fn: () => Promise<PoolCounts> | PoolCounts): void {
    this.#pool = fn;
  }

  /** Records one phase's duration. */
  phase(op: string, phase: Phase, ms: number): void {
    this.phaseDuration.observe({ op, phase }, ms / 1000);
  }

  /** Times `fn` as `phase` of `op`. */
  async time<T>(op: string, phase: Phase, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.phase(op, phase, performance.now() - t0);
    }
  }

  /** Records a finished operation. */
  operation(op: string, result: string, ms: number): void {
    this.operations.inc({ op, result });
    this.operationDuration.observe({ op, result }, ms / 1000);
  }

  /** The text exposition. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  /** The exposition's content type. */
  get contentType(): string {
    return this.registry.contentType;
  }
}
