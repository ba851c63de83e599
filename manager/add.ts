/**
 * ADD: the pod's choice checked (with NetworkPolicy, the enforcer's first sync waited
 * for), its namespace pinned, the intent recorded, an ENI allocated (a sticky pod's held
 * one taken back; with none free, DELs still bringing theirs home are waited for,
 * bounded), its device moved and configured
 * (interface mode) or found (IPAM mode), the outcome recorded, the answer given;
 * the cloud description queued after it. Any failure rolls back through
 * `release.ts`. Placing the device is `place.ts`'s.
 *
 * Why one file: ADD is one sequence, each step's rollback beside it; split, the order
 * of intent, allocation, move and outcome (what a crash at any point leaves) is no
 * longer readable top to bottom.
 *
 * @module
 */
import { type Eni, EniSchema, type Owner, ProviderError } from "../providers/contract.ts";
import { DeviceError, type InstalledShaping, type PinnedNetns } from "../netns/types.ts";
import { resultRoutes } from "../netns/host_link.ts";
import type { Logger } from "../lib/log.ts";
import { type AddResponse, AddResponseSchema, ApiError } from "../api/schema.ts";
import type { AddInput } from "./types.ts";
import type { AttachmentRow } from "./state.ts";
import { type AttachmentKey, keyOf, podKeyOf } from "../providers/schema.ts";
import { checkChoice } from "./profiles.ts";
import { buildResult } from "./result.ts";
import { type ManagerContext, message, ownerOf, zoneHoldMs } from "./context.ts";
import type { OpTimer } from "./op_timer.ts";
import { release } from "./release.ts";
import { findForIpam, plugIntoPod } from "./place.ts";
import { hostLinkFor, prepareHostLink } from "./host_link.ts";
import { policyCommitted, policySynced, preparePolicy } from "./policy.ts";
import { withDeadline } from "../lib/async.ts";

export async function add(ctx: ManagerContext, req: AddInput, t: OpTimer): Promise<AddResponse> {
  const pod = podKeyOf(req.pod);
  const key: AttachmentKey = { containerId: req.containerId, ifName: req.ifName };
  const existing = ctx.state.get(key);
  // A sticky pod's own container back (podman restarts it; a runtime sends its ADD again
  // after the DEL): the ENI its DEL held is this ADD's, taken back below.
  let kept: AttachmentRow | null = null;
  if (existing) {
    const settled = existing.state === "ready" || existing.state === "recycling" ||
      existing.state === "held";
    if (settled && existing.pod !== pod) {
      throw new ApiError(
        "bad_request",
        `Attachment "${keyOf(key)}" belongs to pod "${existing.pod}", not "${pod}"`,
      );
    }
    if ((existing.state === "ready" || existing.state === "recycling") && existing.result) {
      ctx.log.debug("ADD retried: returning the stored result", { key: keyOf(key) });
      return AddResponseSchema.parse(JSON.parse(existing.result));
    }
    if (existing.state === "held" && req.sticky && existing.profile === req.profile) {
      kept = existing;
    }
  }
  if (existing && !kept) {
    // Left half done by a crash (reconcile normally handles these), or a hold this ADD
    // cannot take back (no longer sticky, another profile): undo it first.
    try {
      await release(ctx, existing, { netnsUsable: true, leaveCallerDevice: true }, t);
    } catch (err) {
      throw ctx.apiError(err);
    }
  }
  // The pod's choice (profile, groups, fixed IPs) against the operator's rules,
  // before anything is recorded or allocated.
  checkChoice(ctx.provider.profiles(), {
    namespace: req.pod.namespace,
    profile: req.profile,
    securityGroupIds: req.securityGroupIds,
    ips: req.ips,
  });
  if (req.mode === "ipam" && req.bandwidth) {
    throw new ApiError(
      "bad_request",
      "Bandwidth limits need interface mode: in IPAM mode the device is the calling plugin's to shape",
    );
  }
  await prepareHostLink(ctx.hostLinks, ctx.provider.profiles(), req, pod);
  // Before anything is recorded or an ENI taken: an ADD waiting for NetworkPolicy's first
  // sync holds none of the pool's ENIs (and gives up with nothing to undo).
  const synced = policySynced(ctx, req, t);
  if (synced) await synced;
  const owner: Owner = { pod, containerId: req.containerId, ifName: req.ifName };
  const log = ctx.log.child({ op: "add", key: keyOf(key), pod });
  // The namespace is proven and held before anything is recorded or allocated: every
  // step of this ADD goes through the one namespace it names now (netns/pin.ts), and the
  // row carries its identity from the start.
  let pinned: PinnedNetns | null = null;
  try {
    pinned = await t.time("netns_check", () => ctx.devices.pin(req.netns));
  } catch (err) {
    // IPAM mode moves nothing: a path that is no namespace (the seed's /dev/null) is
    // fine there, the node's own namespace never is.
    const nodeNs = err instanceof DeviceError && err.reason === "netns_node";
    if (req.mode === "interface" || nodeNs || !(err instanceof DeviceError)) {
      throw ctx.apiError(err);
    }
  }
  try {
    return await addPinned(ctx, req, t, key, pod, owner, log, pinned, kept);
  } finally {
    pinned?.close();
  }
}

export async function addPinned(
  ctx: ManagerContext,
  req: AddInput,
  t: OpTimer,
  key: AttachmentKey,
  pod: string,
  owner: Owner,
  log: Logger,
  pinned: PinnedNetns | null,
  kept: AttachmentRow | null = null,
): Promise<AddResponse> {
  const identity = pinned?.identity ?? null;
  const intent = {
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
  };
  // The key's own held row becomes this ADD's intent, its ENI recorded on it (one
  // transaction, as takeOverHeld does for a new container's key).
  const revived = kept
    ? t.sync("state_write", () => ctx.state.reviveHeld(intent))
    : (t.sync("state_write", () => ctx.state.insertAdding(intent)), null);
  if (kept && revived) {
    ctx.addAnswered.delete(keyOf(key));
    log.info("Taking back the sticky pod's held ENI for its container", {
      eniId: revived.eniId,
    });
  }
  let allocating = false;
  let allocated = false;
  try {
    // DELs still bringing their ENIs home (none on the fast path: nothing awaited here).
    const wait = new DelWait(ctx, t, log);
    const finishing = finishingDels(ctx);
    if (finishing.length > 0 && await needsTheirEnis(ctx, req)) await wait.forAll(finishing);
    const held = revived ??
      (req.sticky ? await takeOverHeld(ctx, req, key, pod, log) : null);
    allocating = true;
    let eni: Eni;
    for (;;) {
      // The DELs finishing as it asks: one may bring its ENI home while the provider refuses.
      const asked = finishingDels(ctx);
      try {
        eni = EniSchema.parse(
          await t.time("provider", () =>
            ctx.provider.allocateNextENI(owner, {
              ips: req.ips,
              ranges: req.ranges,
              profile: req.profile,
              ...(req.securityGroupIds ? { securityGroupIds: req.securityGroupIds } : {}),
              ...(held ? { takeOver: ownerOf(held) } : {}),
              ...(req.sticky ? { sticky: true } : {}),
            })),
        );
        break;
      } catch (err) {
        // Refused while DELs were finishing: the next of them to finish brings one home.
        if (!(err instanceof ProviderError) || err.reason !== "no_eni_available") throw err;
        await wait.forNext(asked, err);
      }
    }
    allocated = true;
    if (held && held.eniId !== eni.id) {
      // The held ENI could not be given back (gone from the cloud): free what is left of it.
      log.warn("The sticky pod's held ENI could not be taken over; it got another", {
        held: held.eniId,
        eniId: eni.id,
      });
      // Its owner is another key's (never this one's: that would free the new ENI).
      if (keyOf(held) !== keyOf(key)) {
        await ctx.provider.deallocateENI(ownerOf(held)).catch((err) =>
          log.warn("Freeing the held ENI failed; GC frees it", { error: message(err) })
        );
      }
    }
    const holder = ctx.state.byEni(eni.id);
    if (holder && keyOf(holder) !== keyOf(key)) {
      throw new ApiError(
        "internal",
        `The provider handed out ENI "${eni.id}", which attachment "${keyOf(holder)}" holds`,
      );
    }
    log.debug("ENI allocated", { eniId: eni.id });
    const since = performance.now();
    return await ctx.locks.run(`eni:${eni.id}`, async () => {
      t.waited(since);
      const { ips, routes } = buildResult(eni, req);
      const link = req.mode === "interface" && req.hostLink
        ? await hostLinkFor(ctx.hostLinks, req, key, eni)
        : undefined;
      let placed: { ifindex: number; nodeName: string; shaping?: InstalledShaping };
      try {
        const policy = link
          ? await t.time(
            "policy",
            () => preparePolicy(ctx, key, { key: pod, uid: req.pod.uid }, req.ifName, link, t),
          )
          : undefined;
        placed = req.mode === "interface"
          ? await plugIntoPod(ctx, req, pinned!, key, eni, ips, routes, t, link, policy)
          : await findForIpam(ctx, req, key, eni, identity !== null, t);
      } finally {
        if (link) ctx.hostLinks.releaseTable(key);
      }
      const { ifindex, nodeName } = placed;
      const result: AddResponse = {
        eniId: eni.id,
        mac: eni.mac,
        ifindex,
        nodeName,
        ips,
        routes: link ? [...routes, ...resultRoutes(link)] : routes,
        ...(link
          ? {
            hostLink: {
              nodeIfName: link.nodeIfName,
              podIfName: link.podIfName,
              nodeMac: link.nodeMac,
              podMac: link.podMac,
            },
          }
          : {}),
        ...shapingOf(placed),
      };
      const recycled = t.sync("state_write", () =>
        ctx.state.markReady(key, pod, {
          result: JSON.stringify(result),
          ifindex,
          nodeName,
        }));
      if (link) await t.time("policy_commit", () => policyCommitted(ctx, key, req.netns));
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
      queueMicrotask(() => ctx.describer?.owned(eni.id, pod));
      return result;
    });
  } catch (err) {
    const apiErr = ctx.apiError(err);
    log.warn("ADD failed; rolling back", { code: apiErr.code, error: apiErr.message });
    const row = ctx.state.get(key);
    if (row) {
      // A failed allocate may still have given this owner an ENI (a timeout): free it
      // then; when the provider shows it holds none, there is nothing to ask it.
      const mayHold = allocated ||
        (allocating && await ctx.provider.list().then(
          (enis) => enis.some((e) => e.owner !== null && keyOf(e.owner) === keyOf(key)),
          () => true,
        ));
      // A zone-sticky pod's ENI (perhaps just claimed from the VPC) is not the pool's:
      // it is parked for the pod again, for a whole hold, instead of freed.
      const park = req.sticky && zoneHoldMs(ctx, req.profile) !== null
        ? { park: { until: ctx.now() + ctx.holdMs } }
        : {};
      try {
        await release(
          ctx,
          row,
          { netnsUsable: true, skipProvider: !mayHold, leaveCallerDevice: true, ...park },
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
export async function takeOverHeld(
  ctx: ManagerContext,
  req: AddInput,
  key: AttachmentKey,
  pod: string,
  log: Logger,
): Promise<AttachmentRow | null> {
  const candidate = ctx.state.heldFor(pod, req.ifName);
  if (!candidate) return null;
  if (candidate.profile !== req.profile) {
    log.info("The pod's held ENI is of another profile; it waits for its hold to expire", {
      held: candidate.eniId,
      heldProfile: candidate.profile,
      profile: req.profile,
    });
    return null;
  }
  return await ctx.locks.run(`att:${keyOf(candidate)}`, () => {
    const held = ctx.state.takeOver(candidate, key);
    if (held) {
      ctx.addAnswered.delete(keyOf(candidate));
      log.info("Taking back the sticky pod's held ENI", { eniId: held.eniId });
    }
    return Promise.resolve(held);
  });
}

const seconds = (ms: number) => Math.round(ms / 100) / 10;

/** The rests of the DELs that have answered and are still finishing (`ctx.releasing`). */
function finishingDels(ctx: ManagerContext): Promise<void>[] {
  return ctx.releasing.size === 0 ? [] : [...ctx.releasing.values()].map((r) => r.rest);
}

/**
 * Whether an ADD could get only a new ENI or none while DELs are finishing: its profile
 * has no free ENI, or it asks for given addresses or ranges (or is a sticky pod, whose
 * own ENI may be coming home), which may be on an ENI on its way home.
 */
async function needsTheirEnis(ctx: ManagerContext, req: AddInput): Promise<boolean> {
  if (req.ips.length > 0 || req.ranges.length > 0 || req.sticky) return true;
  const pool = (await ctx.provider.status()).profiles[req.profile];
  return (pool?.free ?? 0) === 0;
}

/**
 * An ADD's waits for DELs that have answered and are still bringing their ENIs home,
 * timed as the `del_wait` phase and together bounded by `ctx.delWaitMs`
 * (`timeouts.delWaitSeconds`) from the first.
 */
class DelWait {
  readonly #ctx: ManagerContext;
  readonly #t: OpTimer;
  readonly #log: Logger;
  #until: number | null = null;

  constructor(ctx: ManagerContext, t: OpTimer, log: Logger) {
    this.#ctx = ctx;
    this.#t = t;
    this.#log = log;
  }

  /** The time left (ms), the bound starting now if it has not yet. */
  #left(): number {
    this.#until ??= performance.now() + this.#ctx.delWaitMs;
    return this.#until - performance.now();
  }

  /** Waits for every DEL of `rests` to finish, or for the bound (then the ADD goes on). */
  async forAll(rests: Promise<void>[]): Promise<void> {
    const left = this.#left();
    if (left <= 0) return;
    this.#log.debug("Waiting for DELs that are still bringing their ENIs home", {
      dels: rests.length,
    });
    await this.#t.time("del_wait", () => this.#within(Promise.all(rests), left));
  }

  /**
   * The provider refused the ADD (`refused`: no ENI available) while the DELs `before`
   * were finishing: when one of them has finished since (its ENI may be home), the ADD
   * asks again at once; otherwise it waits for the next DEL still finishing, then asks
   * again. Throws the refusal when no DEL is finishing, and says so when the bound has
   * passed.
   */
  async forNext(before: Promise<void>[], refused: ProviderError): Promise<void> {
    const now = finishingDels(this.#ctx);
    if (before.some((r) => !now.includes(r))) return;
    if (now.length === 0) throw refused;
    const left = this.#left();
    if (left <= 0) {
      const n = now.length;
      throw new ApiError(
        "no_eni_available",
        `${refused.message}; ${n} DEL${n === 1 ? " is" : "s are"} still bringing ${
          n === 1 ? "its ENI" : "their ENIs"
        } home after ${seconds(this.#ctx.delWaitMs)} s of waiting (timeouts.delWaitSeconds)`,
        undefined,
        { cause: refused },
      );
    }
    this.#log.info("No free ENI while DELs are finishing; waiting for the next of them", {
      dels: now.length,
      leftMs: Math.round(left),
    });
    await this.#t.time("del_wait", () => this.#within(Promise.race(now), left));
  }

  /** `p` (a DEL's rest never rejects), or nothing after `ms`. */
  async #within(p: Promise<unknown>, ms: number): Promise<void> {
    await withDeadline(p, ms, () => new Error("DELs still finishing")).catch(() => {});
  }
}

/** The result's `bandwidth`: the shaping the plug installed, when it shaped anything. */
function shapingOf(placed: { shaping?: InstalledShaping }): Pick<AddResponse, "bandwidth"> {
  const s = placed.shaping;
  return s && (s.ingress || s.egress) ? { bandwidth: s } : {};
}
