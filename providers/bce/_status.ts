/**
 * The provider's status: pool counts for STATUS and `enim status`, and details
 * an operator (and the metrics) read: the node limit and where it came from,
 * work in flight, lost and quarantined ENIs with what to do about them, and
 * the API calls made so far.
 *
 * @module
 */
import { DEFAULT_PROFILE, type ProviderStatus } from "../contract.ts";
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
  return {
    name: "bce",
    free: rows.length - owned,
    owned,
    attachable: Math.max(0, core.limit.max - slotsUsed(core)),
    profiles: { [DEFAULT_PROFILE]: { free: rows.length - owned, owned } },
    details: {
      instanceId: core.o.instanceId,
      maxEnisPerNode: core.limit.max,
      limitSource: core.limit.source,
      creating: intents.filter((i) => i.kind === "create" && i.phase === "active").length,
      releasing: intents.filter((i) => i.kind === "release").length,
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
      warmPool: core.o.warmPool,
      passes: scheduler.passes,
      passIntervalMs: scheduler.intervalMs,
      apiCalls: core.client.callCounts(),
    },
  };
}
