/**
 * The BCE provider in exclusive mode (after CCE, reference §6).
 *
 * State lives in the agent's SQLite database (`_store.ts`): ready ENIs (free or
 * owned), intents (work in flight, with their clientTokens) and quarantined ENIs.
 * The provider is split into rooms that share one {@linkcode BceCore}
 * (`_core.ts` lists them):
 *
 * - **Profiles**: the top-level settings are the `default` profile; named ones
 *   each have their subnet, groups and warm pool, and every ENI (row and intent)
 *   belongs to one. A pod gets an ENI of its profile only.
 * - **Node limit** (`_slots.ts`), shared by the profiles: ENIs in the table (lost
 *   ones excepted) + intents + other ENIs attached to the node never exceed it;
 *   the check and the reservation run in one synchronous section. Pods go before
 *   warm pools (the rule is in `_slots.ts`).
 * - **Allocation** (`_allocate.ts`): a sticky pod's ENI back, a free ENI, else a
 *   new one for the owner (with its fixed IPs); inline security groups and the
 *   profile's put back at release (`_groups.ts`).
 * - **The pool pass** (`_pool.ts`, scheduled by `_schedule.ts`): one list of ENIs
 *   (`_reconcile.ts`, with an orphan scan now and then: `_orphans.ts`), then each
 *   profile's warm pool grows or shrinks.
 * - **Lifecycle** (`_lifecycle.ts`): create and attach, detach and delete; an ENI
 *   stuck in `attaching` or `detaching` is escalated once (detach, then delete
 *   anyway) and, if BCE refuses, quarantined with a status field and an error
 *   line an operator can act on.
 * - **Out-of-band changes** (`_reconcile.ts`): an owned ENI that left the node is
 *   kept, marked *lost*, until its owner's DEL or GC release forgets it (a device
 *   that vanished with it cannot be repaired: {@linkcode BceProvider.repairDevice}
 *   says so at once).
 * - **Descriptions** ({@linkcode BceProvider.describeENI}): one `modifyAttribute`
 *   call names the owning pod; another puts the configured description back.
 * - **Zone-wide sticky pods** (`_sticky.ts` the record, `_park.ts`, `_claim.ts`):
 *   a profile with `sticky.scope: "zone"` parks its sticky pods' ENIs in the VPC
 *   ({@linkcode BceProvider.parkENI}) and claims them back on any node of the zone
 *   (`AllocationRequest.sticky`); the cloud's exclusive attach is the arbiter.
 * - **Status** (`_status.ts`) and **capacity** ({@linkcode BceProvider.capacity}): the
 *   limit (asked again every `limitRefreshMs`) less the ENIs on the node that are not
 *   ours and the quarantined ones, as of the last list.
 *
 * @module
 */
import {
  type AllocationRequestInput,
  AllocationRequestSchema,
  type Eni,
  keyOf,
  type NodeCapacityInput,
  type Owner,
  OwnerSchema,
  type ProfileInfo,
  type Provider,
  type ProviderContext,
  ProviderError,
  type ProviderStatus,
} from "../contract.ts";
import type { BceEni } from "./client.ts";
import { isEniGone } from "./errors.ts";
import { PassScheduler } from "./_schedule.ts";
import { BceCore, type BceProviderOptions } from "./_core.ts";
import { cidr6Of, cidrOf, toEni } from "./_convert.ts";
import { allocate, deallocate } from "./_allocate.ts";
import { park } from "./_park.ts";
import { keepFindable, markOwned, zoneScoped } from "./_owned.ts";
import { ensureSynced, loseOrDrop, sync } from "./_reconcile.ts";
import { poolPass } from "./_pool.ts";
import { resolveLimit } from "./_slots.ts";
import { providerStatus } from "./_status.ts";

export { BceStuckError } from "./_core.ts";
export type { BceProfile, BceProviderOptions, BceTimings } from "./_core.ts";

/** The BCE exclusive-mode provider. */
export class BceProvider implements Provider {
  readonly name = "bce";
  readonly #core: BceCore;
  readonly #ownerOps = new Map<string, Promise<Eni>>();
  readonly #scheduler: PassScheduler;
  #started = false;
  /** When repairDevice last found an ENI attached here, by id. */
  readonly #repairChecked = new Map<string, number>();

  constructor(opts: BceProviderOptions, ctx: ProviderContext) {
    const core = this.#core = new BceCore(opts, ctx);
    this.#scheduler = new PassScheduler({
      baseMs: core.t.poolIntervalMs,
      idleMs: core.t.idleIntervalMs,
      minGapMs: core.t.minPassGapMs,
      jitter: core.t.jitter,
      random: opts.random,
      run: () => poolPass(core),
      onError: (e) => core.log.warn("Warm pool pass failed", { error: e }),
    });
    core.kick = () => {
      if (this.#started) this.#scheduler.kick();
    };
  }

  /** The node limit in force. */
  get maxEnisPerNode(): number {
    return this.#core.limit.max;
  }

  /** Pool passes run so far. */
  get passes(): number {
    return this.#scheduler.passes;
  }

  /**
   * Resolves the node limit and the profiles' subnet CIDRs (what `profiles()`
   * reports; one lookup per subnet not configured), neither fatal, and syncs with
   * the cloud once.
   */
  async init(): Promise<void> {
    const core = this.#core;
    await resolveLimit(core);
    for (const subnetId of new Set([...core.profiles.values()].map((p) => p.subnetId))) {
      try {
        await cidrOf(core, subnetId);
        if (core.o.ipv6 !== "never") await cidr6Of(core, subnetId);
      } catch (e) {
        core.log.warn("Cannot read a profile's subnet; its CIDR is looked up again on use", {
          subnetId,
          error: e,
        });
      }
    }
    try {
      await ensureSynced(this.#core);
    } catch (e) {
      this.#core.log.warn("Initial BCE sync failed; will retry on first use", { error: e });
    }
  }

  // ---- Provider ----------------------------------------------------------------

  list(): Promise<Eni[]> {
    return Promise.resolve(this.#core.store.rows().map((r) => toEni(this.#core, r)));
  }

  async allocateNextENI(owner: Owner, request: AllocationRequestInput): Promise<Eni> {
    const o = OwnerSchema.parse(owner);
    const req = AllocationRequestSchema.parse(request);
    const key = keyOf(o);
    const running = this.#ownerOps.get(key);
    if (running) return await running;
    const core = this.#core;
    const p = allocate(core, o, req).then((eni) => {
      // A zone-sticky pod's ENI stays findable in the cloud while the pod owns it.
      if (req.sticky && zoneScoped(core, core.profile(req.profile))) {
        keepFindable(core, eni.id, o.pod);
      }
      return eni;
    });
    this.#ownerOps.set(key, p);
    try {
      return await p;
    } finally {
      this.#ownerOps.delete(key);
      const p = this.#core.profiles.get(req.profile);
      if (p && this.#core.store.freeRows(p.name).length < p.warmPool.minIdle) this.#core.kick();
    }
  }

  async deallocateENI(owner: Owner): Promise<void> {
    const o = OwnerSchema.parse(owner);
    const running = this.#ownerOps.get(keyOf(o));
    if (running) await running.catch(() => {});
    await deallocate(this.#core, o);
  }

  /**
   * Parks the ENI `owner` holds in the VPC for its zone-sticky pod until `until`
   * (`_park.ts`): recorded at once, detached in the background. A profile of
   * node scope (or an ENI the cloud no longer has here) just frees it.
   */
  async parkENI(owner: Owner, o: { until: number }): Promise<void> {
    const own = OwnerSchema.parse(owner);
    const running = this.#ownerOps.get(keyOf(own));
    if (running) await running.catch(() => {});
    const row = this.#core.store.rowOf(own);
    const profile = row ? this.#core.profiles.get(row.profile) : undefined;
    if (!row || !profile || profile.sticky.scope !== "zone" || this.#core.o.clusterId === null) {
      await deallocate(this.#core, own);
      return;
    }
    park(this.#core, own, o.until);
  }

  /**
   * Each profile (`default` first) with its subnet CIDRs (configured, or looked up
   * at start: a subnet BCE did not answer for shows none until a later lookup).
   */
  profiles(): ProfileInfo[] {
    const core = this.#core;
    return [...core.profiles.values()].map((p) => {
      const v4 = core.cidrs.get(p.subnetId);
      const v6 = core.cidrs6.get(p.subnetId);
      return {
        name: p.name,
        subnets: { ...(v4 ? { ipv4: v4 } : {}), ...(v6 ? { ipv6: v6 } : {}) },
        securityGroupIds: [...p.securityGroupIds],
        enterpriseSecurityGroupIds: [...p.enterpriseSecurityGroupIds],
        namespaces: p.namespaces === null ? null : [...p.namespaces],
        allowedSecurityGroupIds: [...p.allowedSecurityGroupIds],
        sticky: { ...p.sticky },
      };
    });
  }

  /**
   * Sets the ENI's description in BCE (`PUT /v1/eni/{id}?modifyAttribute`): `text`
   * while a pod owns it (a zone-sticky pod's: its owned record and sticky name),
   * the configured description again when `text` is null.
   * No call when BCE shows that text already, or when the ENI is not the
   * provider's any more (released, or lost).
   */
  async describeENI(eniId: string, text: string | null): Promise<void> {
    const core = this.#core;
    const row = core.store.row(eniId);
    const description = text ?? core.o.description;
    if (!row || row.lost_reason !== null) {
      core.log.debug("No description change: the ENI is not tracked (released or lost)", {
        eniId,
      });
      return;
    }
    // A zone-sticky pod's ENI carries its pod's record instead (which names the pod).
    if (row.sticky && text !== null) return await markOwned(core, eniId);
    if (row.description === description) return;
    await core.client.updateEni(eniId, {
      ...(row.name !== null ? { name: row.name } : {}),
      description,
    }, crypto.randomUUID());
    core.store.setDescription(eniId, description);
  }

  status(): Promise<ProviderStatus> {
    return Promise.resolve(providerStatus(this.#core, this.#scheduler));
  }

  /**
   * How many ENIs pods can get: the node limit less the ENIs attached to the node
   * that are not this provider's, the quarantined ones (stuck attaching or detaching)
   * and the zone-sticky ones being parked (detaching into the VPC: their pod's DEL is
   * done, kubelet has freed its device), as of the last list. Fails while the lists
   * fail (BCE unreachable): the figure would be stale. With the limit unknown, the
   * ENIs the node holds.
   */
  capacity(): Promise<NodeCapacityInput> {
    const core = this.#core;
    if (core.syncFailure || !core.synced) {
      const f = core.syncFailure;
      return Promise.reject(
        new ProviderError(
          "unavailable",
          f
            ? `BCE has not answered the list of this node's ENIs since ${
              new Date(f.sinceMs).toISOString()
            }: ${f.message}`
            : "The node's ENIs have not been listed from BCE yet",
        ),
      );
    }
    const quarantined = core.store.quarantined().map((q) => q.eni_id).sort();
    const stuck = new Set(quarantined);
    const foreign = [...core.foreign].filter((id) => !stuck.has(id)).sort();
    const parking = core.store.intents()
      .filter((i) => i.kind === "park" && i.eni_id !== null && !stuck.has(i.eni_id))
      .map((i) => i.eni_id!).sort();
    const holds = [
      { reason: "foreign" as const, eniIds: foreign },
      { reason: "quarantined" as const, eniIds: quarantined },
      { reason: "parking" as const, eniIds: parking },
    ].filter((h) => h.eniIds.length > 0).map((h) => ({ ...h, count: h.eniIds.length }));
    const unavailable = holds.reduce((n, h) => n + h.count, 0);
    // Unknown limit: the ENIs the node holds (a park intent is in intentSlots already).
    const limit = core.limit.source === "unresolved"
      ? core.store.slotRows() + core.store.intentSlots() + foreign.length + quarantined.length
      : core.limit.max;
    return Promise.resolve({
      limit,
      forPods: Math.max(0, limit - unavailable),
      unavailable: holds,
      source: core.limit.source,
    });
  }

  /**
   * Called by the manager when a released ENI's device is found nowhere. A lost ENI
   * (deleted or detached out of band), or one this node parked in the VPC, cannot come
   * back: say so at once. Otherwise one
   * detail call tells whether it is still attached here (BCE brings the device back
   * by itself) or has gone.
   */
  async repairDevice(eniId: string): Promise<void> {
    const core = this.#core;
    const row = core.store.row(eniId);
    if (row?.lost_reason) {
      throw new ProviderError(
        "not_found",
        `ENI "${eniId}" was ${row.lost_reason}; its device cannot come back`,
      );
    }
    // Parked for a zone-sticky pod (a DEL or reconcile that parked it was cut short
    // before its record went): it left this node with the park, for good.
    const parked = row ? undefined : core.store.parked().find((p) => p.eni_id === eniId);
    if (parked) {
      throw new ProviderError(
        "not_found",
        `ENI "${eniId}" is ${
          parked.state === "parking" ? "being parked" : "parked"
        } in the VPC for pod "${parked.pod}"; its device does not come back to this node`,
      );
    }
    // The manager asks again while it waits for the device: one detail call per 10 s is enough.
    const checked = this.#repairChecked.get(eniId);
    if (checked !== undefined && Date.now() - checked < 10_000) return;
    let d: BceEni;
    try {
      d = await core.client.getEni(eniId);
    } catch (e) {
      if (isEniGone(e) && row) loseOrDrop(core, row, "deleted out of band");
      throw e;
    }
    if (d.instanceId !== core.o.instanceId || d.status !== "inuse") {
      throw new ProviderError(
        "wrong_state",
        `ENI "${eniId}" is ${d.status}${
          d.instanceId ? ` on instance "${d.instanceId}"` : ""
        }, not attached to "${core.o.instanceId}"`,
      );
    }
    this.#repairChecked.set(eniId, Date.now());
    for (const [id, at] of this.#repairChecked) {
      if (Date.now() - at >= 10_000) this.#repairChecked.delete(id);
    }
  }

  /** Starts the warm pool loop (first pass at once). */
  start(): Promise<void> {
    if (!this.#core.closed.signal.aborted && !this.#started) {
      this.#started = true;
      this.#scheduler.start();
    }
    return Promise.resolve();
  }

  async close(): Promise<void> {
    this.#core.closed.abort();
    this.#core.client.close();
    await this.#scheduler.stop();
    await Promise.allSettled([...this.#core.bg]);
  }

  // ---- for tests -----------------------------------------------------------------

  /** One pool pass (see `_pool.ts`); tests call it directly. */
  async maintainPool(): Promise<void> {
    await poolPass(this.#core);
  }

  /**
   * Lists this node's ENIs and brings the tables in line with the cloud
   * (`_reconcile.ts`). Public for tests.
   */
  async reconcile(): Promise<void> {
    await sync(this.#core, false);
  }
}
