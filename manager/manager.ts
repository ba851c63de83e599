/**
 * The ENI manager: ADD, DEL, CHECK, GC, reconcile and status over the provider,
 * the device layer and the SQLite state store. This module is the orchestrator:
 * it serializes and times each operation and hands it to its own module.
 *
 * | operation | module                                   |
 * | --------- | ---------------------------------------- |
 * | ADD       | `add.ts`, `place.ts` (rollback through `release.ts`) |
 * | DEL       | `del.ts` (hold or not), `release.ts`     |
 * | CHECK     | `check.ts`                               |
 * | GC        | `gc.ts` (liveness sources in `liveness/`) |
 * | reconcile | `reconcile.ts`                           |
 * | status    | `status.ts`                              |
 *
 * Why one file: the orchestrator's one job is the order and the locks of every
 * operation against the others (what an ADD waits for, what a DEL answers before, what
 * close() drains); split, those waits would be spread over files that each see half.
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
 *   provider deallocate → row deleted. A crash in between is finished. A sticky
 *   pod's DEL ends in `held` instead of the deallocate.
 *
 * Concurrency: a keyed async mutex serializes operations on one attachment key
 * (`att:<containerId>/<ifName>`) and one ENI (`eni:<id>`), always taken in that
 * order; different pods run in parallel and a slow provider call holds only its
 * own keys.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import type { Eni, Provider } from "../providers/contract.ts";
import type { DeviceLayer } from "../netns/types.ts";
import type { Logger } from "../lib/log.ts";
import type { PhaseRecorder } from "../lib/metrics.ts";
import { type AddResponse, ApiError, type GcReport, type Status } from "../api/schema.ts";
import type {
  AddInput,
  CheckInput,
  DelInput,
  EniManager,
  GcInput,
  PolicyHook,
  ReconcileReport,
} from "./types.ts";
import { StateStore } from "./state.ts";
import { keyOf, podKeyOf } from "../providers/schema.ts";
import { KeyedMutex, type LockProgress } from "./mutex.ts";
import { checkAttachment } from "./check.ts";
import { type LivenessSource, runGc } from "./gc.ts";
import { defaultLivenessSources } from "./liveness/mod.ts";
import { Describer, type DescriptionRecorder } from "./descriptions.ts";
import type { ManagerContext } from "./context.ts";
import { message } from "./context.ts";
import { toApiError } from "./errors.ts";
import { type OpTimer, timed } from "./op_timer.ts";
import { add } from "./add.ts";
import { del } from "./del.ts";
import { podReturns, release } from "./release.ts";
import { freeOrphan, reconcile } from "./reconcile.ts";
import { attachmentView, status } from "./status.ts";
import { withDeadline } from "../lib/async.ts";
import { HostLinks, sweepHostLinks } from "./host_link.ts";
import { type KeeperOptions, NodeRouteKeeper } from "./node_routes.ts";
import { hostLinkOf } from "./state.ts";
import { restoredPolicyPods } from "./policy.ts";
import { sleep } from "../lib/async.ts";

export { toApiError } from "./errors.ts";
export { buildResult } from "./result.ts";

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
  /**
   * Watch the node's addresses from the first reconcile on, to restore the node's routes
   * to pods when an address comes back (`node_routes.ts`; default off: the agent turns it
   * on). Off, the GC pass still restores them.
   */
  watchNodeAddresses?: boolean;
  /**
   * How often the node's host-link table is checked against what was loaded, and loaded
   * again when missing or changed (`checkHostLinkTable`), from the first reconcile on
   * (`hostLink.tableCheckSeconds`; default 0: only by the GC pass).
   */
  hostLinkTableCheckMs?: number;
  /** The host link's marks on the node (default `DEFAULT_MARKS` of `netns/host_link.ts`). */
  nodeMarks?: { node: number; kubeProxyMasquerade: number };
  /** The node route keeper's timings (tests). */
  nodeRoutes?: KeeperOptions;
  /** NetworkPolicy enforcement (the agent's enforcer); absent: off. */
  policy?: PolicyHook;
  /**
   * How long, in all, an ADD that finds no free ENI waits for DELs that have answered and
   * are still bringing theirs home (`timeouts.delWaitSeconds`; default 10 s).
   */
  delWaitMs?: number;
}

/** The manager, with its state store exposed for the agent and tests. */
export interface Manager extends EniManager {
  readonly state: StateStore;
  /** Resolves when every queued cloud description has been tried (tests). */
  descriptionsIdle(): Promise<void>;
  /**
   * Resolves when every DEL that has answered has also brought its device home; with
   * `boundMs`, no later than `boundMs` after the latest of them answered.
   */
  settled(boundMs?: number): Promise<void>;
}

/** Creates the ENI manager over a migrated state store in `db`. */
export function createManager(opts: ManagerOptions): Manager {
  return new ManagerImpl(opts);
}

class ManagerImpl implements Manager {
  readonly state: StateStore;
  readonly #ctx: ManagerContext;
  readonly #graceMs: number;
  readonly #sources: LivenessSource[];
  readonly #inflight = new Set<Promise<unknown>>();
  readonly #routes: NodeRouteKeeper;
  readonly #watchAddresses: boolean;
  /** Aborted by close(): cuts the waits between retries short. */
  readonly #stopping = new AbortController();
  #closed = false;
  readonly #tableCheckMs: number;
  #tableTimer: ReturnType<typeof setTimeout> | undefined;
  #tableCheck: Promise<void> | null = null;
  #reconciled = false;

  constructor(o: ManagerOptions) {
    const now = o.now ?? Date.now;
    const state = StateStore.open(o.db, now);
    this.state = state;
    // Read once: a closed database no longer tells it.
    const statePath = o.db.location() ?? "the state database";
    this.#graceMs = o.gcGraceMs;
    this.#sources = o.livenessSources ?? defaultLivenessSources();
    this.#ctx = {
      state,
      provider: o.provider,
      devices: o.devices,
      log: o.log,
      locks: new KeyedMutex(),
      now,
      metrics: o.metrics,
      holdMs: o.stickyHoldMs ?? 300_000,
      describer: o.describeAs
        ? new Describer(o.provider, o.log.child({ op: "describe" }), o.describeAs, o.metrics)
        : null,
      apiError: (err) => toApiError(err, statePath),
      addAnswered: new Map(),
      hostLinks: new HostLinks(o.devices, o.log.child({ op: "host_link" }), state, o.nodeMarks),
      releasing: new Map(),
      policy: o.policy ?? null,
      delWaitMs: o.delWaitMs ?? 10_000,
      stopping: this.#stopping.signal,
    };
    const ctx = this.#ctx;
    this.#routes = new NodeRouteKeeper({
      state,
      devices: o.devices,
      locks: ctx.locks,
      log: o.log.child({ op: "node_routes" }),
      hostLinks: ctx.hostLinks,
    }, o.nodeRoutes);
    this.#watchAddresses = o.watchNodeAddresses ?? false;
    this.#tableCheckMs = o.hostLinkTableCheckMs ?? 0;
  }

  /** Tracks an operation so close() can wait for it; its errors reach clients as ApiError. */
  #op<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#closed) return Promise.reject(new ApiError("busy", "The agent is shutting down"));
    const p = fn().catch((err) => {
      throw this.#ctx.apiError(err);
    });
    this.#inflight.add(p);
    p.finally(() => this.#inflight.delete(p)).catch(() => {});
    return p;
  }

  /** Runs `fn` timed as `op`, under the attachment's lock (the wait timed as queue_wait). */
  #keyed<T>(op: string, key: string, fn: (t: OpTimer) => Promise<T>): Promise<T> {
    return this.#op(() =>
      timed(this.#ctx, op, key, (t) => {
        const since = performance.now();
        return this.#ctx.locks.run(`att:${key}`, () => {
          t.waited(since);
          return fn(t);
        });
      })
    );
  }

  add(req: AddInput): Promise<AddResponse> {
    const key = keyOf(req);
    return this.#keyed("add", key, async (t) => {
      // A new sandbox of a pod whose old one's DEL is releasing its ENI: no reuse wait.
      podReturns(this.#ctx, podKeyOf(req.pod), req.pod.uid);
      // Its device and host link still hold their names there. (One that needs their ENI
      // waits for them in add.ts, before it takes one.)
      if (this.#sameNetnsReleasing(req)) await t.time("del_wait", () => this.settled());
      const r = await add(this.#ctx, req, t);
      // Still under the attachment's lock: a GC reclaim waiting for it sees this.
      this.#ctx.addAnswered.set(key, { mono: performance.now(), at: this.#ctx.now() });
      return r;
    });
  }

  /**
   * A plain pod's DEL answers once its intent is recorded (`deleting`) and the pod's
   * namespace is held by the agent (release.ts `answer`): the device's move home, the
   * provider and the row's removal follow on the attachment's lock. The kernel's move
   * alone costs more than the rest of the DEL; nothing the runtime does next can undo
   * it (the namespace outlives its path while held; a crash leaves a `deleting` row
   * that reconcile finishes), and every later call on the attachment, every ADD that
   * needs an ENI and every read of the state waits for it. A namespace named by
   * `/proc/<pid>/ns/net` (cri-dockerd) cannot be held open by the agent: that DEL
   * answers after the move home. A sticky pod's DEL answers once its hold is recorded,
   * and removes its host link after that answer (del.ts).
   */
  del(req: DelInput): Promise<void> {
    const ctx = this.#ctx;
    const key = keyOf(req);
    // Its DEL has answered and is finishing (containerd's RemovePodSandbox sends a second
    // DEL, with CNI_NETNS="", right after the first): nothing is left for this one to do,
    // and a failure of that rest is GC's, as after any DEL.
    if (ctx.releasing.has(key)) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      // `answer` runs inside the lock, so after `whole` is assigned (KeyedMutex.run awaits).
      const whole: Promise<void> = this.#keyed("del", key, (t) =>
        del(ctx, req, t, () => {
          const rest = whole.catch((err) => this.#finishAnswered(req, err));
          ctx.releasing.set(key, {
            netns: req.netns,
            rest,
            answeredAt: ctx.now(),
            answeredMono: performance.now(),
          });
          rest.finally(() => ctx.releasing.delete(key));
          resolve();
        }));
      whole.then(resolve, reject);
    });
  }

  /**
   * The rest of a DEL that answered early failed. A state write that failed (the disk
   * full, the store read-only) is not the runtime's to retry, told success already: it
   * is counted and tried again, 0.5 s later doubling to 30 s, until the record is written,
   * the row is no longer `deleting` (GC or an ADD of the key finished it), or the agent
   * stops (reconcile finishes a `deleting` row at the next start). Meanwhile the DEL
   * counts as finishing (`ctx.releasing`). Any other failure is on the row, for GC.
   * Never throws.
   */
  async #finishAnswered(req: DelInput, err: unknown): Promise<void> {
    const ctx = this.#ctx;
    const key = keyOf(req);
    for (let waitMs = 500;; waitMs = Math.min(waitMs * 2, 30_000)) {
      const apiErr = ctx.apiError(err);
      if (apiErr.code !== "state_unavailable") {
        ctx.log.error("A DEL that had answered could not finish; GC will retry", {
          key,
          error: apiErr.message,
        });
        return;
      }
      ctx.metrics?.answeredDelStateFailed?.();
      ctx.log.error("A DEL that had answered could not write the state; retrying", {
        key,
        retryInMs: waitMs,
        error: apiErr.message,
      });
      await sleep(waitMs, this.#stopping.signal);
      if (this.#closed) {
        ctx.log.warn("The agent stops before a DEL's state was written; its next start does it", {
          key,
        });
        return;
      }
      try {
        await this.#keyed("del", key, async (t) => {
          if (ctx.state.get(req)?.state !== "deleting") return;
          await del(ctx, req, t, () => {});
        });
        ctx.log.info("A DEL that had answered is written now", { key });
        return;
      } catch (e) {
        err = e;
      }
    }
  }

  /**
   * Whether a DEL that answered before its device was home (del below) is in the ADD's
   * namespace: then the ADD waits for it. An ADD that needs such a DEL's ENI waits for it
   * as it takes one (add.ts `DelWait`); any other goes on beside them.
   */
  #sameNetnsReleasing(req: AddInput): boolean {
    const ctx = this.#ctx;
    if (ctx.releasing.size === 0) return false;
    return [...ctx.releasing.values()].some((r) => r.netns === req.netns);
  }

  async settled(boundMs?: number): Promise<void> {
    const dels = [...this.#ctx.releasing.values()];
    const all = Promise.all(dels.map((r) => r.rest)).then(() => {});
    if (boundMs === undefined) return await all;
    // A read: it waits for a DEL that has just answered, not for one stuck (a throttled
    // cloud retried up to providerSeconds): that one it shows as unfinished.
    const until = dels.length > 0
      ? Math.max(...dels.map((r) => r.answeredMono)) + boundMs
      : performance.now() + boundMs;
    const settling = all.catch(() => {}); // a read never fails on a DEL's rest
    const left = until - performance.now();
    if (left <= 0) return;
    await withDeadline(settling, left, () => new Error("not settled")).catch(() => {});
  }

  check(req: CheckInput): Promise<void> {
    return this.#keyed("check", keyOf(req), () => checkAttachment(this.#ctx, req));
  }

  gc(req: GcInput): Promise<GcReport> {
    // When the request came: an ADD answered after it outranks the pass (it may queue).
    const receivedAt = performance.now();
    return this.#op(async () => {
      const ctx = this.#ctx;
      const report = await ctx.locks.run("gc:pass", () =>
        runGc(
          {
            state: ctx.state,
            provider: ctx.provider,
            devices: ctx.devices,
            log: ctx.log.child({ op: "gc" }),
            locks: ctx.locks,
            now: ctx.now,
            graceMs: this.#graceMs,
            sources: this.#sources,
            release: (row, o) => release(ctx, row, o),
            addAnsweredAt: (key) => ctx.addAnswered.get(key),
            delAnsweredAt: (key) => ctx.releasing.get(key)?.answeredAt,
            freeOrphan: (owner, eni) => freeOrphan(ctx, owner, eni),
          },
          req,
          { receivedAt },
        ));
      for (const i of report.items) {
        if (i.outcome !== "planned") ctx.metrics?.gcReclaim(i.outcome);
        if (i.kind === "hold" && i.outcome === "reclaimed") ctx.metrics?.holdExpired?.(i.profile);
        if (i.kind === "park" && i.outcome === "reclaimed") {
          ctx.log.info("The sticky pod's node hold ended; its ENI is parked in the VPC", {
            eniId: i.eniId,
            pod: i.pod,
          });
        }
      }
      // The agent's own pass (not a runtime's CNI GC, not a dry run): host links too.
      if (!req.dryRun && req.validAttachments === undefined) await this.#hostLinkUpkeep("gc");
      return report;
    });
  }

  reconcile(): Promise<ReconcileReport> {
    return this.#op(async () => {
      // The ready pods go to the enforcer first: it renders no table before it has them
      // (a node table rendered without them would drop their chains until they came),
      // and keeps their tables until it has synced. One reconcile releases is forgotten
      // by its release, as any.
      this.#ctx.policy?.restore(restoredPolicyPods(this.#ctx.state.all()));
      const { report, complete } = await this.#ctx.locks.run(
        "gc:pass",
        () => reconcile(this.#ctx),
      );
      const problem = await this.#hostLinkUpkeep("reconcile");
      if (problem) report.errors.push(problem);
      if (complete) this.#reconciled = true;
      if (this.#watchAddresses) this.#routes.start();
      this.#startTableCheck();
      return report;
    });
  }

  /**
   * Host links whose attachment is gone are removed (a pod deleted without DEL takes
   * its pair with it; an ADD killed mid-way may leave one), and the node's nftables
   * table is loaded again while any attachment has a link (a firewall reload may
   * have flushed it), and the node's routes to pods are restored where the kernel
   * dropped them (`node_routes.ts`). Returns a problem, never throws.
   */
  async #hostLinkUpkeep(op: string): Promise<string | null> {
    const ctx = this.#ctx;
    const log = ctx.log.child({ op });
    try {
      await sweepHostLinks(ctx.devices, ctx.state, log);
      const rules = await ctx.devices.sweepHostLinkRules();
      if (rules > 0) log.info("Removed host-link rules whose node end is gone", { rules });
      if (ctx.state.all().some((r) => hostLinkOf(r) !== null)) {
        await ctx.hostLinks.ensureTable(true);
      }
      await this.#routes.pass();
      return null;
    } catch (err) {
      const problem = `Host links: ${message(err)}`;
      log.error("Host link upkeep failed", { error: message(err) });
      return problem;
    }
  }

  status(): Promise<Status> {
    return status(this.#ctx, this.ready);
  }

  /** What `status().ready` says, without reading the state: reconciled and not closed. */
  get ready(): boolean {
    return this.#reconciled && !this.#closed;
  }

  progress(): LockProgress {
    return this.#ctx.locks.progress();
  }

  /**
   * Checks the node's host-link table against what was loaded, and loads it again when it
   * is missing or changed (`HostLinks.checkTable`); counted in the metrics.
   */
  async checkHostLinkTable(): Promise<"ok" | "missing" | "changed"> {
    if (this.#closed) return "ok";
    const finding = await this.#ctx.hostLinks.checkTable();
    if (finding !== "ok") this.#ctx.metrics?.tableRepaired?.("host_link", "node");
    return finding;
  }

  attachments() {
    return this.state.all().map((r) => attachmentView(this.#ctx, r));
  }

  enis(): Promise<Eni[]> {
    return this.#ctx.provider.list();
  }

  /** The periodic check of the node's host-link table (once, from the first reconcile). */
  #startTableCheck(): void {
    if (this.#tableCheckMs <= 0 || this.#tableCheck || this.#closed) return;
    const tick = async () => {
      try {
        await this.checkHostLinkTable();
      } catch (err) {
        this.#ctx.log.warn("Cannot check the node's host-link table", { error: message(err) });
      }
      if (!this.#closed) {
        this.#tableTimer = setTimeout(() => this.#tableCheck = tick(), this.#tableCheckMs);
      }
    };
    this.#tableTimer = setTimeout(() => this.#tableCheck = tick(), this.#tableCheckMs);
    this.#tableCheck = Promise.resolve();
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#tableTimer);
    await this.#tableCheck;
    clearTimeout(this.#tableTimer);
    await this.#routes.close();
    this.#stopping.abort();
    await Promise.allSettled([...this.#inflight]);
    await this.#ctx.describer?.idle();
  }

  descriptionsIdle(): Promise<void> {
    return this.#ctx.describer?.idle() ?? Promise.resolve();
  }
}
