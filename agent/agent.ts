/**
 * The agent process around the ENI manager: start-up (state DB, provider, device layer,
 * manager, reconcile), the API server, the periodic GC, and an orderly shutdown. The
 * concrete modules come in through {@linkcode AgentDeps} (`deps.ts` has the real ones), so
 * tests can run the whole life cycle with fakes.
 *
 * Why one file: the agent's life is one order, start to stop (the lock, the parts and
 * reconcile, the socket, the TCP listener, the conflist once the socket answers, the device
 * plugin, GC) and its reverse; split, a step could start before what it needs or outlive it.
 *
 * @module
 */
import { dirname, join } from "node:path";
import { acquireAgentLock } from "./lock.ts";
import { type ProbePhase, type ProbeSources, serveProbe } from "./probe.ts";
import { privateDir, privateFile, tightenExisting } from "../lib/private_fs.ts";
import { storageFailure, storageFailureMessage } from "../lib/sqlite.ts";
import type { DatabaseSync } from "node:sqlite";
import { type AgentConfig, checkProviderConfig, validateProviderConfig } from "./config.ts";
import { launchDevicePlugin, type LaunchedPlugin, pluginOff } from "./deviceplugin/launch.ts";
import { createHandler, serveUnix, type UnixServer } from "./server.ts";
import { MARK_EVERY_MS, markReplacing, recordAgent } from "./agent_record.ts";
import { poolCounts } from "../manager/status.ts";
import { defaultLivenessSources, type LivenessSource } from "../manager/liveness/mod.ts";
import type { EniManager } from "../manager/types.ts";
import type { Logger } from "../lib/log.ts";
import { Metrics } from "../lib/metrics.ts";
import { poll, withDeadline } from "../lib/async.ts";
import {
  type DeviceSimulator,
  type Owner,
  type Provider,
  type ProviderContext,
  ProviderError,
  type ProviderModule,
} from "../providers/contract.ts";
import type { DeviceLayer } from "../netns/types.ts";
import type { ManagerOptions } from "../manager/manager.ts";
import { type PolicyEnforcer, startPolicyEnforcer } from "./policy/mod.ts";
import { type IpvsWatch, refusingUnderIpvs, startIpvsWatch } from "./ipvs.ts";
import { healthCheck } from "./health.ts";
import { type MetricsListener, serveMetricsTcp } from "./metrics_listener.ts";
import { installConflistWhenServing } from "./cni_conflist.ts";

/** A device layer and, for fakes, the simulator that makes attached ENIs appear in it. */
export interface DeviceSetup {
  devices: DeviceLayer;
  /** A simulator the device layer itself provides (the fake's); the config's wins. */
  simulator?: DeviceSimulator;
}

/** What the device layer takes from the configuration. */
export interface DeviceOptions {
  /** The deadline of each child process (`timeouts.commandSeconds`), in ms. */
  commandTimeoutMs: number;
}

/** The modules the agent wires together. */
export interface AgentDeps {
  openDatabase(path: string): DatabaseSync;
  loadProvider(name: AgentConfig["provider"]["name"]): Promise<ProviderModule>;
  createDevices(
    kind: AgentConfig["devices"],
    log: Logger,
    opts: DeviceOptions,
  ): Promise<DeviceSetup>;
  /** Test and demo only: the veth device simulator of `cfg.deviceSimulator`. */
  loadDeviceSimulator(cfg: AgentConfig): Promise<DeviceSimulator | undefined>;
  createManager(opts: ManagerOptions): EniManager | Promise<EniManager>;
  /**
   * More GC liveness sources beside the built-in ones (`manager/liveness/`): the
   * place to wire a source that needs its own client or settings.
   */
  livenessSources?(cfg: AgentConfig, log: Logger): LivenessSource[];
}

/** The node's name in ENI descriptions: its hostname (Kubernetes' default node name). */
function nodeName(): string {
  try {
    return Deno.hostname();
  } catch {
    return "this node";
  }
}

/**
 * Checks a configuration the way the agent would use it, without starting
 * anything: loads the provider module and validates its own section.
 * Throws `ConfigError`.
 */
export async function checkConfig(cfg: AgentConfig, deps: Pick<AgentDeps, "loadProvider">) {
  const module = await deps.loadProvider(cfg.provider.name);
  return await checkProviderConfig(cfg, module);
}

/**
 * Wraps a provider so each call fails as `unavailable` after `ms`, and records each
 * call's latency and result in `metrics` when given.
 */
export function withProviderTimeout(p: Provider, ms: number, metrics?: Metrics): Provider {
  const limit = <T>(what: string, run: () => Promise<T>): Promise<T> => {
    const started = performance.now();
    const call = withDeadline(run(), ms, () =>
      new ProviderError(
        "unavailable",
        `The ${p.name} provider's ${what} did not answer within ${ms / 1000} s`,
      ));
    if (!metrics) return call;
    const record = (result: string) =>
      metrics.providerCall(p.name, what, result, performance.now() - started);
    return call.then((v) => {
      record("ok");
      return v;
    }, (err) => {
      record(err instanceof ProviderError ? err.reason : "error");
      throw err;
    });
  };
  return {
    name: p.name,
    list: () => limit("list", () => p.list()),
    allocateNextENI: (owner, req) => limit("allocate", () => p.allocateNextENI(owner, req)),
    deallocateENI: (owner) => limit("deallocate", () => p.deallocateENI(owner)),
    status: () => limit("status", () => p.status()),
    profiles: () => p.profiles(),
    ...(p.describeENI
      ? {
        describeENI: (id: string, text: string | null) =>
          limit("describe", () => p.describeENI!(id, text)),
      }
      : {}),
    ...(p.repairDevice
      ? { repairDevice: (id: string) => limit("repairDevice", () => p.repairDevice!(id)) }
      : {}),
    ...(p.parkENI
      ? {
        parkENI: (owner: Owner, o: { until: number }) => limit("park", () => p.parkENI!(owner, o)),
      }
      : {}),
    ...(p.capacity ? { capacity: () => limit("capacity", () => p.capacity!()) } : {}),
    ...(p.releaseENI
      ? { releaseENI: (id: string) => limit("release", () => p.releaseENI!(id)) }
      : {}),
    ...(p.start ? { start: () => p.start!() } : {}),
    close: () => p.close(),
  };
}

/** Polls the device layer until a device with `mac` is on the node. */
function deviceWaiter(devices: DeviceLayer): (mac: string, timeoutMs: number) => Promise<void> {
  return async (mac, timeoutMs) => {
    const found = await poll(() => devices.findByMac(mac), {
      timeoutMs,
      intervalMs: 5,
      maxIntervalMs: 100,
    });
    if (!found) {
      throw new ProviderError("unavailable", `No device with MAC "${mac}" after ${timeoutMs} ms`);
    }
  };
}

/** Everything a started agent holds, closed in reverse order. */
export interface AgentParts {
  manager: EniManager;
  provider: Provider;
  db: DatabaseSync;
  simulator?: DeviceSimulator;
  /** The agent's metrics (phases, operations, provider latency, GC reclaims, pool). */
  metrics: Metrics;
  /** NetworkPolicy enforcement, and kube-proxy's IPVS mode (ADDs refused under it): when on. */
  policy: PolicyEnforcer | null;
  ipvs: IpvsWatch | null;
  close(): Promise<void>;
}

/** Opens the state, creates the provider, the device layer and the manager, then reconciles. */
export async function startParts(
  cfg: AgentConfig,
  deps: AgentDeps,
  log: Logger,
): Promise<AgentParts> {
  const module = await deps.loadProvider(cfg.provider.name);
  const providerConfig = validateProviderConfig(cfg, module);
  const metrics = new Metrics();
  const onDisk = cfg.statePath !== ":memory:";
  if (onDisk) {
    // Root only, whatever the umask or whoever made the directory (a hostPath is 0755).
    await privateDir(dirname(cfg.statePath));
    await privateFile(cfg.statePath);
  }
  const db = deps.openDatabase(cfg.statePath);
  const closers: (() => Promise<void> | void)[] = [() => {
    if (db.isOpen) db.close();
  }];
  if (onDisk) {
    // SQLite makes them with the database's mode; a database of an older agent may not be.
    await tightenExisting([`${cfg.statePath}-wal`, `${cfg.statePath}-shm`]);
  }
  const closeAll = async () => {
    for (const c of closers.splice(0).reverse()) {
      try {
        await c();
      } catch (err) {
        log.warn("error while shutting down", { error: err });
      }
    }
  };
  try {
    if (cfg.devices === "fake") {
      log.warn('devices is "fake": nothing on the node is touched (tests and dry demos only)');
    }
    const { devices, simulator: builtin } = await deps.createDevices(cfg.devices, log, {
      commandTimeoutMs: cfg.timeouts.commandSeconds * 1000,
    });
    const simulator = (await deps.loadDeviceSimulator(cfg)) ?? builtin;
    if (simulator?.close) closers.push(() => simulator.close!());
    const ctx: ProviderContext = {
      db,
      log: log.child({ component: "provider", provider: cfg.provider.name }),
      waitForDevice: deviceWaiter(devices),
      stickyEvent: (event, profile) => metrics.stickyEvent(event, profile),
      ...(simulator ? { deviceSimulator: simulator } : {}),
    };
    const raw = await module.create(providerConfig, ctx);
    closers.push(() => raw.close());
    if (simulator) {
      // A simulated node loses its devices with the process (fake) or a reboot (veth):
      // make every attached ENI's device exist again before reconcile looks for them.
      for (const eni of await raw.list()) await simulator.plug(eni);
    }
    const provider = withProviderTimeout(raw, cfg.timeouts.providerSeconds * 1000, metrics);
    // Before the manager, so that its caches sync while reconcile runs; it touches no table
    // until reconcile, as it begins, has handed it the node's ready pods (lifecycle.ts).
    const policy = await startPolicyEnforcer(cfg, { devices, metrics, log, db });
    if (policy) closers.push(() => policy.close());
    const ipvs = policy ? await startIpvsWatch(cfg, { devices, metrics, log, closers }) : null;
    const manager = await deps.createManager({
      db,
      provider,
      devices,
      log: log.child({ component: "manager" }),
      gcGraceMs: cfg.gc.graceSeconds * 1000,
      livenessSources: [
        ...defaultLivenessSources(),
        ...(deps.livenessSources?.(cfg, log.child({ component: "liveness" })) ?? []),
      ],
      metrics,
      stickyHoldMs: cfg.sticky.holdSeconds * 1000,
      delWaitMs: cfg.timeouts.delWaitSeconds * 1000,
      describeAs: cfg.cloudDescriptions ? nodeName() : null,
      watchNodeAddresses: true, // the node's routes to pods, back with the node's address
      hostLinkTableCheckMs: cfg.hostLink.tableCheckSeconds * 1000,
      nodeMarks: {
        node: cfg.hostLink.nodeMark,
        kubeProxyMasquerade: cfg.hostLink.kubeProxyMasqueradeMark,
      },
      ...(policy ? { policy: ipvs ? refusingUnderIpvs(policy, ipvs) : policy } : {}),
    });
    closers.push(() => manager.close());
    metrics.setPoolSource(async () => poolCounts(await manager.status()));
    const report = await manager.reconcile();
    log.info("reconciled the state with the provider and the devices", { ...report });
    if (raw.start) await raw.start();
    return { manager, provider, db, simulator, metrics, policy, ipvs, close: closeAll };
  } catch (err) {
    await closeAll();
    throw err;
  }
}

/** Runs `pass` now and then every `intervalMs` after the previous pass ends (never overlapping). */
export function startPeriodic(
  intervalMs: number,
  pass: () => Promise<void>,
): { stop(): Promise<void> } {
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let running: Promise<void> = Promise.resolve();
  const tick = () => {
    if (stopped) return;
    running = pass().finally(() => {
      if (!stopped) timer = setTimeout(tick, intervalMs);
    });
  };
  tick();
  return {
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await running;
    },
  };
}

/** Runs `fn`; a storage failure (a full disk, a read-only store) becomes one naming the state. */
async function storageErrorsNamed<T>(statePath: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const kind = storageFailure(err) ??
      (err instanceof Error && /EROFS|read-only file system/i.test(err.message)
        ? "readonly"
        : undefined);
    if (!kind) throw err;
    throw new Error(storageFailureMessage(kind, statePath), { cause: err });
  }
}

/** Options for {@linkcode runAgent}. */
export interface RunAgentOptions {
  deps: AgentDeps;
  log: Logger;
  /** Aborted on SIGTERM/SIGINT: the agent shuts down in order and `runAgent` returns. */
  signal: AbortSignal;
  /** Called once the API is served (tests). */
  onReady?(server: UnixServer): void;
}

/**
 * The agent's life: start the parts, reconcile, serve the API, GC once and then
 * periodically; on `signal`, stop accepting, finish in-flight requests and the
 * running GC pass, and close the manager, provider and DB.
 */
export async function runAgent(cfg: AgentConfig, opts: RunAgentOptions): Promise<void> {
  const { log } = opts;
  log.info("starting the enim agent", {
    provider: cfg.provider.name,
    socket: cfg.socket,
    state: cfg.statePath,
    devices: cfg.devices,
    pid: Deno.pid,
  });
  // This process's own probes answer from the start, also while it waits as a standby for
  // the lock (a DaemonSet's surge: agent/probe.ts).
  let phase: ProbePhase = "starting";
  let probeOf: Omit<ProbeSources, "phase"> = {};
  const probe = cfg.health.probeSocket === undefined ? undefined : await serveProbe(
    cfg.health.probeSocket,
    {
      phase: () => phase,
      health: () => probeOf.health?.() ?? { ok: true },
      ready: () => probeOf.ready?.() ?? false,
    },
    log,
  );
  // The very first thing: one agent per node. Nothing is touched before the lock is held
  // (but the state's directory, made root-only: the lock lives in it, and the replacement
  // marker beside the socket while it waits: the node's plugin holds calls for this agent).
  let standby: ReturnType<typeof setInterval> | undefined;
  let lock: Awaited<ReturnType<typeof acquireAgentLock>> | null;
  try {
    lock = await storageErrorsNamed(cfg.statePath, async () => {
      if (cfg.statePath === ":memory:") return null;
      await privateDir(dirname(cfg.statePath));
      return await acquireAgentLock(
        join(dirname(cfg.statePath), "enim.lock"),
        {
          waitMs: cfg.lockWaitSeconds * 1000,
          signal: opts.signal,
          onWait: () => {
            phase = "standby";
            log.warn("another enim agent holds the lock; waiting for it to stop", {
              lock: join(dirname(cfg.statePath), "enim.lock"),
              waitSeconds: cfg.lockWaitSeconds,
            });
            const mark = () => markReplacing(cfg.socket, log);
            void mark();
            standby = setInterval(mark, MARK_EVERY_MS);
          },
        },
      );
    });
  } catch (err) {
    clearInterval(standby);
    await probe?.shutdown();
    throw err;
  }
  clearInterval(standby);
  phase = "starting";
  let parts: AgentParts;
  try {
    parts = await storageErrorsNamed(cfg.statePath, () => startParts(cfg, opts.deps, log));
  } catch (err) {
    lock?.release();
    await probe?.shutdown();
    throw err;
  }
  let server: UnixServer | undefined;
  let tcp: MetricsListener | undefined;
  let gc: { stop(): Promise<void> } | undefined;
  let devicePlugin: LaunchedPlugin | undefined;
  let stopping = false;
  try {
    const manager = parts.manager;
    const longest = Math.max(
      cfg.timeouts.providerSeconds,
      cfg.timeouts.commandSeconds,
      cfg.timeouts.delWaitSeconds,
      cfg.networkPolicy.syncWaitSeconds,
    );
    if (cfg.health.stallSeconds <= longest) {
      log.warn(
        "health.stallSeconds is not above the longest wait under a lock: a slow but live agent " +
          "may be taken for wedged and restarted",
        { stallSeconds: cfg.health.stallSeconds, longestWaitSeconds: longest },
      );
    }
    const health = healthCheck({
      ...(manager.progress ? { progress: () => manager.progress!() } : {}),
      stallMs: cfg.health.stallSeconds * 1000,
    });
    const handler = createHandler({
      health,
      manager: parts.manager,
      log: log.child({ component: "api" }),
      metrics: () => parts.metrics.text(),
      addTimeoutMs: cfg.timeouts.addSeconds * 1000,
      devicePlugin: () => (devicePlugin ?? pluginOff("The agent is starting")).status(),
      ...(parts.policy && parts.ipvs ? { policy: parts.policy, ipvs: parts.ipvs.status } : {}),
    });
    server = await serveUnix(cfg.socket, handler, {
      log,
      maxConnections: cfg.api.maxConnections,
      requestTimeoutMs: cfg.api.requestTimeoutSeconds * 1000,
    });
    if (cfg.metrics.enabled) {
      tcp = serveMetricsTcp({ metrics: () => parts.metrics.text(), health }, {
        address: cfg.metrics.address,
        port: cfg.metrics.port,
        log,
        requestTimeoutMs: cfg.api.requestTimeoutSeconds * 1000,
      });
    }
    // Serving: the record beside the socket says who (a rollout's previous agent's is replaced).
    const servingSince = Date.now();
    await recordAgent(cfg.socket, log, servingSince);
    probeOf = { health, ready: () => (manager.ready ?? true) && !stopping };
    phase = "serving";
    opts.onReady?.(server);
    // Only now may the runtime send pods: the plugin's socket answers (cni_conflist.ts).
    if (cfg.cniConfig) {
      await installConflistWhenServing(cfg.cniConfig, {
        socket: cfg.socket,
        log,
        signal: opts.signal,
      });
    }
    devicePlugin = await launchDevicePlugin(cfg.devicePlugin, {
      provider: parts.provider,
      consumers: () => parts.manager.attachments().map((a) => ({ pod: a.pod, state: a.state })),
      metrics: parts.metrics,
      log,
      ready: () => !stopping,
    });
    const gcLog = log.child({ component: "gc" });
    // Each pass logs what it reclaimed and what failed itself (manager/gc.ts).
    gc = startPeriodic(cfg.gc.intervalSeconds * 1000, async () => {
      try {
        await parts.manager.gc({ dryRun: false });
      } catch (err) {
        gcLog.error("gc pass failed", { error: err });
      }
    });
    if (!opts.signal.aborted) {
      await new Promise<void>((resolve) => {
        opts.signal.addEventListener("abort", () => resolve(), { once: true });
        server!.finished.then(resolve, resolve);
      });
    }
    log.info("shutting down");
    phase = "stopping";
    // A graceful stop: the plugin answers STATUS success and holds calls for the next agent,
    // for RESTART_GRACE_SECONDS from now (docs/runtimes.md, STATUS).
    if (opts.signal.aborted) await recordAgent(cfg.socket, log, servingSince, Date.now());
  } finally {
    // The devices go Unhealthy first: kubelet stops admitting pods before the API goes.
    stopping = true;
    await devicePlugin?.close();
    await tcp?.shutdown();
    await server?.shutdown();
    await gc?.stop();
    await parts.close();
    lock?.release();
    await probe?.shutdown();
    log.info("stopped");
  }
}
