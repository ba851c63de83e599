/**
 * The pool pass (`_schedule.ts` decides when): one list of ENIs (this
 * instance's, or the whole VPC's when an orphan scan is due) brings the tables
 * in line with the cloud (`_reconcile.ts`), then the warm pool grows to
 * `minIdle` free ENIs (new ones, while the node has slots) or shrinks to
 * `maxIdle` (the most recently freed surplus ENIs are detached and deleted).
 * It never waits on a stuck ENI: escalation and quarantine are `_lifecycle.ts`'s.
 *
 * @module
 */
import type { BceCore } from "./_core.ts";
import { finishCreate, release } from "./_lifecycle.ts";
import { sync } from "./_reconcile.ts";
import { reserve, resolveLimit, takeFreeForRelease } from "./_slots.ts";

/** One pass; resolves to whether anything changed (the scheduler backs off when not). */
export async function poolPass(core: BceCore): Promise<boolean> {
  if (core.closed.signal.aborted) return false;
  let changed = false;
  if (core.limit.source === "unresolved") changed = await resolveLimit(core, true);
  const scan = Date.now() - core.lastOrphanScan >= core.t.orphanScanIntervalMs;
  changed = (await sync(core, scan)) || changed;
  if (core.closed.signal.aborted) return changed;
  const { minIdle, maxIdle } = core.o.warmPool;
  const free = core.store.freeRows();
  const creating =
    core.store.intents().filter((i) =>
      i.kind === "create" && i.purpose === "pool" && i.phase === "active"
    ).length;
  const work: Promise<unknown>[] = [];
  if (Date.now() >= core.quotaBlockedUntil) {
    for (let n = free.length + creating; n < minIdle; n++) {
      const intent = reserve(core, "pool", null);
      if (!intent) break;
      work.push(
        finishCreate(core, intent).catch((e) => {
          core.log.warn("Warm pool ENI creation failed", { error: e });
        }),
      );
    }
  }
  for (let n = free.length; n > maxIdle; n--) {
    const intent = takeFreeForRelease(core);
    if (!intent) break;
    work.push(
      release(core, intent).catch((e) => {
        core.log.warn("Warm pool ENI release failed; will retry", { error: e });
      }),
    );
  }
  await Promise.all(work);
  return changed || work.length > 0 || core.store.intentCount() > 0;
}
