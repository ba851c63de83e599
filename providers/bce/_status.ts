/**
 * The provider's status: pool counts for STATUS and `enim status` (in all and
 * per profile: the node limit is shared, so `attachable` is one figure), and details
 * an operator (and the metrics) read: the node limit and where it came from,
 * work in flight, lost and quarantined ENIs with what to do about them, and
 * the API calls made so far.
 *
 * @module
 */
import type { ProviderStatus } from "../contract.ts";
import type { BceCore } from "./_core.ts";
import { slotsUsed } from "./_slots.ts";

/** The status of the provider (see the module doc). */
export function providerStatus(
  core: BceCore,
  scheduler: { passes: number; intervalMs: number },
): ProviderStatus {
  const rows = core.store.rows();
  const lost = rows.filter((r) => r.lost_reason !== null);
  const owned = rows.filter((r) => r.pod !== null).length;
  const intents = core.store.intents();
  const quarantined = core.store.quarantined();
  const now = Date.now();
  const profiles: ProviderStatus["profiles"] = {};
  const profileDetails: Record<string, unknown> = {};
  for (const p of core.profiles.values()) {
    const mine = rows.filter((r) => r.profile === p.name);
    const ownedHere = mine.filter((r) => r.pod !== null).length;
    profiles[p.name] = { free: mine.length - ownedHere, owned: ownedHere };
    profileDetails[p.name] = {
      subnetId: p.subnetId,
      subnetCidr: core.cidrs.get(p.subnetId) ?? null,
      subnetIpv6Cidr: core.cidrs6.get(p.subnetId) ?? null,
      warmPool: p.warmPool,
      creating: intents.filter((i) =>
        i.kind === "create" && i.phase === "active" && i.profile === p.name
      ).length,
    };
  }
  // ENIs of a profile no longer configured (until released) are counted under their old name.
  for (const r of rows) {
    if (core.profiles.has(r.profile)) continue;
    const c = profiles[r.profile] ?? { free: 0, owned: 0 };
    if (r.pod !== null) c.owned++;
    else c.free++;
    profiles[r.profile] = c;
  }
  const parked = core.store.parked();
  const claims = core.store.claims();
  return {
    name: "bce",
    sticky: {
      parked: parked.map((p) => ({
        eniId: p.eni_id,
        pod: p.pod,
        ifName: p.if_name,
        profile: p.profile,
        state: p.state,
        since: new Date(p.parked_ms).toISOString(),
        until: new Date(p.until_ms).toISOString(),
      })),
      claims: claims.map((c) => ({
        eniId: c.eni_id,
        pod: c.pod,
        ifName: c.if_name,
        from: c.from_instance,
        at: new Date(c.at_ms).toISOString(),
      })),
    },
    free: rows.length - owned,
    owned,
    attachable: Math.max(0, core.limit.max - slotsUsed(core)),
    profiles,
    details: {
      instanceId: core.o.instanceId,
      maxEnisPerNode: core.limit.max,
      limitSource: core.limit.source,
      creating: intents.filter((i) => i.kind === "create" && i.phase === "active").length,
      releasing: intents.filter((i) => i.kind === "release").length,
      /** Zone-sticky ENIs this node is parking or has parked in the VPC. */
      parked: parked.length,
      /** Parked ENIs being claimed for a pod here now. */
      claiming: intents.filter((i) => i.kind === "claim").length,
      cleanup: intents.filter((i) => i.phase === "cleanup").length,
      otherAttached: core.foreign.size,
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
      quotaBlockedUntil: core.quotaBlockedUntil > now
        ? new Date(core.quotaBlockedUntil).toISOString()
        : null,
      ipv6: core.o.ipv6,
      /** The default profile's warm pool (each profile's is under `profiles`). */
      warmPool: core.defaultProfile.warmPool,
      profiles: profileDetails,
      /** Allocations waiting for a slot (warm pool refills leave them room). */
      demand: core.demand,
      passes: scheduler.passes,
      passIntervalMs: scheduler.intervalMs,
      apiCalls: core.client.callCounts(),
    },
  };
}
