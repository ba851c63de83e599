/**
 * The pool pass (`_schedule.ts` decides when): one list of ENIs (this
 * instance's, or the whole VPC's when an orphan scan is due) brings the tables
 * in line with the cloud (`_reconcile.ts`), one detail call per ENI this node
 * parked for a zone-sticky pod (`_park.ts`), then each profile's warm pool grows
 * to its `minIdle` free ENIs (new ones in its subnet with its groups, while the
 * node has slots left after pending pods: `_slots.ts`) or shrinks to its
 * `maxIdle` (the most recently freed surplus ENIs are detached and deleted).
 * Free ENIs no profile wants (their profile left the config, or moved to
 * another subnet) are released too. It never waits on a stuck ENI: escalation
 * and quarantine are `_lifecycle.ts`'s.
 *
 * @module
 */
import type { BceCore } from "./_core.ts";
import { finishCreate, release } from "./_lifecycle.ts";
import { sync } from "./_reconcile.ts";
import { checkParked } from "./_park.ts";
import { refreshLimit, reserveForPool, resolveLimit, takeFreeForRelease } from "./_slots.ts";
import type { IntentRow } from "./_store.ts";

/** One pass; resolves to whether anything changed (the scheduler backs off when not). */
export async function poolPass(core: BceCore): Promise<boolean> {
  if (core.closed.signal.aborted) return false;
  let changed = false;
  if (core.limit.source === "unresolved") changed = await resolveLimit(core, true);
  else if (Date.now() - core.limitTriedAt >= core.t.limitRefreshMs) {
    changed = await refreshLimit(core);
  }
  const scan = Date.now() - core.lastOrphanScan >= core.t.orphanScanIntervalMs;
  changed = (await sync(core, scan)) || changed;
  if (core.closed.signal.aborted) return changed;
  // What this node parked: still parked, claimed elsewhere, gone, or expired.
  changed = (await checkParked(core)) || changed;
  const work: Promise<unknown>[] = [];
  const releasing = (intent: IntentRow, why: string) =>
    work.push(
      release(core, intent).catch((e) => {
        core.log.warn("Warm pool ENI release failed; will retry", { why, error: e });
      }),
    );

  // Free ENIs no profile wants.
  for (const r of core.store.freeRows()) {
    const p = core.profiles.get(r.profile);
    if (p && (r.subnet_id === null || r.subnet_id === p.subnetId)) continue;
    const intent = takeFreeForRelease(core, { eniId: r.eni_id });
    if (!intent) continue;
    core.log.info("A free ENI of a profile no longer configured (or moved) is released", {
      eniId: r.eni_id,
      profile: r.profile,
      subnetId: r.subnet_id,
    });
    releasing(intent, "no profile");
  }

  // Growth, round-robin over the profiles below their minIdle (default first).
  const intents = core.store.intents();
  const missing = new Map<string, number>();
  for (const p of core.profiles.values()) {
    const creating = intents.filter((i) =>
      i.kind === "create" && i.purpose === "pool" && i.phase === "active" && i.profile === p.name
    ).length;
    missing.set(p.name, p.warmPool.minIdle - core.store.freeRows(p.name).length - creating);
  }
  if (Date.now() >= core.quotaBlockedUntil) {
    let full = false;
    while (!full && [...missing.values()].some((n) => n > 0)) {
      for (const p of core.profiles.values()) {
        if ((missing.get(p.name) ?? 0) <= 0) continue;
        const intent = reserveForPool(core, p);
        if (!intent) {
          full = true;
          break;
        }
        missing.set(p.name, missing.get(p.name)! - 1);
        work.push(
          finishCreate(core, intent).catch((e) => {
            core.log.warn("Warm pool ENI creation failed", { profile: p.name, error: e });
          }),
        );
      }
    }
  }

  // Shrinkage, per profile.
  for (const p of core.profiles.values()) {
    for (let n = core.store.freeRows(p.name).length; n > p.warmPool.maxIdle; n--) {
      const intent = takeFreeForRelease(core, { profile: p.name });
      if (!intent) break;
      releasing(intent, `profile "${p.name}" above maxIdle`);
    }
  }
  await Promise.all(work);
  return changed || work.length > 0 || core.store.intentCount() > 0;
}
