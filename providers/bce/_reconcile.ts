/**
 * Bringing the tables in line with the cloud, from one list of this instance's
 * ENIs (or the whole VPC's, for an orphan scan):
 *
 * 1. tracked ENIs that left the node are confirmed with one detail call each: a
 *    free one is dropped from the pool (and deleted when it is ours and
 *    available); an owned one is kept, marked *lost*, so the manager still sees
 *    the attachment (an error line names the pod; its DEL or GC forgets it);
 * 2. untracked ENIs on the node: ours (by the name marker) are adopted into the
 *    free pool of the profile their subnet (and groups) say, or released when no
 *    profile uses their subnet; a zone-sticky pod's (its sticky name) is parked
 *    in the VPC again for its pod, never pooled; others are counted against the
 *    node limit;
 * 3. quarantined ENIs are tried again now and then (in the background);
 * 4. intents nobody works on (a crash, a failed cleanup) are finished or cleaned up
 *    (a create that waits for the release of the ENI it displaces, after it; a
 *    zone-sticky pod's park is finished, its claim rolled back: parked again);
 * 5. orphans (whole-VPC list only, `_orphans.ts`).
 *
 * @module
 */
import type { BceEni } from "./client.ts";
import { isEniGone } from "./errors.ts";
import type { EniRow } from "./_store.ts";
import type { BceCore } from "./_core.ts";
import { profileOfDetail, recordOf } from "./_convert.ts";
import { cleanup, dispose, finishCreate, readEni, release } from "./_lifecycle.ts";
import { collectOrphans } from "./_orphans.ts";
import { finishPark, parkStray, runTask, stickyNamed } from "./_park.ts";
import { rollbackClaim } from "./_claim.ts";
import { releaseUntracked } from "./_slots.ts";

/** Runs one sync, or joins the one running; resolves to whether anything changed. */
export function sync(core: BceCore, scan: boolean): Promise<boolean> {
  if (!core.syncing) {
    core.syncing = reconcile(core, scan).then((changed) => {
      core.synced = true;
      core.syncFailure = null;
      return changed;
    }, (err) => {
      // What capacity() reports while BCE cannot be asked (the device plugin's health).
      core.syncFailure = {
        sinceMs: core.syncFailure?.sinceMs ?? Date.now(),
        message: err instanceof Error ? err.message : String(err),
      };
      throw err;
    }).finally(() => {
      core.syncing = null;
    });
  }
  return core.syncing;
}

/** Syncs once if no sync has completed yet. */
export async function ensureSynced(core: BceCore): Promise<void> {
  if (!core.synced) await sync(core, false);
}

async function reconcile(core: BceCore, scan: boolean): Promise<boolean> {
  const started = Date.now();
  const me = core.o.instanceId;
  // The one list of this pass. Without the instanceId filter for an orphan scan:
  // available ENIs are attached to no instance.
  const listed = await core.client.listEnis({
    vpcId: core.o.vpcId,
    ...(scan ? {} : { instanceId: me }),
  });
  if (scan) core.lastOrphanScan = started;
  const onNode = listed.filter((e) => e.instanceId === me);
  const byId = new Map(onNode.map((e) => [e.eniId, e]));
  let changed = false;

  // 1. Tracked ENIs that left the node. A row newer than the list may be missing
  // from it without having left; the detail call below tells (it is cheap to skip).
  for (const r of core.store.rows()) {
    const e = byId.get(r.eni_id);
    if (e && r.name === null && e.name) core.store.learnName(r.eni_id, e.name);
    if (e?.status === "inuse") {
      if (r.lost_reason) {
        core.store.clearLost(r.eni_id, Date.now());
        core.log.info("A lost ENI is attached to this node again", { eniId: r.eni_id });
        changed = true;
      }
      continue;
    }
    if (e?.status === "attaching" || r.lost_reason || r.updated_ms > started) continue;
    // Missing from the list (or detaching): one detail call tells why.
    let d: BceEni | null;
    try {
      d = await core.client.getEni(r.eni_id);
    } catch (err) {
      if (!isEniGone(err)) {
        core.log.warn("Cannot check an ENI missing from the list; will retry", {
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
    loseOrDrop(core, r, why, d);
    changed = true;
  }

  // 2. Untracked ENIs on the node: adopt ours, count the others; recover quarantined ones.
  const rows = new Set(core.store.rows().map((r) => r.eni_id));
  const intentEnis = new Set(
    core.store.intents().map((i) => i.eni_id).filter((x) => x !== null),
  );
  const quarantined = new Map(core.store.quarantined().map((q) => [q.eni_id, q]));
  const foreign = new Set<string>();
  let attached = 0;
  for (const e of onNode) {
    if (e.status !== "inuse" && e.status !== "attaching") continue;
    attached++;
    if (rows.has(e.eniId) || intentEnis.has(e.eniId)) continue;
    const q = quarantined.get(e.eniId);
    if (q && e.status === "attaching") continue;
    // A zone-sticky pod's ENI here with no record of it (a lost database): it is
    // the pod's, never the pool's; it goes back to the VPC for the pod.
    if (stickyNamed(core, e.name)) {
      if (e.status === "inuse" && parkStray(core, e)) {
        changed = true;
        continue;
      }
      foreign.add(e.eniId);
      continue;
    }
    if (core.isOurs(e) && e.status === "inuse") {
      if (await adopt(core, e)) {
        if (q) {
          core.store.unquarantine(e.eniId);
          core.log.info("A quarantined ENI recovered (inuse); adopted into the pool", {
            eniId: e.eniId,
          });
        }
        changed = true;
        continue;
      }
    }
    foreign.add(e.eniId);
  }
  if (foreign.size !== core.foreign.size) changed = true;
  core.foreign = foreign;
  if (attached < core.attachedCount) core.quotaBlockedUntil = 0; // a slot freed up
  core.attachedCount = attached;

  // 3. Quarantined ENIs: try again now and then (in the background, never awaited here).
  const now = Date.now();
  for (const q of core.store.quarantined()) {
    if (core.active.has(q.eni_id) || now - q.last_try_ms < core.t.quarantineRetryMs) continue;
    core.track(retryQuarantined(core, q.eni_id));
  }

  // 4. Intents nobody works on (a crash, a failed cleanup): finish or clean up.
  for (const intent of core.store.intents()) {
    if (core.active.has(intent.id)) continue;
    if (
      intent.kind === "create" && intent.phase === "active" && intent.after_release !== null &&
      core.store.intent(intent.after_release) !== null
    ) continue;
    if (intent.kind === "park" || intent.kind === "claim") {
      // A claim left unfinished belongs to an ADD the manager rolls back: so is it.
      runTask(
        core,
        intent,
        () => intent.kind === "park" ? finishPark(core, intent) : rollbackClaim(core, intent),
      );
      changed = true;
      continue;
    }
    const task = intent.kind === "release"
      ? release(core, intent)
      : intent.phase === "cleanup"
      ? cleanup(core, intent)
      : finishCreate(core, intent);
    core.track(task.catch((e) => {
      core.log.warn("Resuming a BCE intent failed", { intent: intent.id, error: e });
    }));
    changed = true;
  }

  // 5. Orphans (whole-VPC list only).
  if (scan) changed = (await collectOrphans(core, listed)) || changed;

  const snapshot = onNode.map((e) => `${e.eniId}:${e.status}`).sort().join(",");
  if (snapshot !== core.lastSnapshot) changed = true;
  core.lastSnapshot = snapshot;
  return changed;
}

/** A tracked ENI left the node: a free one is dropped (and cleaned up), an owned one is lost. */
export function loseOrDrop(
  core: BceCore,
  r: EniRow,
  why: string,
  d: BceEni | null = null,
): void {
  if (r.pod === null) {
    core.store.drop(r.eni_id);
    core.log.warn("A free ENI left this node out of band; dropped from the pool", {
      eniId: r.eni_id,
      why,
    });
    if (d && d.status === "available" && core.isOurs(d)) {
      core.track(
        dispose(core, r.eni_id, crypto.randomUUID(), "left the node").catch((e) =>
          core.log.warn("Cannot delete an ENI that left the node", { eniId: r.eni_id, error: e })
        ),
      );
    }
    return;
  }
  if (r.lost_reason) return;
  core.store.markLost(r.eni_id, why, Date.now());
  core.log.error(
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
 * Adopts an attached ENI with our marker into the free pool of its profile (from a
 * list entry: no call), or releases it when no profile uses its subnet.
 */
async function adopt(core: BceCore, e: BceEni): Promise<boolean> {
  if (e.status !== "inuse" || e.instanceId !== core.o.instanceId || !core.isOurs(e)) {
    return false;
  }
  if (!e.macAddress) return false;
  const profile = profileOfDetail(core, e);
  if (!profile) {
    const intent = releaseUntracked(core, e.eniId);
    if (intent) {
      core.log.warn("An attached ENI of ours is in no configured profile's subnet; released", {
        eniId: e.eniId,
        subnetId: e.subnetId,
      });
      core.track(
        release(core, intent).catch((err) => {
          core.log.warn("Releasing an ENI of no profile failed; will retry", {
            eniId: e.eniId,
            error: err,
          });
        }),
      );
    }
    return true;
  }
  const record = await recordOf(core, e, profile.name);
  if (core.store.row(e.eniId) || core.store.intents().some((i) => i.eni_id === e.eniId)) {
    return true;
  }
  core.store.insert(record, null, Date.now());
  core.log.info("Adopted an attached ENI with our marker into the free pool", {
    eniId: e.eniId,
    profile: profile.name,
  });
  return true;
}

/** Tries a quarantined ENI again: forgotten once gone, deleted once it can be, adopted when healthy. */
async function retryQuarantined(core: BceCore, eniId: string): Promise<void> {
  if (core.active.has(eniId)) return;
  core.active.add(eniId);
  try {
    const d = await readEni(core, eniId);
    if (d === null) {
      core.store.unquarantine(eniId);
      core.log.info("A quarantined ENI is gone; forgotten", { eniId });
      return;
    }
    if (d.status === "inuse" && d.instanceId === core.o.instanceId && await adopt(core, d)) {
      core.store.unquarantine(eniId);
      core.log.info("A quarantined ENI recovered (inuse); adopted into the pool", { eniId });
      return;
    }
    const outcome = await dispose(core, eniId, crypto.randomUUID(), "quarantine retry");
    if (outcome !== "quarantined") {
      core.store.unquarantine(eniId);
      core.log.info("A quarantined ENI is resolved", { eniId, outcome });
    }
  } catch (e) {
    core.store.touchQuarantine(eniId, Date.now());
    core.log.warn("Retrying a quarantined ENI failed", { eniId, error: e });
  } finally {
    core.active.delete(eniId);
  }
}
