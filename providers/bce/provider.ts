/**
 * The BCE provider in exclusive mode (after CCE, reference §6).
 *
 * State lives in the agent's SQLite database (`_store.ts`): ready ENIs (free or
 * owned), intents (work in flight, with their clientTokens) and quarantined ENIs.
 *
 * **Node limit.** ENIs in the table (lost ones excepted) + intents + other ENIs
 * attached to the node (seen at the last list) never exceed the limit
 * (`_limit.ts`). The check and the reservation (inserting the intent) run in one
 * synchronous section, so no interleaving of parallel allocations can overshoot.
 * Quarantined ENIs do not count: their slot is freed, and should BCE still count
 * them, the attach that overshoots fails with a quota error and new ENIs wait.
 *
 * **The pool pass** (`_schedule.ts`) lists ENIs once: this instance's, or the whole
 * VPC's when an orphan scan is due. From that one list it finds ENIs that left the
 * node out of band, adopts ENIs with our marker, counts foreign ones, checks
 * quarantined ones, resumes intents nobody works on, and grows or shrinks the
 * warm pool. It never waits on a stuck ENI: an ENI stuck in `attaching` or
 * `detaching` is escalated once (detach, then delete anyway) and, if BCE refuses,
 * quarantined with a status field and an error line an operator can act on.
 *
 * **Out-of-band changes.** An ENI that left the node is confirmed with one detail
 * call. A free one is dropped from the pool (and deleted when it is ours and
 * available). An owned one is kept, marked *lost*, so the manager still sees the
 * attachment: the status details list it, an error line names the pod, and the
 * owner's DEL or the GC release forgets it (a device that vanished with it cannot
 * be repaired: {@linkcode BceProvider.repairDevice} says so at once).
 *
 * @module
 */
import ipaddr from "ipaddr.js";
import {
  type AllocationRequest,
  type AllocationRequestInput,
  AllocationRequestSchema,
  DEFAULT_PROFILE,
  defaultProfile,
  type Eni,
  type EniAddress,
  EniAddressSchema,
  eniMatches,
  type Owner,
  OwnerSchema,
  type ProfileInfo,
  type Provider,
  type ProviderContext,
  ProviderError,
  type ProviderStatus,
} from "../contract.ts";
import type { Logger } from "../../lib/log.ts";
import { type BceClient, type BceEni, sleep } from "./client.ts";
import { BceApiError, isEniGone } from "./errors.ts";
import { BceStore, type EniRow, type IntentRow } from "./_store.ts";
import { type NodeLimit, resolveNodeLimit } from "./_limit.ts";
import { PassScheduler } from "./_schedule.ts";

/** Timings of {@linkcode BceProvider} (config `timeouts`, in milliseconds). */
export interface BceTimings {
  attachMs: number;
  detachMs: number;
  escalateMs: number;
  createVisibilityMs: number;
  deviceMs: number;
  pollMs: number;
  poolIntervalMs: number;
  idleIntervalMs: number;
  orphanScanIntervalMs: number;
  quarantineRetryMs: number;
  minPassGapMs: number;
  jitter: number;
}

/** Settings of {@linkcode BceProvider} (resolved from the config). */
export interface BceProviderOptions {
  client: BceClient;
  instanceId: string;
  vpcId: string;
  subnetId: string;
  /** Known subnet CIDRs (id → CIDR); others are looked up. */
  subnetCidrs?: Record<string, string>;
  /** Known subnet IPv6 CIDRs (id → CIDR). */
  subnetIpv6Cidrs?: Record<string, string>;
  securityGroupIds: string[];
  enterpriseSecurityGroupIds: string[];
  namePrefix: string;
  description: string;
  /** A cap on the node limit, and its fallback when BCE does not tell. */
  maxEnisPerNode?: number;
  /** IPv6 on new ENIs. */
  ipv6: "auto" | "always" | "never";
  warmPool: { minIdle: number; maxIdle: number };
  timings: BceTimings;
  /** The jitter source (tests seed it). */
  random?: () => number;
}

/** An ENI did not reach a status in time: stuck in `attaching` or `detaching`. */
export class BceStuckError extends ProviderError {
  readonly eniId: string;
  /** The status it stayed in. */
  readonly status: string;
  constructor(eniId: string, status: string, message: string) {
    super("unavailable", message);
    this.name = "BceStuckError";
    this.eniId = eniId;
    this.status = status;
  }
}

/** How disposing of an ENI ended. */
type Disposal = "deleted" | "gone" | "not-ours" | "elsewhere" | "quarantined";

/** The BCE exclusive-mode provider. */
export class BceProvider implements Provider {
  readonly name = "bce";
  #o: BceProviderOptions;
  #t: BceTimings;
  #store: BceStore;
  #log: Logger;
  #ctx: ProviderContext;
  #limit: NodeLimit;
  #limitTriedAt = 0;
  /** Other ENIs attached (or attaching) to this node at the last list: not ours, or untracked. */
  #foreign = new Set<string>();
  /** ENIs attached to this node at the last list (any owner), to notice slots freeing up. */
  #attachedCount = 0;
  #lastSnapshot = "";
  #synced = false;
  #syncing: Promise<boolean> | null = null;
  #ownerOps = new Map<string, Promise<Eni>>();
  /** Intent ids and quarantined ENI ids some task is working on now. */
  #active = new Set<string>();
  #bg = new Set<Promise<unknown>>();
  #closed = new AbortController();
  #scheduler: PassScheduler;
  #started = false;
  #lastOrphanScan = 0;
  /** New ENIs wait until then after BCE refused an attach with a quota error. */
  #quotaBlockedUntil = 0;
  /** When repairDevice last found an ENI attached here, by id. */
  #repairChecked = new Map<string, number>();
  #cidrs = new Map<string, string>();
  #cidrs6 = new Map<string, string | null>();

  constructor(opts: BceProviderOptions, ctx: ProviderContext) {
    this.#o = opts;
    this.#t = opts.timings;
    this.#ctx = ctx;
    this.#log = ctx.log.child({ provider: "bce", instanceId: opts.instanceId });
    for (const [k, v] of Object.entries(opts.subnetCidrs ?? {})) this.#cidrs.set(k, v);
    for (const [k, v] of Object.entries(opts.subnetIpv6Cidrs ?? {})) this.#cidrs6.set(k, v);
    this.#store = new BceStore(ctx.db);
    this.#limit = {
      max: opts.maxEnisPerNode ?? 0,
      source: opts.maxEnisPerNode ? "config" : "unresolved",
      configured: opts.maxEnisPerNode ?? null,
      quotaApi: null,
      instanceEniQuota: null,
      instanceCpuCount: null,
      errors: [],
    };
    this.#scheduler = new PassScheduler({
      baseMs: this.#t.poolIntervalMs,
      idleMs: this.#t.idleIntervalMs,
      minGapMs: this.#t.minPassGapMs,
      jitter: this.#t.jitter,
      random: opts.random,
      run: () => this.#pass(),
      onError: (e) => this.#log.warn("Warm pool pass failed", { error: e }),
    });
  }

  /** The node limit in force. */
  get maxEnisPerNode(): number {
    return this.#limit.max;
  }

  /** Pool passes run so far. */
  get passes(): number {
    return this.#scheduler.passes;
  }

  /** Resolves the node limit (never fatal) and syncs with the cloud once. */
  async init(): Promise<void> {
    await this.#resolveLimit();
    try {
      await this.#ensureSynced();
    } catch (e) {
      this.#log.warn("Initial BCE sync failed; will retry on first use", { error: e });
    }
  }

  // ---- Provider ----------------------------------------------------------------

  list(): Promise<Eni[]> {
    return Promise.resolve(this.#store.rows().map((r) => this.#toEni(r)));
  }

  async allocateNextENI(owner: Owner, request: AllocationRequestInput): Promise<Eni> {
    const o = OwnerSchema.parse(owner);
    const req = AllocationRequestSchema.parse(request);
    const key = ownerKey(o);
    const running = this.#ownerOps.get(key);
    if (running) return await running;
    const p = this.#allocate(o, req);
    this.#ownerOps.set(key, p);
    try {
      return await p;
    } finally {
      this.#ownerOps.delete(key);
      if (this.#store.freeRows().length < this.#o.warmPool.minIdle) this.#kick();
    }
  }

  async deallocateENI(owner: Owner): Promise<void> {
    const o = OwnerSchema.parse(owner);
    const running = this.#ownerOps.get(ownerKey(o));
    if (running) await running.catch(() => {});
    const row = this.#store.rowOf(o);
    if (!row) return;
    if (row.lost_reason) {
      this.#store.drop(row.eni_id);
      this.#log.info("Forgot a lost ENI at its owner's release", {
        eniId: row.eni_id,
        owner: o,
        lost: row.lost_reason,
      });
      // Detached (not deleted) out of band: it may still exist, ours and available.
      this.#track(
        this.#dispose(row.eni_id, crypto.randomUUID(), "lost ENI released").catch((e) =>
          this.#log.warn("Cannot clean up a lost ENI; the orphan scan will retry", {
            eniId: row.eni_id,
            error: e,
          })
        ),
      );
      this.#kick();
      return;
    }
    this.#store.unassign(row.eni_id, Date.now());
    this.#log.info("ENI returned to the free pool", { eniId: row.eni_id, owner: o });
    if (this.#store.freeRows().length > this.#o.warmPool.maxIdle) this.#kick();
  }

  /** One profile for now: the provider's own subnet and groups, open to every namespace. */
  profiles(): ProfileInfo[] {
    return [defaultProfile({
      subnets: {
        ...(this.#o.subnetCidrs?.[this.#o.subnetId]
          ? { ipv4: this.#o.subnetCidrs[this.#o.subnetId] }
          : {}),
      },
      securityGroupIds: [...this.#o.securityGroupIds],
      enterpriseSecurityGroupIds: [...this.#o.enterpriseSecurityGroupIds],
    })];
  }

  status(): Promise<ProviderStatus> {
    const rows = this.#store.rows();
    const lost = rows.filter((r) => r.lost_reason !== null);
    const owned = rows.filter((r) => r.pod !== null).length;
    const intents = this.#store.intents();
    const quarantined = this.#store.quarantined();
    const now = Date.now();
    return Promise.resolve({
      name: this.name,
      free: rows.length - owned,
      owned,
      attachable: Math.max(0, this.#limit.max - this.#slotsUsed()),
      profiles: { [DEFAULT_PROFILE]: { free: rows.length - owned, owned } },
      details: {
        instanceId: this.#o.instanceId,
        maxEnisPerNode: this.#limit.max,
        limitSource: this.#limit.source,
        creating: intents.filter((i) => i.kind === "create" && i.phase === "active").length,
        releasing: intents.filter((i) => i.kind === "release").length,
        cleanup: intents.filter((i) => i.phase === "cleanup").length,
        otherAttached: this.#foreign.size,
        /** Owned ENIs deleted or detached out of band (a metric: should be 0). */
        lost: lost.length,
        lostEnis: lost.map((r) => ({
          eniId: r.eni_id,
          mac: r.mac,
          pod: r.pod,
          containerId: r.container_id,
          ifName: r.if_name,
          reason: r.lost_reason,
          since: new Date(r.lost_ms ?? now).toISOString(),
        })),
        /** ENIs stuck in attaching/detaching that BCE would not detach or delete (a metric: should be 0). */
        quarantined: quarantined.length,
        quarantinedEnis: quarantined.map((q) => ({
          eniId: q.eni_id,
          status: q.status,
          reason: q.reason,
          since: new Date(q.since_ms).toISOString(),
          tries: q.tries,
        })),
        quotaBlockedUntil: this.#quotaBlockedUntil > now
          ? new Date(this.#quotaBlockedUntil).toISOString()
          : null,
        ipv6: this.#o.ipv6,
        warmPool: this.#o.warmPool,
        passes: this.#scheduler.passes,
        passIntervalMs: this.#scheduler.intervalMs,
        apiCalls: this.#o.client.callCounts(),
      },
    });
  }

  /**
   * Called by the manager when a released ENI's device is found nowhere. A lost ENI
   * (deleted or detached out of band) cannot come back: say so at once. Otherwise one
   * detail call tells whether it is still attached here (BCE brings the device back
   * by itself) or has gone.
   */
  async repairDevice(eniId: string): Promise<void> {
    const row = this.#store.row(eniId);
    if (row?.lost_reason) {
      throw new ProviderError(
        "not_found",
        `ENI "${eniId}" was ${row.lost_reason}; its device cannot come back`,
      );
    }
    // The manager asks again while it waits for the device: one detail call per 10 s is enough.
    const checked = this.#repairChecked.get(eniId);
    if (checked !== undefined && Date.now() - checked < 10_000) return;
    let d: BceEni;
    try {
      d = await this.#o.client.getEni(eniId);
    } catch (e) {
      if (isEniGone(e) && row) this.#loseOrDrop(row, "deleted out of band");
      throw e;
    }
    if (d.instanceId !== this.#o.instanceId || d.status !== "inuse") {
      throw new ProviderError(
        "wrong_state",
        `ENI "${eniId}" is ${d.status}${
          d.instanceId ? ` on instance "${d.instanceId}"` : ""
        }, not attached to "${this.#o.instanceId}"`,
      );
    }
    this.#repairChecked.set(eniId, Date.now());
    for (const [id, at] of this.#repairChecked) {
      if (Date.now() - at >= 10_000) this.#repairChecked.delete(id);
    }
  }

  /** Starts the warm pool loop (first pass at once). */
  start(): Promise<void> {
    if (!this.#closed.signal.aborted && !this.#started) {
      this.#started = true;
      this.#scheduler.start();
    }
    return Promise.resolve();
  }

  async close(): Promise<void> {
    this.#closed.abort();
    this.#o.client.close();
    await this.#scheduler.stop();
    await Promise.allSettled([...this.#bg]);
  }

  // ---- the pool pass -------------------------------------------------------------

  /** Asks for a pass soon (only once the loop runs). */
  #kick(): void {
    if (this.#started) this.#scheduler.kick();
  }

  /** One pool pass (see the module doc); tests call it directly. */
  async maintainPool(): Promise<void> {
    await this.#pass();
  }

  /** One pass; resolves to whether anything changed (the scheduler backs off when not). */
  async #pass(): Promise<boolean> {
    if (this.#closed.signal.aborted) return false;
    let changed = false;
    if (this.#limit.source === "unresolved") changed = await this.#resolveLimit(true);
    const scan = Date.now() - this.#lastOrphanScan >= this.#t.orphanScanIntervalMs;
    changed = (await this.#sync(scan)) || changed;
    if (this.#closed.signal.aborted) return changed;
    const { minIdle, maxIdle } = this.#o.warmPool;
    const free = this.#store.freeRows();
    const creating =
      this.#store.intents().filter((i) =>
        i.kind === "create" && i.purpose === "pool" && i.phase === "active"
      ).length;
    const work: Promise<unknown>[] = [];
    if (Date.now() >= this.#quotaBlockedUntil) {
      for (let n = free.length + creating; n < minIdle; n++) {
        const intent = this.#reserve("pool", null);
        if (!intent) break;
        work.push(
          this.#finishCreate(intent).catch((e) => {
            this.#log.warn("Warm pool ENI creation failed", { error: e });
          }),
        );
      }
    }
    for (let n = free.length; n > maxIdle; n--) {
      const intent = this.#takeFreeForRelease();
      if (!intent) break;
      work.push(
        this.#release(intent).catch((e) => {
          this.#log.warn("Warm pool ENI release failed; will retry", { error: e });
        }),
      );
    }
    await Promise.all(work);
    return changed || work.length > 0 || this.#store.intentCount() > 0;
  }

  /**
   * Lists this node's ENIs (or the whole VPC's, for an orphan scan) and brings the
   * tables in line with the cloud. Public for tests and the first sync.
   */
  async reconcile(): Promise<void> {
    await this.#sync(false);
  }

  #sync(scan: boolean): Promise<boolean> {
    if (!this.#syncing) {
      this.#syncing = this.#reconcile(scan).then((changed) => {
        this.#synced = true;
        return changed;
      }).finally(() => {
        this.#syncing = null;
      });
    }
    return this.#syncing;
  }

  async #ensureSynced(): Promise<void> {
    if (!this.#synced) await this.#sync(false);
  }

  async #reconcile(scan: boolean): Promise<boolean> {
    const started = Date.now();
    const me = this.#o.instanceId;
    // The one list of this pass. Without the instanceId filter for an orphan scan:
    // available ENIs are attached to no instance.
    const listed = await this.#o.client.listEnis({
      vpcId: this.#o.vpcId,
      ...(scan ? {} : { instanceId: me }),
    });
    if (scan) this.#lastOrphanScan = started;
    const onNode = listed.filter((e) => e.instanceId === me);
    const byId = new Map(onNode.map((e) => [e.eniId, e]));
    let changed = false;

    // 1. Tracked ENIs that left the node. A row newer than the list may be missing
    // from it without having left; the detail call below tells (it is cheap to skip).
    for (const r of this.#store.rows()) {
      const e = byId.get(r.eni_id);
      if (e?.status === "inuse") {
        if (r.lost_reason) {
          this.#store.clearLost(r.eni_id, Date.now());
          this.#log.info("A lost ENI is attached to this node again", { eniId: r.eni_id });
          changed = true;
        }
        continue;
      }
      if (e?.status === "attaching" || r.lost_reason || r.updated_ms > started) continue;
      // Missing from the list (or detaching): one detail call tells why.
      let d: BceEni | null;
      try {
        d = await this.#o.client.getEni(r.eni_id);
      } catch (err) {
        if (!isEniGone(err)) {
          this.#log.warn("Cannot check an ENI missing from the list; will retry", {
            eniId: r.eni_id,
            error: err,
          });
          continue;
        }
        d = null;
      }
      if (d && d.instanceId === me && d.status === "inuse") continue; // the list lagged
      const why = d === null
        ? "deleted out of band"
        : `detached out of band (now ${d.status}${d.instanceId ? ` on "${d.instanceId}"` : ""})`;
      this.#loseOrDrop(r, why, d);
      changed = true;
    }

    // 2. Untracked ENIs on the node: adopt ours, count the others; recover quarantined ones.
    const rows = new Set(this.#store.rows().map((r) => r.eni_id));
    const intentEnis = new Set(
      this.#store.intents().map((i) => i.eni_id).filter((x) => x !== null),
    );
    const quarantined = new Map(this.#store.quarantined().map((q) => [q.eni_id, q]));
    const foreign = new Set<string>();
    let attached = 0;
    for (const e of onNode) {
      if (e.status !== "inuse" && e.status !== "attaching") continue;
      attached++;
      if (rows.has(e.eniId) || intentEnis.has(e.eniId)) continue;
      const q = quarantined.get(e.eniId);
      if (q && e.status === "attaching") continue;
      if (this.#isOurs(e) && e.status === "inuse") {
        if (await this.#adopt(e)) {
          if (q) {
            this.#store.unquarantine(e.eniId);
            this.#log.info("A quarantined ENI recovered (inuse); adopted into the pool", {
              eniId: e.eniId,
            });
          }
          changed = true;
          continue;
        }
      }
      foreign.add(e.eniId);
    }
    if (foreign.size !== this.#foreign.size) changed = true;
    this.#foreign = foreign;
    if (attached < this.#attachedCount) this.#quotaBlockedUntil = 0; // a slot freed up
    this.#attachedCount = attached;

    // 3. Quarantined ENIs: try again now and then (in the background, never awaited here).
    const now = Date.now();
    for (const q of this.#store.quarantined()) {
      if (this.#active.has(q.eni_id) || now - q.last_try_ms < this.#t.quarantineRetryMs) continue;
      this.#track(this.#retryQuarantined(q.eni_id));
    }

    // 4. Intents nobody works on (a crash, a failed cleanup): finish or clean up.
    for (const intent of this.#store.intents()) {
      if (this.#active.has(intent.id)) continue;
      const task = intent.kind === "release"
        ? this.#release(intent)
        : intent.phase === "cleanup"
        ? this.#cleanup(intent)
        : this.#finishCreate(intent);
      this.#track(task.catch((e) => {
        this.#log.warn("Resuming a BCE intent failed", { intent: intent.id, error: e });
      }));
      changed = true;
    }

    // 5. Orphans (whole-VPC list only).
    if (scan) changed = (await this.#collectOrphans(listed)) || changed;

    const snapshot = onNode.map((e) => `${e.eniId}:${e.status}`).sort().join(",");
    if (snapshot !== this.#lastSnapshot) changed = true;
    this.#lastSnapshot = snapshot;
    return changed;
  }

  /** A tracked ENI left the node: a free one is dropped (and cleaned up), an owned one is lost. */
  #loseOrDrop(r: EniRow, why: string, d: BceEni | null = null): void {
    if (r.pod === null) {
      this.#store.drop(r.eni_id);
      this.#log.warn("A free ENI left this node out of band; dropped from the pool", {
        eniId: r.eni_id,
        why,
      });
      if (d && d.status === "available" && this.#isOurs(d)) {
        this.#track(
          this.#dispose(r.eni_id, crypto.randomUUID(), "left the node").catch((e) =>
            this.#log.warn("Cannot delete an ENI that left the node", { eniId: r.eni_id, error: e })
          ),
        );
      }
      return;
    }
    if (r.lost_reason) return;
    this.#store.markLost(r.eni_id, why, Date.now());
    this.#log.error(
      "An ENI owned by a pod was changed out of band: the pod's interface has no ENI behind it",
      {
        eniId: r.eni_id,
        mac: r.mac,
        owner: { pod: r.pod, containerId: r.container_id, ifName: r.if_name },
        why,
        action: `Delete or restart pod "${r.pod}"; enim forgets the ENI at the pod's DEL or GC`,
      },
    );
  }

  /**
   * Deletes ENIs this node created (name `<prefix>/<instanceId>/…`, matched here, not
   * by BCE's name filter) that are `available` and known to no row, intent or
   * quarantine entry: leftovers of a crash or of a detach by someone else.
   */
  async #collectOrphans(listed: BceEni[]): Promise<boolean> {
    const mine = `${this.#o.namePrefix}/${this.#o.instanceId}/`;
    const intents = this.#store.intents();
    const known = new Set([
      ...this.#store.rows().map((r) => r.eni_id),
      ...intents.map((i) => i.eni_id).filter((x) => x !== null),
      ...this.#store.quarantined().map((q) => q.eni_id),
    ]);
    const names = new Set(intents.map((i) => i.name));
    let found = false;
    for (const e of listed) {
      if (e.status !== "available" || !e.name.startsWith(mine)) continue;
      if (known.has(e.eniId) || names.has(e.name)) continue;
      found = true;
      try {
        await this.#o.client.deleteEni(e.eniId, crypto.randomUUID());
        this.#log.info("Deleted an orphaned ENI of this node", { eniId: e.eniId, name: e.name });
      } catch (err) {
        if (!isEniGone(err)) {
          this.#log.warn("Cannot delete an orphaned ENI", { eniId: e.eniId, error: err });
        }
      }
    }
    return found;
  }

  /** Adopts an attached ENI with our marker into the free pool (from a list entry: no call). */
  async #adopt(e: BceEni): Promise<boolean> {
    if (e.status !== "inuse" || e.instanceId !== this.#o.instanceId || !this.#isOurs(e)) {
      return false;
    }
    if (!e.macAddress) return false;
    const eni = await this.#eniFromDetail(e, null);
    if (this.#store.row(e.eniId) || this.#store.intents().some((i) => i.eni_id === e.eniId)) {
      return true;
    }
    this.#store.insert(eni, null, Date.now());
    this.#log.info("Adopted an attached ENI with our marker into the free pool", {
      eniId: e.eniId,
    });
    return true;
  }

  // ---- node limit ----------------------------------------------------------------

  /** Resolves the node limit; when `retry`, at most once a minute. Resolves to whether it changed. */
  async #resolveLimit(retry = false): Promise<boolean> {
    if (retry && Date.now() - this.#limitTriedAt < 60_000) return false;
    this.#limitTriedAt = Date.now();
    const before = this.#limit.max;
    const limit = await resolveNodeLimit(
      this.#o.client,
      this.#o.instanceId,
      this.#o.maxEnisPerNode,
    );
    this.#limit = limit;
    const fields = {
      maxEnisPerNode: limit.max,
      source: limit.source,
      configured: limit.configured,
      eniQuotaApi: limit.quotaApi,
      instanceEniQuota: limit.instanceEniQuota,
      instanceCpuCount: limit.instanceCpuCount,
      ...(limit.errors.length ? { problems: limit.errors } : {}),
    };
    if (limit.source === "unresolved") {
      this.#log.error(
        "Cannot tell this node's ENI limit: BCE did not answer and maxEnisPerNode is not set; no new ENI until it is known (set provider.bce.maxEnisPerNode, or check the credentials' BCC read access)",
        fields,
      );
    } else {
      this.#log.info(`Node ENI limit ${limit.max}, from ${limit.source}`, fields);
    }
    return limit.max !== before;
  }

  // ---- allocation ----------------------------------------------------------------

  async #allocate(owner: Owner, req: AllocationRequest): Promise<Eni> {
    const held = this.#store.rowOf(owner);
    if (held) return this.#toEni(held);
    const picked = this.#pickFree(owner, req);
    if (picked) return picked;

    await this.#ensureSynced();
    // The sync awaited: look again before creating.
    const again = this.#pickFree(owner, req);
    if (again) return again;
    if (this.#limit.source === "unresolved") await this.#resolveLimit(true);

    const wantIp = req.ips.find((ip) => ipaddr.IPv4.isValid(ip)) ?? null;
    // Known before reserving, so nothing after the create can fail on it.
    const cidr = await this.#cidr(this.#o.subnetId);
    const unreachable = req.ranges.find((set) => !set.some((r) => overlaps(r.subnet, cidr)));
    if (unreachable) {
      throw new ProviderError(
        "requested_ip_unavailable",
        `No free ENI matches the requested range ${
          JSON.stringify(unreachable.map((r) => r.subnet))
        } and it does not overlap subnet "${this.#o.subnetId}" (${cidr})`,
      );
    }
    if (req.ips.length > 0) {
      if (!wantIp || !inCidr(wantIp, cidr)) {
        throw new ProviderError(
          "requested_ip_unavailable",
          `No free ENI carries the requested IP ${
            JSON.stringify(req.ips)
          } and it is not in subnet "${this.#o.subnetId}" (${cidr})`,
        );
      }
    }
    const now = Date.now();
    if (now < this.#quotaBlockedUntil) {
      throw new ProviderError(
        req.ips.length ? "requested_ip_unavailable" : "no_eni_available",
        `No free ENI on instance "${this.#o.instanceId}", and BCE refused the last attach with a quota error; no new ENI before ${
          new Date(this.#quotaBlockedUntil).toISOString()
        }`,
      );
    }
    const intent = this.#reserve("owner", wantIp);
    if (!intent) {
      const used = this.#slotsUsed();
      throw new ProviderError(
        req.ips.length ? "requested_ip_unavailable" : "no_eni_available",
        `No free ENI on instance "${this.#o.instanceId}"${
          req.ips.length ? ` with IP ${JSON.stringify(req.ips)}` : ""
        } and the node is at its limit (${used} of ${this.#limit.max} ENIs attached or in flight; limit from ${this.#limit.source})`,
      );
    }
    let detail: BceEni;
    try {
      detail = await this.#materialize(intent);
    } catch (e) {
      if (e instanceof ProviderError && e.reason === "quota_exceeded") {
        throw new ProviderError(
          "no_eni_available",
          `No free ENI on instance "${this.#o.instanceId}": BCE refused to attach another (${e.message})`,
          { cause: e, requestId: e.requestId },
        );
      }
      throw e;
    }
    const eni = await this.#eniFromDetail(detail, null);
    if (!eniMatches(eni, req)) {
      this.#store.insert(eni, null, Date.now(), intent.id);
      this.#active.delete(intent.id);
      throw new ProviderError(
        "requested_ip_unavailable",
        `The new ENI "${detail.eniId}" (${eni.ipv4?.address}) does not match the requested ranges; it joined the free pool`,
      );
    }
    this.#store.insert(eni, owner, Date.now(), intent.id);
    this.#active.delete(intent.id);
    this.#log.info("Allocated a new ENI", { eniId: detail.eniId, owner });
    return { ...eni, state: "owned", owner };
  }

  /** Assigns a free matching ENI to `owner` (synchronous: atomic against other allocations). */
  #pickFree(owner: Owner, req: AllocationRequest): Eni | null {
    for (const row of this.#store.freeRows()) {
      const eni = this.#toEni(row);
      if (!eniMatches(eni, req)) continue;
      if (!this.#store.assign(row.eni_id, owner, Date.now())) continue;
      this.#log.info("Allocated a free ENI", { eniId: row.eni_id, owner });
      return { ...eni, state: "owned", owner };
    }
    return null;
  }

  /** ENIs counted against the node limit now (lost and quarantined ones are not). */
  #slotsUsed(): number {
    return this.#store.slotRows() + this.#store.intentCount() + this.#foreign.size;
  }

  /**
   * Checks the node limit and reserves a slot by recording a create intent with
   * a fresh clientToken, in one synchronous section. Null when at the limit.
   */
  #reserve(purpose: "owner" | "pool", requestedIp: string | null): IntentRow | null {
    if (this.#closed.signal.aborted) return null;
    if (this.#slotsUsed() >= this.#limit.max) return null;
    const token = crypto.randomUUID();
    const suffix = Array.from(
      crypto.getRandomValues(new Uint8Array(3)),
      (b) => b.toString(16).padStart(2, "0"),
    ).join("");
    const intent: IntentRow = {
      id: token,
      kind: "create",
      client_token: token,
      name: `${this.#o.namePrefix}/${this.#o.instanceId}/${suffix}`.slice(0, 65),
      eni_id: null,
      requested_ip: requestedIp,
      purpose,
      phase: "active",
      created_ms: Date.now(),
    };
    this.#store.insertIntent(intent);
    this.#active.add(intent.id);
    return intent;
  }

  /**
   * Creates (or finds, via its clientToken), attaches and readies the ENI of an intent.
   * A not-found right after the create is BCE catching up: retried for `createVisibilityMs`.
   * An ENI still `attaching` after `attachMs` (counted from the intent, so a restart does
   * not restart the clock) is stuck: the intent is cleaned up, which escalates.
   */
  async #materialize(intent: IntentRow): Promise<BceEni> {
    this.#active.add(intent.id);
    const c = this.#o.client;
    try {
      let eniId = intent.eni_id;
      let visibleFrom = intent.created_ms;
      if (!eniId) {
        const ipv6 = await this.#wantIpv6();
        eniId = await c.createEni({
          name: intent.name,
          subnetId: this.#o.subnetId,
          securityGroupIds: this.#o.securityGroupIds,
          enterpriseSecurityGroupIds: this.#o.enterpriseSecurityGroupIds,
          privateIpAddress: intent.requested_ip ?? undefined,
          ipv6,
          description: this.#o.description,
        }, intent.client_token);
        intent.eni_id = eniId;
        visibleFrom = Date.now();
        this.#store.setIntentEni(intent.id, eniId);
        this.#log.info("Created an ENI", { eniId, clientToken: intent.client_token, ipv6 });
      }
      const id = eniId;
      const visibleBy = visibleFrom + this.#t.createVisibilityMs;
      let d = await this.#untilVisible(id, visibleBy, () => c.getEni(id));
      if (d.status === "available") {
        try {
          await this.#untilVisible(
            id,
            visibleBy,
            () => c.attachEni(id, this.#o.instanceId, `${intent.client_token}-attach`),
          );
        } catch (e) {
          if (e instanceof ProviderError && e.reason === "quota_exceeded") {
            this.#quotaBlockedUntil = Date.now() + this.#t.quarantineRetryMs;
            this.#log.warn(
              "BCE refused an attach: this instance is at its ENI quota; no new ENI for a while",
              {
                eniId: id,
                until: new Date(this.#quotaBlockedUntil).toISOString(),
                slotsUsed: this.#slotsUsed(),
                maxEnisPerNode: this.#limit.max,
                limitSource: this.#limit.source,
                error: e,
              },
            );
            throw e;
          }
          if (!(e instanceof BceApiError) || e.retryable || e.status < 400 || e.status >= 500) {
            throw e;
          }
          // A 4xx BCE gives no documented code for (e.g. the ENI is not available any
          // more, or our earlier attach went through): decide from the ENI itself.
          d = await c.getEni(id);
          if (d.instanceId !== this.#o.instanceId) throw e;
        }
      } else if (d.instanceId && d.instanceId !== this.#o.instanceId) {
        throw new ProviderError(
          "wrong_state",
          `ENI "${id}" is attached to instance "${d.instanceId}", not "${this.#o.instanceId}"`,
        );
      }
      d = await this.#waitStatus(
        id,
        "inuse",
        Math.max(intent.created_ms + this.#t.attachMs, Date.now()),
      );
      if (this.#ctx.waitForDevice) {
        await this.#ctx.waitForDevice(d.macAddress, this.#t.deviceMs);
      }
      if (d.ipv6PrivateIpSet.length === 0 && await this.#wantIpv6()) {
        this.#log.warn("Asked BCE for an IPv6 address but the ENI has none", { eniId: id });
      }
      return d;
    } catch (e) {
      await this.#abandon(intent, e);
      throw e;
    }
  }

  /** Runs `fn` again while BCE says the ENI does not exist, until `until` (eventual consistency). */
  async #untilVisible<T>(eniId: string, until: number, fn: () => Promise<T>): Promise<T> {
    let delay = Math.min(this.#t.pollMs, 1000);
    let logged = false;
    for (;;) {
      try {
        return await fn();
      } catch (e) {
        if (!isEniGone(e) || Date.now() + delay > until || this.#closed.signal.aborted) throw e;
        if (!logged) {
          logged = true;
          this.#log.info("A new ENI is not visible yet; retrying", {
            eniId,
            code: e instanceof BceApiError ? e.code : undefined,
          });
        }
        await sleep(delay, this.#closed.signal);
        delay = Math.min(1000, delay * 2);
      }
    }
  }

  /** Finishes a create intent into the free pool (pool growth, or resuming after a restart). */
  async #finishCreate(intent: IntentRow): Promise<void> {
    const d = await this.#materialize(intent);
    this.#store.insert(await this.#eniFromDetail(d, null), null, Date.now(), intent.id);
    this.#active.delete(intent.id);
    this.#log.info("ENI joined the free pool", { eniId: d.eniId });
  }

  /** After a failed create/attach: undo what the cloud did, or leave it for the loop. */
  async #abandon(intent: IntentRow, cause: unknown): Promise<void> {
    this.#log.warn("Creating or attaching an ENI failed; cleaning up", {
      eniId: intent.eni_id,
      error: cause,
    });
    this.#store.setIntentPhase(intent.id, "cleanup");
    intent.phase = "cleanup";
    if (this.#closed.signal.aborted) {
      this.#active.delete(intent.id);
      return;
    }
    await this.#cleanup(intent).catch((e) => {
      this.#log.warn("ENI cleanup failed; the pool loop will retry", {
        eniId: intent.eni_id,
        error: e,
      });
    });
  }

  /** Disposes of the ENI of a failed intent (detach, delete, or quarantine), then drops the intent. */
  async #cleanup(intent: IntentRow): Promise<void> {
    this.#active.add(intent.id);
    try {
      let eniId = intent.eni_id;
      if (!eniId) {
        // The create may have happened with its response lost: find it by its unique
        // name, matched here (the list's name filter is never relied on).
        const found = await this.#o.client.listEnis({
          vpcId: this.#o.vpcId,
          namePrefix: intent.name,
        });
        eniId = found.find((e) => e.name === intent.name)?.eniId ?? null;
      }
      if (eniId) await this.#dispose(eniId, intent.client_token, "failed create");
      this.#store.deleteIntent(intent.id);
    } finally {
      this.#active.delete(intent.id);
    }
  }

  /** Moves one free ENI into a release intent (synchronous). */
  #takeFreeForRelease(): IntentRow | null {
    const token = crypto.randomUUID();
    const intent = this.#store.takeFreeForRelease({
      id: token,
      kind: "release",
      client_token: token,
      name: "",
      requested_ip: null,
      purpose: "pool",
      phase: "active",
      created_ms: Date.now(),
    });
    if (intent) this.#active.add(intent.id);
    return intent;
  }

  async #release(intent: IntentRow): Promise<void> {
    this.#active.add(intent.id);
    try {
      const outcome = intent.eni_id
        ? await this.#dispose(intent.eni_id, intent.client_token, "surplus")
        : "gone";
      this.#store.deleteIntent(intent.id);
      this.#quotaBlockedUntil = 0; // a slot freed up
      this.#log.info("Released a surplus ENI", { eniId: intent.eni_id, outcome });
    } finally {
      this.#active.delete(intent.id);
    }
  }

  // ---- getting rid of an ENI: detach, delete, escalate, quarantine --------------------

  /**
   * Gets rid of an ENI of ours: detaches it from this node when attached here, deletes
   * it, and escalates when it is stuck. Bounded in time: at most `detachMs` waiting for a
   * normal detach, then `escalateMs` after the escalation's detach, then a delete whatever
   * the status; if BCE refuses that too, the ENI is quarantined.
   */
  async #dispose(eniId: string, token: string, why: string): Promise<Disposal> {
    const c = this.#o.client;
    let d = await this.#read(eniId);
    if (d === null) return "gone";
    if (!this.#isOurs(d)) {
      this.#log.warn("Refusing to delete an ENI without our marker", { eniId, name: d.name });
      return "not-ours";
    }
    const me = this.#o.instanceId;
    if (d.instanceId && d.instanceId !== me && d.status !== "available") {
      this.#log.warn("Not touching an ENI of ours attached to another instance", {
        eniId,
        instanceId: d.instanceId,
        status: d.status,
      });
      return "elsewhere";
    }
    if (d.status === "inuse") {
      await this.#detachQuietly(eniId, `${token}-detach`);
      d = await this.#pollUntilFree(eniId, Date.now() + this.#t.detachMs);
      if (d === null) return "gone";
    } else if (d.status === "detaching") {
      d = await this.#pollUntilFree(eniId, Date.now() + this.#t.detachMs);
      if (d === null) return "gone";
    }
    if (d.status === "available") return await this.#delete(eniId, `${token}-delete`);

    // Stuck in attaching, detaching (or inuse after a detach): escalate.
    this.#log.warn("ENI is stuck; escalating: detach, then delete", {
      eniId,
      status: d.status,
      why,
    });
    await this.#detachQuietly(eniId, `${token}-escalate`);
    d = await this.#pollUntilFree(eniId, Date.now() + this.#t.escalateMs);
    if (d === null) return "gone";
    if (d.status === "available") return await this.#delete(eniId, `${token}-delete`);
    try {
      await c.deleteEni(eniId, `${token}-force`);
      this.#log.info("Deleted a stuck ENI", { eniId, status: d.status });
      this.#store.unquarantine(eniId);
      return "deleted";
    } catch (e) {
      if (isEniGone(e)) return "gone";
      if (!(e instanceof BceApiError) || e.retryable || e.status < 400 || e.status >= 500) {
        throw e;
      }
      this.#quarantine(
        eniId,
        d.status,
        `stuck in ${d.status} (${why}); BCE refused the delete: ${e.code}`,
      );
      return "quarantined";
    }
  }

  /** Records a stuck ENI and tells the operator what to do. */
  #quarantine(eniId: string, status: string, reason: string): void {
    const first = !this.#store.quarantined().some((q) => q.eni_id === eniId);
    this.#store.quarantine(eniId, status, reason, Date.now());
    const fields = {
      eniId,
      status,
      reason,
      retryInMs: this.#t.quarantineRetryMs,
      action:
        `In the BCE console (or with the ENI API), detach ENI "${eniId}" from instance "${this.#o.instanceId}" and delete it; enim checks it again every ${
          Math.round(this.#t.quarantineRetryMs / 1000)
        } s and forgets it once it is gone`,
    };
    if (first) {
      this.#log.error(
        "ENI quarantined: stuck and BCE refuses to detach or delete it; its node slot is freed",
        fields,
      );
    } else {
      this.#log.warn("ENI still quarantined", fields);
    }
  }

  /** Tries a quarantined ENI again: forgotten once gone, deleted once it can be, adopted when healthy. */
  async #retryQuarantined(eniId: string): Promise<void> {
    if (this.#active.has(eniId)) return;
    this.#active.add(eniId);
    try {
      const d = await this.#read(eniId);
      if (d === null) {
        this.#store.unquarantine(eniId);
        this.#log.info("A quarantined ENI is gone; forgotten", { eniId });
        return;
      }
      if (d.status === "inuse" && d.instanceId === this.#o.instanceId && await this.#adopt(d)) {
        this.#store.unquarantine(eniId);
        this.#log.info("A quarantined ENI recovered (inuse); adopted into the pool", { eniId });
        return;
      }
      const outcome = await this.#dispose(eniId, crypto.randomUUID(), "quarantine retry");
      if (outcome !== "quarantined") {
        this.#store.unquarantine(eniId);
        this.#log.info("A quarantined ENI is resolved", { eniId, outcome });
      }
    } catch (e) {
      this.#store.touchQuarantine(eniId, Date.now());
      this.#log.warn("Retrying a quarantined ENI failed", { eniId, error: e });
    } finally {
      this.#active.delete(eniId);
    }
  }

  /** The ENI's detail, null when it is gone. */
  async #read(eniId: string): Promise<BceEni | null> {
    try {
      return await this.#o.client.getEni(eniId);
    } catch (e) {
      if (isEniGone(e)) return null;
      throw e;
    }
  }

  /** Detaches from this node; a 4xx (not attached, wrong state) is left to the status polls. */
  async #detachQuietly(eniId: string, token: string): Promise<void> {
    try {
      await this.#o.client.detachEni(eniId, this.#o.instanceId, token);
    } catch (e) {
      if (isEniGone(e)) return;
      if (e instanceof BceApiError && !e.retryable && e.status >= 400 && e.status < 500) {
        this.#log.info("BCE refused a detach", { eniId, code: e.code, status: e.status });
        return;
      }
      throw e;
    }
  }

  async #delete(eniId: string, token: string): Promise<Disposal> {
    try {
      await this.#o.client.deleteEni(eniId, token);
      this.#log.info("Deleted an ENI", { eniId });
      return "deleted";
    } catch (e) {
      if (isEniGone(e)) return "gone";
      throw e;
    }
  }

  /** Polls until the ENI is `available` or gone (null), or the deadline passes (its last detail). */
  async #pollUntilFree(eniId: string, deadline: number): Promise<BceEni | null> {
    let delay = this.#t.pollMs;
    for (;;) {
      const d = await this.#read(eniId);
      if (d === null || d.status === "available") return d;
      if (Date.now() + delay > deadline || this.#closed.signal.aborted) return d;
      await sleep(delay, this.#closed.signal);
      delay = Math.min(5000, delay * 2);
    }
  }

  /** Polls an ENI until it reaches `status` (backoff from pollMs to 5 s) or the deadline passes. */
  async #waitStatus(eniId: string, status: string, deadline: number): Promise<BceEni> {
    let delay = this.#t.pollMs;
    const started = Date.now();
    for (;;) {
      const d = await this.#o.client.getEni(eniId);
      if (d.status === status) return d;
      if (Date.now() + delay > deadline || this.#closed.signal.aborted) {
        throw new BceStuckError(
          eniId,
          d.status,
          `ENI "${eniId}" did not become ${status} in time (waited ${
            Date.now() - started
          } ms; it is ${d.status})`,
        );
      }
      await sleep(delay, this.#closed.signal);
      delay = Math.min(5000, delay * 2);
    }
  }

  // ---- conversion ------------------------------------------------------------------

  async #eniFromDetail(d: BceEni, owner: Owner | null): Promise<Eni> {
    const v4 = d.privateIpSet.find((p) => p.primary) ?? d.privateIpSet[0];
    const v6 = d.ipv6PrivateIpSet[0];
    let ipv4: EniAddress | null = null;
    let ipv6: EniAddress | null = null;
    if (v4) {
      const cidr = await this.#cidr(d.subnetId);
      ipv4 = {
        address: v4.privateIpAddress,
        prefixLength: prefixOf(cidr),
        gateway: firstHost(cidr),
      };
    }
    if (v6) {
      const cidr6 = await this.#cidr6(d.subnetId);
      if (cidr6) {
        // BCE documents no IPv6 gateway; the first host of the range, as for IPv4
        // (CCE's exclusive mode reuses the IPv4 gateway for both families). UNVERIFIED.
        ipv6 = {
          address: v6.privateIpAddress,
          prefixLength: prefixOf(cidr6),
          gateway: firstHost(cidr6),
        };
      } else {
        this.#log.warn("ENI has an IPv6 address but its subnet's IPv6 range is unknown", {
          eniId: d.eniId,
          subnetId: d.subnetId,
        });
      }
    }
    return {
      id: d.eniId,
      mac: d.macAddress.toLowerCase(),
      ipv4,
      ipv6,
      subnetId: d.subnetId || null,
      state: owner ? "owned" : "free",
      owner,
      profile: DEFAULT_PROFILE,
      securityGroupIds: d.securityGroupIds ?? [],
      enterpriseSecurityGroupIds: d.enterpriseSecurityGroupIds ?? [],
      description: d.description ?? null,
      cloudState: "ok",
    };
  }

  async #cidr(subnetId: string): Promise<string> {
    const known = this.#cidrs.get(subnetId);
    if (known) return known;
    await this.#lookupSubnet(subnetId);
    return this.#cidrs.get(subnetId)!;
  }

  /** The subnet's IPv6 CIDR, null when it has none (or it cannot be told). */
  async #cidr6(subnetId: string): Promise<string | null> {
    if (this.#cidrs6.has(subnetId)) return this.#cidrs6.get(subnetId) ?? null;
    try {
      await this.#lookupSubnet(subnetId);
    } catch (e) {
      this.#log.warn("Cannot read the subnet's IPv6 range", { subnetId, error: e });
      return null;
    }
    return this.#cidrs6.get(subnetId) ?? null;
  }

  async #lookupSubnet(subnetId: string): Promise<void> {
    const s = await this.#o.client.getSubnet(subnetId);
    this.#cidrs.set(subnetId, s.cidr);
    this.#cidrs6.set(subnetId, s.ipv6Cidr || null);
  }

  /** Whether new ENIs ask for an IPv6 address. */
  async #wantIpv6(): Promise<boolean> {
    if (this.#o.ipv6 === "never") return false;
    if (this.#o.ipv6 === "always") return true;
    return (await this.#cidr6(this.#o.subnetId)) !== null;
  }

  #toEni(r: EniRow): Eni {
    const owner = r.pod && r.container_id && r.if_name
      ? { pod: r.pod, containerId: r.container_id, ifName: r.if_name }
      : null;
    return {
      id: r.eni_id,
      mac: r.mac,
      ipv4: r.ipv4 ? EniAddressSchema.parse(JSON.parse(r.ipv4)) : null,
      ipv6: r.ipv6 ? EniAddressSchema.parse(JSON.parse(r.ipv6)) : null,
      subnetId: r.subnet_id,
      state: owner ? "owned" : "free",
      owner,
      profile: DEFAULT_PROFILE,
      securityGroupIds: [...this.#o.securityGroupIds],
      enterpriseSecurityGroupIds: [...this.#o.enterpriseSecurityGroupIds],
      description: null,
      cloudState: r.lost_reason !== null ? "lost" : "ok",
    };
  }

  /** Whether an ENI carries this provider's marker (its name prefix). */
  #isOurs(e: { name: string }): boolean {
    return e.name.startsWith(`${this.#o.namePrefix}/`);
  }

  #track(p: Promise<unknown>): void {
    this.#bg.add(p);
    p.finally(() => this.#bg.delete(p));
  }
}

function ownerKey(o: Owner): string {
  return JSON.stringify([o.pod, o.containerId, o.ifName]);
}

function inCidr(ip: string, cidr: string): boolean {
  try {
    const [net, len] = ipaddr.parseCIDR(cidr);
    const a = ipaddr.parse(ip);
    return a.kind() === net.kind() && a.match(net, len);
  } catch {
    return false;
  }
}

/** Whether two CIDRs share an address (one contains the other's network address). */
function overlaps(a: string, b: string): boolean {
  try {
    const [na, la] = ipaddr.parseCIDR(a);
    const [nb, lb] = ipaddr.parseCIDR(b);
    if (na.kind() !== nb.kind()) return false;
    return na.match(nb, lb) || nb.match(na, la);
  } catch {
    return false;
  }
}

function prefixOf(cidr: string): number {
  return ipaddr.parseCIDR(cidr)[1];
}

/** The first host of a CIDR (network address + 1): BCE's subnet gateway. */
export function firstHost(cidr: string): string {
  const [net, len] = ipaddr.parseCIDR(cidr);
  const bytes = net.toByteArray();
  const bits = bytes.length * 8;
  // Zero the host part, then add one.
  for (let i = 0; i < bytes.length; i++) {
    const keep = Math.max(0, Math.min(8, len - i * 8));
    bytes[i] &= (0xff << (8 - keep)) & 0xff;
  }
  if (len < bits) {
    for (let i = bytes.length - 1; i >= 0; i--) {
      if (bytes[i] < 255) {
        bytes[i]++;
        break;
      }
      bytes[i] = 0;
    }
  }
  return ipaddr.fromByteArray(bytes).toString();
}
