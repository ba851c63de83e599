/**
 * The ENI manager: ADD, DEL, CHECK, GC, reconcile and status over the provider,
 * the device layer and the SQLite state store.
 *
 * Crash safety: every operation records its intent in the state store before it
 * calls the provider or touches a device, and its outcome after, each in its own
 * committed transaction, so {@linkcode EniManager.reconcile} can roll back or
 * finish whatever a kill -9 interrupted:
 *
 * - ADD: row `adding` → provider allocate → ENI id and MAC recorded → node name
 *   recorded → device plugged (interface mode) → row `ready` with the result
 *   (and the pod's older containers `recycling`) → answer. A crash before `ready`
 *   is rolled back; after it, a retried ADD gets the stored result.
 * - DEL / GC reclaim / rollback: row `deleting` → device back to the node →
 *   provider deallocate → row deleted. A crash in between is finished.
 *
 * Concurrency: a keyed async mutex serializes operations on one attachment key
 * (`att:<containerId>/<ifName>`) and one ENI (`eni:<id>`), always taken in that
 * order; different pods run in parallel and a slow provider call holds only its
 * own keys.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import {
  type Eni,
  EniSchema,
  type Owner,
  type Provider,
  ProviderError,
} from "../providers/contract.ts";
import {
  DeviceError,
  type DeviceLayer,
  type Link,
  type PinnedNetns,
  type PlugResult,
  type RouteSpec,
} from "../netns/types.ts";
import type { Logger } from "../lib/log.ts";
import type { Phase, PhaseRecorder } from "../lib/metrics.ts";
import { VERSION } from "../lib/version.ts";
import { userMessage } from "../lib/message.ts";
import {
  type AddResponse,
  AddResponseSchema,
  ApiError,
  type GcReport,
  type Status,
} from "./api_schema.ts";
import type {
  AddInput,
  CheckInput,
  DelInput,
  EniManager,
  GcInput,
  ReconcileReport,
} from "./types.ts";
import {
  type AttachmentKey,
  type AttachmentRow,
  keyOf,
  StateStore,
  toAttachment,
} from "./state.ts";
import { KeyedMutex } from "./mutex.ts";
import { storageFailure, storageFailureMessage } from "../lib/sqlite.ts";
import { type CheckLive, checkProblems, type CheckRecord } from "./check.ts";
import { defaultLivenessSources, type LivenessSource, runGc } from "./gc.ts";
import { checkChoice } from "./profiles.ts";
import { Describer, type DescriptionRecorder } from "./descriptions.ts";

/** What {@linkcode createManager} needs. */
export interface ManagerOptions {
  /** The agent's state database (opened by the caller; the manager does not close it). */
  db: DatabaseSync;
  provider: Provider;
  devices: DeviceLayer;
  log: Logger;
  /** GC never reclaims attachments younger than this, nor recycling ones recycled more recently. */
  gcGraceMs: number;
  /** The clock, epoch milliseconds (tests move it). */
  now?: () => number;
  /** Liveness sources for GC (default: {@linkcode defaultLivenessSources}). */
  livenessSources?: LivenessSource[];
  /** Where per-phase timings and operation results go (the agent's metrics). */
  metrics?: PhaseRecorder & Partial<DescriptionRecorder>;
  /** How long a sticky pod's ENI is held for it after its DEL (default 5 minutes). */
  stickyHoldMs?: number;
  /**
   * The node's name in ENI descriptions (`ns/pod on <node>`); null turns the
   * descriptions off (default: off).
   */
  describeAs?: string | null;
}

/** The manager, with its state store exposed for the agent and tests. */
export interface Manager extends EniManager {
  readonly state: StateStore;
  /** Resolves when every queued cloud description has been tried (tests). */
  descriptionsIdle(): Promise<void>;
}

/** Creates the ENI manager over a migrated state store in `db`. */
export function createManager(opts: ManagerOptions): Manager {
  return new ManagerImpl(opts);
}

const ownerOf = (r: AttachmentRow): Owner => ({
  pod: r.pod,
  containerId: r.containerId,
  ifName: r.ifName,
});

const message = userMessage;

/**
 * Maps anything thrown by a step to the API error a client sees. `statePath`
 * names the database in a storage failure (a full disk, a read-only store).
 */
export function toApiError(err: unknown, statePath = "the state database"): ApiError {
  if (err instanceof ApiError) return err;
  const storage = storageFailure(err);
  if (storage) {
    return new ApiError("state_unavailable", storageFailureMessage(storage, statePath), undefined, {
      cause: err,
    });
  }
  if (err instanceof ProviderError) {
    if (err.reason === "no_eni_available" || err.reason === "requested_ip_unavailable") {
      return new ApiError(err.reason, err.message, undefined, { cause: err });
    }
    return new ApiError(
      "provider_error",
      `The provider failed (${err.reason}): ${err.message}`,
      err.requestId,
      {
        cause: err,
      },
    );
  }
  if (err instanceof DeviceError) {
    const code = err.reason === "ifname_exists"
      ? "ifname_exists"
      : err.reason === "netns_invalid" || err.reason === "netns_node"
      ? "netns_invalid"
      : "device_error";
    return new ApiError(code, err.message, `step: ${err.step}`, { cause: err });
  }
  return new ApiError("internal", message(err), undefined, { cause: err });
}

/** Whether a route's destination is IPv6. */
const isV6 = (dst: string) => dst.includes(":");
/** The ADD result for `eni`: addresses in CIDR form, default routes and the config's routes. */
export function buildResult(
  eni: Eni,
  req: Pick<AddInput, "routes"> & { defaultRoutes?: boolean },
): Pick<AddResponse, "ips" | "routes"> {
  const ips: AddResponse["ips"] = [];
  const routes: RouteSpec[] = [];
  const wanted = req.routes.map((r) => ({
    dst: r.dst === "default" ? "0.0.0.0/0" : r.dst,
    gw: r.gw ?? (isV6(r.dst) ? eni.ipv6?.gateway : eni.ipv4?.gateway),
  }));
  for (const [fam, a] of [["4", eni.ipv4], ["6", eni.ipv6]] as const) {
    if (!a) continue;
    ips.push({ address: `${a.address}/${a.prefixLength}`, gateway: a.gateway });
    const dflt = fam === "4" ? "0.0.0.0/0" : "::/0";
    if (req.defaultRoutes !== false && !wanted.some((r) => r.dst === dflt)) {
      routes.push({ dst: dflt, gw: a.gateway });
    }
  }
  for (const r of wanted) routes.push(r.gw ? { dst: r.dst, gw: r.gw } : { dst: r.dst });
  return { ips, routes };
}

/**
 * The phases of one operation: durations summed per phase (a phase may run more
 * than once, e.g. two state writes), reported to the metrics and the debug log.
 */
class OpTimer {
  readonly started = performance.now();
  readonly phases: Partial<Record<Phase, number>> = {};

  add(phase: Phase, ms: number): void {
    this.phases[phase] = (this.phases[phase] ?? 0) + ms;
  }

  /** Times an async step. */
  async time<T>(phase: Phase, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.add(phase, performance.now() - t0);
    }
  }

  /** Times a synchronous step (the SQLite writes). */
  sync<T>(phase: Phase, fn: () => T): T {
    const t0 = performance.now();
    try {
      return fn();
    } finally {
      this.add(phase, performance.now() - t0);
    }
  }

  /** Marks the end of a lock wait that began at `since`. */
  waited(since: number): void {
    this.add("queue_wait", performance.now() - since);
  }
}

const round2 = (ms: number) => Math.round(ms * 100) / 100;

class ManagerImpl implements Manager {
  readonly state: StateStore;
  readonly #provider: Provider;
  readonly #devices: DeviceLayer;
  readonly #log: Logger;
  readonly #graceMs: number;
  readonly #now: () => number;
  readonly #sources: LivenessSource[];
  readonly #metrics: (PhaseRecorder & Partial<DescriptionRecorder>) | undefined;
  readonly #holdMs: number;
  readonly #describer: Describer | null;
  readonly #locks = new KeyedMutex();
  readonly #inflight = new Set<Promise<unknown>>();
  #closed = false;
  #reconciled = false;

  constructor(o: ManagerOptions) {
    this.#now = o.now ?? Date.now;
    this.state = StateStore.open(o.db, this.#now);
    this.#provider = o.provider;
    this.#devices = o.devices;
    this.#log = o.log;
    this.#graceMs = o.gcGraceMs;
    this.#sources = o.livenessSources ?? defaultLivenessSources();
    this.#metrics = o.metrics;
    this.#holdMs = o.stickyHoldMs ?? 300_000;
    this.#describer = o.describeAs
      ? new Describer(o.provider, o.log.child({ op: "describe" }), o.describeAs, o.metrics)
      : null;
  }

  /** Runs one timed operation: reports its phases and result to the metrics and the debug log. */
  async #timed<T>(op: string, key: string, fn: (t: OpTimer) => Promise<T>): Promise<T> {
    const t = new OpTimer();
    let result = "ok";
    try {
      return await fn(t);
    } catch (err) {
      result = err instanceof ApiError ? err.code : "internal";
      throw err;
    } finally {
      const total = performance.now() - t.started;
      if (this.#metrics) {
        for (const [phase, ms] of Object.entries(t.phases)) {
          this.#metrics.phase(op, phase as Phase, ms);
        }
        this.#metrics.operation(op, result, total);
      }
      const phases: Record<string, number> = {};
      for (const [phase, ms] of Object.entries(t.phases)) phases[phase] = round2(ms);
      this.#log.debug(`${op.toUpperCase()} phases (ms)`, {
        key,
        result,
        totalMs: round2(total),
        ...phases,
      });
    }
  }

  /** Maps what an operation threw to the error a client sees, naming this state's path. */
  #apiError(err: unknown): ApiError {
    return toApiError(err, this.state.db.location() ?? "the state database");
  }

  /** Tracks an operation so close() can wait for it; its errors reach clients as ApiError. */
  #op<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#closed) return Promise.reject(new ApiError("busy", "The agent is shutting down"));
    const p = fn().catch((err) => {
      throw this.#apiError(err);
    });
    this.#inflight.add(p);
    p.finally(() => this.#inflight.delete(p)).catch(() => {});
    return p;
  }

  // ---------------------------------------------------------------- ADD

  add(req: AddInput): Promise<AddResponse> {
    return this.#op(() =>
      this.#timed("add", keyOf(req), (t) => {
        const since = performance.now();
        return this.#locks.run(`att:${keyOf(req)}`, () => {
          t.waited(since);
          return this.#add(req, t);
        });
      })
    );
  }

  async #add(req: AddInput, t: OpTimer): Promise<AddResponse> {
    const pod = `${req.pod.namespace}/${req.pod.name}`;
    const key: AttachmentKey = { containerId: req.containerId, ifName: req.ifName };
    const existing = this.state.get(key);
    if (existing) {
      if ((existing.state === "ready" || existing.state === "recycling") && existing.result) {
        if (existing.pod !== pod) {
          throw new ApiError(
            "bad_request",
            `Attachment "${keyOf(key)}" belongs to pod "${existing.pod}", not "${pod}"`,
          );
        }
        this.#log.debug("ADD retried: returning the stored result", { key: keyOf(key) });
        return AddResponseSchema.parse(JSON.parse(existing.result));
      }
      // Left half done by a crash (reconcile normally handles these): undo it first.
      try {
        await this.#release(existing, { netnsUsable: true, leaveCallerDevice: true }, t);
      } catch (err) {
        throw this.#apiError(err);
      }
    }
    // The pod's choice (profile, groups, fixed IPs) against the operator's rules,
    // before anything is recorded or allocated.
    checkChoice(this.#provider.profiles(), {
      namespace: req.pod.namespace,
      profile: req.profile,
      securityGroupIds: req.securityGroupIds,
      ips: req.ips,
    });
    const owner: Owner = { pod, containerId: req.containerId, ifName: req.ifName };
    const log = this.#log.child({ op: "add", key: keyOf(key), pod });
    // The namespace is proven and held before anything is recorded or allocated: every
    // step of this ADD goes through the one namespace it names now (netns/pin.ts), and the
    // row carries its identity from the start.
    let pinned: PinnedNetns | null = null;
    try {
      pinned = await t.time("netns_check", () => this.#devices.pin(req.netns));
    } catch (err) {
      // IPAM mode moves nothing: a path that is no namespace (the seed's /dev/null) is
      // fine there, the node's own namespace never is.
      const nodeNs = err instanceof DeviceError && err.reason === "netns_node";
      if (req.mode === "interface" || nodeNs || !(err instanceof DeviceError)) {
        throw this.#apiError(err);
      }
    }
    try {
      return await this.#addPinned(req, t, key, pod, owner, log, pinned);
    } finally {
      pinned?.close();
    }
  }

  async #addPinned(
    req: AddInput,
    t: OpTimer,
    key: AttachmentKey,
    pod: string,
    owner: Owner,
    log: Logger,
    pinned: PinnedNetns | null,
  ): Promise<AddResponse> {
    const identity = pinned?.identity ?? null;
    t.sync("state_write", () =>
      this.state.insertAdding({
        ...key,
        pod,
        podUid: req.pod.uid ?? null,
        network: req.network,
        netns: req.netns,
        mode: req.mode,
        netnsDev: identity?.dev ?? null,
        netnsIno: identity?.ino ?? null,
        profile: req.profile,
        sticky: req.sticky,
      }));
    let allocating = false;
    let allocated = false;
    try {
      const held = req.sticky ? await this.#takeOverHeld(req, key, pod, log) : null;
      allocating = true;
      const eni = EniSchema.parse(
        await t.time("provider", () =>
          this.#provider.allocateNextENI(owner, {
            ips: req.ips,
            ranges: req.ranges,
            profile: req.profile,
            ...(req.securityGroupIds ? { securityGroupIds: req.securityGroupIds } : {}),
            ...(held ? { takeOver: ownerOf(held) } : {}),
          })),
      );
      allocated = true;
      if (held && held.eniId !== eni.id) {
        // The held ENI could not be given back (gone from the cloud): free what is left of it.
        log.warn("The sticky pod's held ENI could not be taken over; it got another", {
          held: held.eniId,
          eniId: eni.id,
        });
        await this.#provider.deallocateENI(ownerOf(held)).catch((err) =>
          log.warn("Freeing the held ENI failed; GC frees it", { error: message(err) })
        );
      }
      const holder = this.state.byEni(eni.id);
      if (holder && keyOf(holder) !== keyOf(key)) {
        throw new ApiError(
          "internal",
          `The provider handed out ENI "${eni.id}", which attachment "${keyOf(holder)}" holds`,
        );
      }
      log.debug("ENI allocated", { eniId: eni.id });
      const since = performance.now();
      return await this.#locks.run(`eni:${eni.id}`, async () => {
        t.waited(since);
        const { ips, routes } = buildResult(eni, req);
        const placed = req.mode === "interface"
          ? await this.#plugIntoPod(req, pinned!, key, eni, ips, routes, t)
          : await this.#findForIpam(req, key, eni, identity !== null, t);
        const { ifindex, nodeName } = placed;
        const result: AddResponse = { eniId: eni.id, mac: eni.mac, ifindex, nodeName, ips, routes };
        const recycled = t.sync("state_write", () =>
          this.state.markReady(key, pod, {
            result: JSON.stringify(result),
            ifindex,
            nodeName,
          }));
        for (const r of recycled) {
          log.info("Older container's ENI enters recycling", { recycled: keyOf(r) });
        }
        log.info("ADD done", {
          eniId: eni.id,
          mac: eni.mac,
          mode: req.mode,
          ...(req.profile !== "default" ? { profile: req.profile } : {}),
          ...(held?.eniId === eni.id ? { keptFrom: keyOf(held) } : {}),
        });
        // After the answer, never before it: the cloud shows whose ENI this is.
        queueMicrotask(() => this.#describer?.owned(eni.id, pod));
        return result;
      });
    } catch (err) {
      const apiErr = this.#apiError(err);
      log.warn("ADD failed; rolling back", { code: apiErr.code, error: apiErr.message });
      const row = this.state.get(key);
      if (row) {
        // A failed allocate may still have given this owner an ENI (a timeout): free it
        // then; when the provider shows it holds none, there is nothing to ask it.
        const mayHold = allocated ||
          (allocating && await this.#provider.list().then(
            (enis) => enis.some((e) => e.owner !== null && keyOf(e.owner) === keyOf(key)),
            () => true,
          ));
        try {
          await this.#release(
            row,
            { netnsUsable: true, skipProvider: !mayHold, leaveCallerDevice: true },
            t,
          );
        } catch (rbErr) {
          log.error("Rollback failed; GC will finish it", { error: message(rbErr) });
        }
      }
      throw apiErr;
    }
  }

  /**
   * A sticky pod's comeback: the ENI its previous container left `held` becomes
   * this attachment's. Under the held row's lock, one transaction deletes it and
   * records its ENI on this `adding` row, so a crash before the provider call is
   * rolled back like any ADD (reconcile then frees the ENI as an orphan) and GC
   * can no longer expire it. A hold of another profile is left to expire.
   */
  async #takeOverHeld(
    req: AddInput,
    key: AttachmentKey,
    pod: string,
    log: Logger,
  ): Promise<AttachmentRow | null> {
    const candidate = this.state.heldFor(pod, req.ifName);
    if (!candidate) return null;
    if (candidate.profile !== req.profile) {
      log.info("The pod's held ENI is of another profile; it waits for its hold to expire", {
        held: candidate.eniId,
        heldProfile: candidate.profile,
        profile: req.profile,
      });
      return null;
    }
    return await this.#locks.run(`att:${keyOf(candidate)}`, () => {
      const held = this.state.takeOver(candidate, key);
      if (held) log.info("Taking back the sticky pod's held ENI", { eniId: held.eniId });
      return Promise.resolve(held);
    });
  }

  /**
   * Interface mode: moves the ENI's device into the pod and configures it (two spawns
   * when the device layer knows the device's node name). The ENI, its MAC and the
   * node name the move uses are recorded in one write just before the move, so a
   * crash after it leaves reconcile all it needs to bring the device back. A device
   * not on the node yet (a physical ENI returning from a pod, a simulated one being
   * re-created) is waited for up to 2 s, then the plug is tried once more.
   */
  async #plugIntoPod(
    req: AddInput,
    pinned: PinnedNetns,
    key: AttachmentKey,
    eni: Eni,
    ips: AddResponse["ips"],
    routes: RouteSpec[],
    t: OpTimer,
  ): Promise<{ ifindex: number; nodeName: string }> {
    const plug = (nodeName?: string) =>
      this.#devices.plug({
        mac: eni.mac,
        netns: pinned,
        ifName: req.ifName,
        addresses: ips.map((i) => ({ cidr: i.address })),
        routes,
        mtu: req.mtu,
        nodeName,
        beforeMove: (name) =>
          t.sync("state_write", () =>
            this.state.update(key, { eniId: eni.id, mac: eni.mac, nodeName: name })),
        timing: (phase, ms) =>
          t.add(phase, ms),
      });
    let r: PlugResult;
    try {
      r = await plug();
    } catch (err) {
      if (!(err instanceof DeviceError) || err.reason !== "not_found") throw err;
      const found = await t.time("device_lookup", () => this.#findDevice(eni.mac, null));
      if (!found) {
        throw new ApiError(
          "device_error",
          `No device with MAC "${eni.mac}" (ENI "${eni.id}") on the node`,
        );
      }
      r = await plug(found.link.ifname);
    }
    // The device is in the namespace held since the start. If the path names another one
    // now (deleted and re-created meanwhile), the pod the runtime knows is not that one:
    // bring the device back and refuse, rather than record a pod that has no device.
    const now = await this.#devices.netnsIdentity(req.netns).catch(() => null);
    if (!now || now.dev !== pinned.identity.dev || now.ino !== pinned.identity.ino) {
      await this.#devices.unplug({
        mac: eni.mac,
        nodeName: r.nodeName,
        netns: pinned,
        podName: req.ifName,
      });
      throw new ApiError(
        "netns_invalid",
        `Netns "${req.netns}" was replaced during the ADD (it named another namespace when the device was moved); nothing was kept`,
      );
    }
    return { ifindex: r.podIfindex, nodeName: r.nodeName };
  }

  /**
   * IPAM mode: finds the ENI's device, on the node or (a device plugin such as
   * host-device moves it first) already in the pod, and records it; the calling
   * plugin moves it.
   */
  async #findForIpam(
    req: AddInput,
    key: AttachmentKey,
    eni: Eni,
    podUsable: boolean,
    t: OpTimer,
  ): Promise<{ ifindex: number; nodeName: string }> {
    const found = await t.time(
      "device_lookup",
      () => this.#findDevice(eni.mac, podUsable ? req : null),
    );
    if (!found) {
      throw new ApiError(
        "device_error",
        `No device with MAC "${eni.mac}" (ENI "${eni.id}") on the node${
          podUsable ? " or in the pod" : ""
        }`,
      );
    }
    const { link, inPod } = found;
    // A device plugin that moves the device before calling IPAM (host-device) keeps
    // the node-side name in the alias, as enim itself does.
    const nodeName = inPod ? (link.ifalias || link.ifname) : link.ifname;
    if (inPod) {
      this.#log.info("The calling plugin has moved the device into the pod already", {
        eniId: eni.id,
        podName: link.ifname,
        nodeName,
      });
    }
    t.sync(
      "state_write",
      () =>
        this.state.update(key, { eniId: eni.id, mac: eni.mac, nodeName, ifindex: link.ifindex }),
    );
    return { ifindex: link.ifindex, nodeName };
  }

  // ---------------------------------------------------------------- release (DEL, rollback, GC)

  /**
   * Finds an ENI's device on the node or, for an IPAM ADD with a usable pod namespace,
   * in the pod (a device plugin such as host-device moves the device into the pod before
   * it calls IPAM). A device released a moment ago may still be on its way back to the
   * node (the calling plugin moves it out after IPAM DEL; a physical ENI returns
   * asynchronously), so a missing device is looked for again for up to 2 s.
   */
  async #findDevice(
    mac: string,
    pod: { netns: string } | null,
  ): Promise<{ link: Link; inPod: boolean } | null> {
    const deadline = Date.now() + 2000;
    for (;;) {
      const onNode = await this.#devices.findByMac(mac);
      if (onNode) return { link: onNode, inPod: false };
      if (pod) {
        const inPod = await this.#devices.findByMac(mac, pod.netns).catch(() => null);
        if (inPod) return { link: inPod, inPod: true };
      }
      if (Date.now() >= deadline) return null;
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /**
   * Releases an attachment; the caller holds its `att:` key. Intent (`deleting`) first,
   * then the device back to the node, then the provider, then the row is deleted. On
   * failure the row stays `deleting` with the error recorded (GC finishes it).
   *
   * `leaveCallerDevice` (DEL and ADD rollback): in IPAM mode the device belongs to the
   * calling plugin. When it sits in the pod under the attachment's interface name, that
   * plugin put it there and moves it out itself after IPAM DEL (host-device does: IPAM
   * DEL first, then it moves the device back under the name kept in its alias; if enim
   * had moved it already, host-device's DEL would fail for good, "failed to find eth0").
   * GC passes no such flag: a device left in a leftover namespace is moved back.
   */
  async #release(
    row: AttachmentRow,
    o: {
      netnsUsable: boolean;
      skipProvider?: boolean;
      leaveCallerDevice?: boolean;
      /** A sticky pod's DEL: the device comes back, the ENI stays its pod's until then. */
      holdUntil?: number;
    },
    t: OpTimer = new OpTimer(),
  ): Promise<void> {
    const key: AttachmentKey = { containerId: row.containerId, ifName: row.ifName };
    if (row.state !== "deleting") {
      t.sync("state_write", () => this.state.update(key, { state: "deleting" }));
    }
    try {
      if (row.mac) {
        const mac = row.mac;
        const since = performance.now();
        await this.#locks.run(`eni:${row.eniId}`, async () => {
          t.waited(since);
          if (
            o.leaveCallerDevice && o.netnsUsable && row.mode === "ipam" && row.netnsIno !== null
          ) {
            const inPod = await this.#devices.findByMac(mac, row.netns).catch(() => null);
            if (inPod && inPod.ifname === row.ifName) {
              this.#log.info("Leaving the device in the pod to the calling plugin", {
                eniId: row.eniId,
                mac,
                netns: row.netns,
                ifName: row.ifName,
              });
              return;
            }
          }
          // Recorded with the MAC before any move; looked up only for rows of older agents.
          const nodeName = row.nodeName ??
            (await t.time("device_lookup", () => this.#devices.findByMac(mac)))?.ifname ??
            // Its alias in the pod is its node name (a later unplug renames it to that).
            (row.eniId ? `enim${row.eniId.replace(/[^A-Za-z0-9]/g, "").slice(-11)}` : "enim-eni");
          // An IPAM attachment with a non-nsfs netns (CNI_NETNS=/dev/null) has no pod side.
          const podSide = row.mode === "interface" || row.netnsIno !== null;
          // Held for this release; a path that names another namespace than the one the
          // ADD recorded leads to someone else's pod, not to the device.
          let pinned = o.netnsUsable && podSide
            ? await this.#devices.pin(row.netns).catch(() => null)
            : null;
          if (
            pinned && row.netnsIno !== null &&
            (pinned.identity.ino !== row.netnsIno || pinned.identity.dev !== row.netnsDev)
          ) {
            pinned.close();
            pinned = null;
          }
          try {
            await this.#returnDevice(row, mac, nodeName, pinned, t);
          } finally {
            pinned?.close();
          }
        });
      }
      if (o.holdUntil !== undefined && row.eniId && row.result) {
        t.sync("state_write", () => this.state.markHeld(key, o.holdUntil!));
        return;
      }
      if (!o.skipProvider) {
        await t.time("provider", () => this.#provider.deallocateENI(ownerOf(row)));
      }
      t.sync("state_write", () => this.state.delete(key));
      if (row.eniId && !o.skipProvider) this.#describer?.freed(row.eniId);
    } catch (err) {
      t.sync("state_write", () => this.state.recordFailure(key, message(err)));
      throw err;
    }
  }

  /**
   * Brings an attachment's device back to the node (`unplug`), or makes sure it is
   * there; throws when it is found nowhere, unless the cloud says the ENI is gone.
   */
  async #returnDevice(
    row: AttachmentRow,
    mac: string,
    nodeName: string,
    netns: PinnedNetns | null,
    t: OpTimer,
  ): Promise<void> {
    const timing = (phase: Phase, ms: number) => t.add(phase, ms);
    // The pod name identifies the device only once the ADD placed it (a later plugin
    // may then have changed its MAC); a failed ADD's pod name may be another device's.
    const podName = row.mode === "interface" && row.result !== null ? row.ifName : undefined;
    let outcome;
    try {
      outcome = await this.#devices.unplug({ mac, nodeName, netns, podName, timing });
    } catch (err) {
      if (!(err instanceof DeviceError) || err.reason !== "netns_invalid" || !netns) {
        throw err;
      }
      // The netns is gone: the kernel returned the device to the node.
      outcome = await this.#devices.unplug({ mac, nodeName, netns: null, timing });
    }
    if (outcome === "missing") {
      const repaired = row.eniId ? await this.#repairDevice(row.eniId, mac) : "missing";
      // An ENI the cloud no longer has is forgotten: there is nothing left to hold.
      if (repaired === "gone") return;
      if (repaired === "missing") {
        // Never free an ENI whose device is unaccounted for: the next one to get it
        // would find no device, or the device would turn up in use. The row stays
        // `deleting` with this error and GC tries again.
        throw new DeviceError(
          "unplug",
          "not_found",
          `The device of ENI "${row.eniId}" (MAC ${mac}) is neither in the pod nor on the node; the ENI stays held until it is found`,
        );
      }
      // It may come back under another name (and, physical, up): rename and scrub it.
      await this.#devices.unplug({ mac, nodeName, netns: null });
    }
  }

  /**
   * A released device was found nowhere (a veth dies with its namespace; a physical
   * ENI returns to the node asynchronously): ask the provider to bring it back and
   * wait for it on the node, so the ENI is usable when it returns to the pool.
   * Says whether the device is back, the ENI is gone from the cloud, or the device is missing.
   */
  async #repairDevice(eniId: string, mac: string): Promise<"back" | "gone" | "missing"> {
    const deadline = Date.now() + 3000;
    for (;;) {
      try {
        await this.#provider.repairDevice?.(eniId);
      } catch (err) {
        if (err instanceof ProviderError && err.reason === "not_found") {
          // The cloud no longer has the ENI (deleted out of band): no device will return.
          this.#log.warn("The ENI is gone from the cloud; its device will not return", {
            eniId,
            mac,
            error: message(err),
          });
          return "gone";
        }
        this.#log.warn("Repairing a vanished device failed", { eniId, error: message(err) });
      }
      if (await this.#devices.findByMac(mac).catch(() => null)) {
        this.#log.info("A vanished ENI device is back on the node", { eniId, mac });
        return "back";
      }
      if (Date.now() > deadline) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    this.#log.warn("The ENI's device is missing from the node", { eniId, mac });
    return "missing";
  }

  // ---------------------------------------------------------------- DEL

  del(req: DelInput): Promise<void> {
    return this.#op(() =>
      this.#timed("del", keyOf(req), (t) => {
        const since = performance.now();
        return this.#locks.run(`att:${keyOf(req)}`, () => {
          t.waited(since);
          return this.#del(req, t);
        });
      })
    );
  }

  async #del(req: DelInput, t: OpTimer): Promise<void> {
    const row = this.state.get(req);
    if (!row) {
      this.#log.debug("DEL of an unknown attachment: nothing to do", { key: keyOf(req) });
      return;
    }
    if (row.state === "held") {
      this.#log.debug("DEL of a held attachment: done already", { key: keyOf(req) });
      return;
    }
    // A sticky pod keeps its ENI for a while: it comes back with its next container.
    const hold = row.sticky && row.state === "ready" && row.result !== null;
    try {
      await this.#release(row, {
        netnsUsable: true,
        leaveCallerDevice: true,
        ...(hold ? { holdUntil: this.#now() + this.#holdMs } : {}),
      }, t);
      this.#log.info(hold ? "DEL done; the ENI is held for the sticky pod" : "DEL done", {
        key: keyOf(req),
        eniId: row.eniId,
        ...(hold ? { holdSeconds: Math.round(this.#holdMs / 1000) } : {}),
      });
    } catch (err) {
      const apiErr = this.#apiError(err);
      // A DEL answers success only when what it did is recorded. The state could not be
      // written: fail, so the runtime retries (nothing it asked for is acknowledged).
      if (apiErr.code === "state_unavailable") throw apiErr;
      // A device or provider step failed, and the row records it (`deleting`, the error):
      // the pod's side is done as far as the runtime can help, and GC finishes the rest.
      this.#log.warn("DEL could not finish; GC will retry", {
        key: keyOf(req),
        error: message(err),
      });
    }
  }

  // ---------------------------------------------------------------- CHECK

  check(req: CheckInput): Promise<void> {
    return this.#op(() => this.#locks.run(`att:${keyOf(req)}`, () => this.#check(req)));
  }

  async #check(req: CheckInput): Promise<void> {
    const row = this.state.get(req);
    const name = `"${keyOf(req)}"`;
    const fail = (msg: string): never => {
      throw new ApiError("check_failed", msg);
    };
    if (!row) return fail(`Attachment ${name} is not known to the agent`);
    if ((row.state !== "ready" && row.state !== "recycling") || !row.result || !row.mac) {
      return fail(`Attachment ${name} is ${row.state}, not ready`);
    }
    const result = AddResponseSchema.parse(JSON.parse(row.result));
    const record: CheckRecord = {
      mode: row.mode,
      mac: row.mac,
      nodeName: row.nodeName,
      addresses: result.ips.map((i) => i.address),
      netns: row.netnsIno !== null && row.netnsDev !== null
        ? { dev: row.netnsDev, ino: row.netnsIno }
        : null,
    };
    let live: CheckLive | null = null;
    if (row.mode === "interface") {
      let pinned: PinnedNetns;
      try {
        pinned = await this.#devices.pin(req.netns);
      } catch (err) {
        return fail(err instanceof Error ? err.message : String(err));
      }
      try {
        const pod = await this.#devices.inspect({ netns: pinned, ifName: req.ifName }).catch((
          err,
        ) => fail(`Cannot read the pod's interface: ${message(err)}`));
        live = {
          netns: pinned.identity,
          link: pod.link,
          addresses: pod.addresses,
          routes: pod.routes,
        };
      } finally {
        pinned.close();
      }
    }
    const problems = checkProblems(record, req.expected, live, req);
    if (problems.length > 0) fail(problems[0]);
    if (row.mode === "ipam") {
      const mac = row.mac;
      const link = await this.#devices.findByMac(mac).catch(() => null) ??
        await this.#devices.findByMac(mac, req.netns).catch(() => null);
      if (!link) fail(`No device with MAC ${mac} (ENI "${row.eniId}") on the node or in the pod`);
    }
  }

  // ---------------------------------------------------------------- GC

  gc(req: GcInput): Promise<GcReport> {
    return this.#op(async () => {
      const report = await this.#gc(req);
      for (const i of report.items) {
        if (i.outcome !== "planned") this.#metrics?.gcReclaim(i.outcome);
        if (i.kind === "hold" && i.outcome === "reclaimed") this.#metrics?.holdExpired?.(i.profile);
      }
      return report;
    });
  }

  #gc(req: GcInput): Promise<GcReport> {
    return (
      this.#locks.run("gc:pass", () =>
        runGc({
          state: this.state,
          provider: this.#provider,
          devices: this.#devices,
          log: this.#log.child({ op: "gc" }),
          locks: this.#locks,
          now: this.#now,
          graceMs: this.#graceMs,
          sources: this.#sources,
          release: (row, o) => this.#release(row, o),
          freeOrphan: (owner, eni) => this.#freeOrphan(owner, eni),
        }, req))
    );
  }

  /**
   * Frees an ENI held in the provider by an attachment without a row; the caller holds
   * the attachment's key. Under the ENI's lock it first checks that the ENI is still that
   * owner's and no attachment records it (a DEL and a new ADD may have raced the plan),
   * so a device another attachment now uses is never touched. Returns whether it freed it.
   */
  async #freeOrphan(owner: Owner, eni: { id: string; mac: string }): Promise<boolean> {
    return await this.#locks.run(`eni:${eni.id}`, async () => {
      if (this.state.byEni(eni.id)) return false;
      const now = (await this.#provider.list()).find((e) => e.id === eni.id);
      if (!now?.owner || keyOf(now.owner) !== keyOf(owner)) return false;
      const link = await this.#devices.findByMac(eni.mac);
      if (link) await this.#devices.unplug({ mac: eni.mac, nodeName: link.ifname, netns: null });
      await this.#provider.deallocateENI(owner);
      return true;
    });
  }

  // ---------------------------------------------------------------- reconcile

  reconcile(): Promise<ReconcileReport> {
    return this.#op(() => this.#locks.run("gc:pass", () => this.#reconcile()));
  }

  async #reconcile(): Promise<ReconcileReport> {
    const report: ReconcileReport = { rolledBack: 0, finished: 0, orphansFreed: 0, errors: [] };
    const log = this.#log.child({ op: "reconcile" });
    for (const row of this.state.inState("adding", "deleting")) {
      await this.#locks.run(`att:${keyOf(row)}`, async () => {
        const was = row.state;
        try {
          await this.#release(row, { netnsUsable: true });
          if (was === "adding") report.rolledBack++;
          else report.finished++;
          log.info(was === "adding" ? "Rolled back a half-done ADD" : "Finished a half-done DEL", {
            key: keyOf(row),
            eniId: row.eniId,
          });
        } catch (err) {
          report.errors.push(`${was} "${keyOf(row)}": ${message(err)}`);
        }
      });
    }
    let enis: Eni[];
    try {
      enis = (await this.#provider.list()).map((e) => EniSchema.parse(e));
    } catch (err) {
      report.errors.push(`Cannot list the provider's ENIs: ${message(err)}`);
      return report;
    }
    const rows = new Map(this.state.all().map((r) => [keyOf(r), r]));
    for (const e of enis) {
      if (!e.owner) continue;
      const k = keyOf(e.owner);
      const r = rows.get(k);
      if (!r) {
        await this.#locks.run(`att:${k}`, async () => {
          if (this.state.get(e.owner!)) return;
          try {
            if (!(await this.#freeOrphan(e.owner!, e))) return;
            report.orphansFreed++;
            log.info("Freed an ENI owned by an unknown attachment", { eniId: e.id, owner: k });
          } catch (err) {
            report.errors.push(`orphan "${e.id}" of "${k}": ${message(err)}`);
          }
        });
      } else if (r.eniId !== e.id) {
        report.errors.push(
          `Attachment "${k}" records ENI "${r.eniId}" but the provider shows it holding "${e.id}"`,
        );
      }
    }
    const byId = new Map(enis.map((e) => [e.id, e]));
    for (const r of rows.values()) {
      if (r.state !== "ready" && r.state !== "recycling" && r.state !== "held") continue;
      const e = r.eniId ? byId.get(r.eniId) : undefined;
      if (!e?.owner || keyOf(e.owner) !== keyOf(r)) {
        report.errors.push(
          `Attachment "${keyOf(r)}" holds ENI "${r.eniId}" but the provider shows it ${
            e?.owner ? `owned by "${keyOf(e.owner)}"` : e ? "free" : "missing"
          }`,
        );
      }
    }
    for (const e of report.errors) log.error("Reconcile problem", { problem: e });
    this.#reconciled = true;
    log.info("Reconcile done", { ...report, errors: report.errors.length });
    return report;
  }

  // ---------------------------------------------------------------- status

  async status(): Promise<Status> {
    const [ps, enis] = await Promise.all([this.#provider.status(), this.#provider.list()]);
    const rows = this.state.all();
    const byEni = new Map(rows.filter((r) => r.eniId).map((r) => [r.eniId!, r]));
    const out: Status["enis"] = [];
    for (const e of enis) {
      const r = byEni.get(e.id);
      let device = r?.nodeName ?? null;
      if (!r) device = (await this.#devices.findByMac(e.mac).catch(() => null))?.ifname ?? null;
      out.push({ ...e, device, attachment: r ? toAttachment(r) : null });
    }
    const profiles: Status["pool"]["profiles"] = {};
    const names = new Set([
      ...this.#provider.profiles().map((p) => p.name),
      ...Object.keys(ps.profiles),
    ]);
    for (const name of names) {
      const mine = rows.filter((r) => r.profile === name);
      profiles[name] = {
        free: ps.profiles[name]?.free ?? 0,
        owned: ps.profiles[name]?.owned ?? 0,
        recycling: mine.filter((r) => r.state === "recycling").length,
        held: mine.filter((r) => r.state === "held").length,
      };
    }
    return {
      version: VERSION,
      provider: this.#provider.name,
      ready: this.#reconciled && !this.#closed,
      canAllocate: ps.free > 0 || ps.attachable > 0,
      pool: {
        free: ps.free,
        owned: ps.owned,
        recycling: rows.filter((r) => r.state === "recycling").length,
        held: rows.filter((r) => r.state === "held").length,
        attachable: ps.attachable,
        profiles,
      },
      enis: out,
      providerDetails: ps.details,
    };
  }

  attachments() {
    return this.state.all().map(toAttachment);
  }

  enis(): Promise<Eni[]> {
    return this.#provider.list();
  }

  async close(): Promise<void> {
    this.#closed = true;
    await Promise.allSettled([...this.#inflight]);
    await this.#describer?.idle();
  }

  /** Resolves when every queued cloud description has been tried (tests). */
  descriptionsIdle(): Promise<void> {
    return this.#describer?.idle() ?? Promise.resolve();
  }
}
