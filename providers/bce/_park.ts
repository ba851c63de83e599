/**
 * Parking a zone-sticky pod's ENI in the VPC, and what becomes of it there.
 *
 * **Park** ({@linkcode park}): the ENI the pod's attachment owns leaves the
 * pool in one transaction (its row becomes a `park` intent carrying the pod,
 * the interface and the hold's expiry, and this node's parked list gets an
 * entry), then, in the background: the record first (one `modifyAttribute`: the
 * pod's sticky name and a `parked` description, so a node that dies now leaves
 * an ENI every node of the zone can find and judge), then the detach, then the
 * wait until BCE shows it `available`. The intent survives a kill -9 and is
 * finished at the next start (`_reconcile.ts`); the DEL that parks never waits
 * for the detach.
 *
 * **Watching what this node parked** ({@linkcode checkParked}, each pool pass):
 * one detail call per parked ENI tells whether it is still parked, was claimed
 * (attached to another instance: the entry goes, so `enim status` stops showing
 * it), or gone; an ENI whose hold has expired is deleted here, by the node that
 * parked it (its own clock, no skew). A node that died with ENIs parked leaves
 * them to the orphan scan of any node ({@linkcode sweepParked}), which deletes
 * expired ones a grace period after their expiry (clocks differ), and parks for
 * {@linkcode STRAY_HOLD_MS} an ENI left available with an `owned` record. BCE deletes
 * an `available` ENI once: of several nodes sweeping, one delete succeeds and
 * counts the expiry; the others find it gone, or claimed (attaching).
 *
 * @module
 */
import type { BceEni } from "./client.ts";
import { BceApiError, isEniGone } from "./errors.ts";
import type { Owner } from "../contract.ts";
import type { IntentRow } from "./_store.ts";
import type { BceCore } from "./_core.ts";
import { readEni } from "./_lifecycle.ts";
import { newIntent } from "./_tables.ts";
import { sleep } from "../../lib/async.ts";
import {
  decodeRecord,
  encodeRecord,
  isStickyName,
  stickyName,
  stickyPrefix,
  type StickyRecord,
} from "./_sticky.ts";

/**
 * Parks the ENI `owner` holds until `until` (epoch ms): recorded now, carried out
 * in the background. Does nothing when `owner` holds none (a retried release).
 */
export function park(core: BceCore, owner: Owner, until: number): void {
  const row = core.store.rowOf(owner);
  if (!row) return;
  if (row.lost_reason !== null) {
    // It left this node (another node took it from a stopped instance, or it was
    // detached or deleted out of band): nothing to park, nothing to dispose of.
    core.store.drop(row.eni_id);
    core.log.info("The sticky pod's ENI is no longer on this node; nothing to park", {
      eniId: row.eni_id,
      pod: owner.pod,
      lost: row.lost_reason,
    });
    return;
  }
  const intent = core.store.parkOwned(row.eni_id, parkIntent(owner.pod, owner.ifName, until));
  if (!intent) return;
  core.log.info("Parking the sticky pod's ENI in the VPC", {
    eniId: row.eni_id,
    pod: owner.pod,
    ifName: owner.ifName,
    until: new Date(until).toISOString(),
  });
  runTask(core, intent, () => finishPark(core, intent));
}

/**
 * Parks again a zone-sticky pod's ENI found attached here with no record of it
 * (a lost database): for the pod its record names, until the record's expiry (an
 * `owned` record: {@linkcode STRAY_HOLD_MS} from now). False when its record is unreadable.
 */
export function parkStray(core: BceCore, e: BceEni): boolean {
  const r = decodeRecord(e.description);
  if (!r || r.pod.endsWith("…")) {
    core.log.warn("A zone-sticky ENI on this node has no readable record; left alone", {
      eniId: e.eniId,
      name: e.name,
      description: e.description,
    });
    return false;
  }
  const until = r.until ?? Date.now() + STRAY_HOLD_MS;
  const intent = core.store.parkUntracked(e.eniId, parkIntent(r.pod, r.ifName, until));
  if (!intent) return false;
  core.log.warn(
    "A zone-sticky ENI is attached here with no record of it; parked again for its pod",
    {
      eniId: e.eniId,
      pod: r.pod,
      ifName: r.ifName,
      until: new Date(until).toISOString(),
    },
  );
  runTask(core, intent, () => finishPark(core, intent));
  return true;
}

/** Runs `fn` as the one task of the intent's ENI (claims wait for it). */
export function runTask(core: BceCore, intent: IntentRow, fn: () => Promise<void>): void {
  core.active.add(intent.id);
  const eniId = intent.eni_id!;
  const task = fn().catch((e) => {
    core.log.warn(
      "A sticky ENI's park (or the rollback of its claim) did not finish; the next pool pass retries it",
      {
        eniId,
        intent: intent.id,
        error: e,
      },
    );
  }).finally(() => {
    core.active.delete(intent.id);
    if (core.eniTasks.get(eniId) === task) core.eniTasks.delete(eniId);
  });
  core.eniTasks.set(eniId, task);
  core.track(task);
}

/** Carries out a park intent (see the module doc); throws when BCE did not finish (retried). */
export async function finishPark(core: BceCore, intent: IntentRow): Promise<void> {
  const eniId = intent.eni_id!;
  const pod = intent.owner_pod!, ifName = intent.owner_if!, until = intent.until_ms!;
  const me = core.o.instanceId;
  const done = (why: string, fields: Record<string, unknown> = {}) => {
    core.store.endPark(intent.id, eniId, false);
    core.log.info(`The sticky pod's ENI was not parked: ${why}`, { eniId, pod, ...fields });
  };
  const name = await stickyName(core.o.namePrefix, core.o.clusterId!, pod, ifName);
  const description = encodeRecord({
    state: "parked",
    cluster: core.o.clusterId!,
    pod,
    ifName,
    until,
    by: me,
  });
  // After any owned record still on its way (the ADD's), never before it.
  let d = await core.serialRecord(eniId, async () => {
    const d = await readEni(core, eniId);
    if (d && (!d.instanceId || d.instanceId === me)) {
      if (d.name !== name || d.description !== description) {
        await core.client.updateEni(eniId, { name, description }, `${intent.client_token}-record`);
      }
    }
    return d;
  });
  if (d === null) return done("it is gone from the cloud");
  if (d.instanceId && d.instanceId !== me) {
    return done(`it is attached to instance "${d.instanceId}"`, { instanceId: d.instanceId });
  }
  if (d.status === "inuse" && d.instanceId === me) {
    try {
      await core.client.detachEni(eniId, me, `${intent.client_token}-detach`);
    } catch (e) {
      // Refused (detached meanwhile, a detach of ours went through): the ENI says.
      if (!(e instanceof BceApiError) || e.retryable || e.status < 400 || e.status >= 500) throw e;
    }
  }
  const deadline = Date.now() + core.t.detachMs;
  let delay = core.t.pollMs;
  for (;;) {
    d = await readEni(core, eniId);
    if (d === null) return done("it was deleted while it was being parked");
    if (d.status === "available") break;
    if (d.instanceId && d.instanceId !== me) {
      return done(`instance "${d.instanceId}" took it`, { instanceId: d.instanceId });
    }
    if (Date.now() + delay > deadline || core.closed.signal.aborted) {
      throw new Error(`ENI "${eniId}" is still ${d.status} after the detach`);
    }
    await sleep(delay, core.closed.signal);
    delay = Math.min(5000, delay * 2);
  }
  core.store.endPark(intent.id, eniId, true);
  core.events.sticky("park", intent.profile);
  core.log.info("Parked the sticky pod's ENI in the VPC", {
    eniId,
    pod,
    ifName,
    until: new Date(until).toISOString(),
  });
}

/**
 * Each ENI this node parked: still parked, claimed (the entry goes), gone, or
 * expired (deleted here). One detail call each.
 */
export async function checkParked(core: BceCore): Promise<boolean> {
  let changed = false;
  for (const p of core.store.parked()) {
    if (p.state !== "parked" || core.eniTasks.has(p.eni_id)) continue;
    let d: BceEni | null;
    try {
      d = await readEni(core, p.eni_id);
    } catch (e) {
      core.log.warn("Cannot check a parked ENI; the next pass tries again", {
        eniId: p.eni_id,
        error: e,
      });
      continue;
    }
    if (d === null) {
      core.store.dropParked(p.eni_id);
      core.log.info(
        "An ENI this node parked is gone (its hold expired and another node reclaimed it, or it was deleted)",
        {
          eniId: p.eni_id,
          pod: p.pod,
        },
      );
      changed = true;
      continue;
    }
    if (d.instanceId) {
      core.store.dropParked(p.eni_id);
      if (d.instanceId !== core.o.instanceId) {
        core.log.info("An ENI this node parked was claimed by another node for its pod", {
          eniId: p.eni_id,
          pod: p.pod,
          instanceId: d.instanceId,
        });
      }
      changed = true;
      continue;
    }
    if (d.status === "available" && p.until_ms <= Date.now()) {
      if (await expire(core, d, p.profile, "this node parked it")) changed = true;
    }
  }
  return changed;
}

/**
 * The orphan scan's part (a whole-VPC list): deletes the parked ENIs of this
 * cluster whose hold expired more than the grace period ago, whoever parked them;
 * leaves unexpired ones alone. Resolves to whether it reclaimed any.
 */
export async function sweepParked(core: BceCore, listed: BceEni[]): Promise<boolean> {
  if (core.o.clusterId === null) return false;
  const prefix = stickyPrefix(core.o.namePrefix, core.o.clusterId);
  let found = false;
  for (const e of listed) {
    if (e.status !== "available" || !e.name.startsWith(prefix)) continue;
    const r = decodeRecord(e.description);
    if (!r || r.cluster !== core.o.clusterId) continue;
    if (r.state === "owned") {
      await adoptStray(core, e, r);
      continue;
    }
    if (r.until! + core.t.parkedExpiryGraceMs > Date.now()) continue;
    if (await expire(core, e, null, `its hold expired at ${new Date(r.until!).toISOString()}`)) {
      found = true;
    }
  }
  return found;
}

/**
 * How long an ENI found in the VPC with an `owned` record (its instance was
 * released with it, or a take from a stopped node was cut short) is kept for its
 * pod: the first node whose orphan scan sees it parks it for this long.
 */
export const STRAY_HOLD_MS = 10 * 60_000;

/** Gives an available ENI with an owned record a parked one (see {@linkcode STRAY_HOLD_MS}). */
async function adoptStray(core: BceCore, e: BceEni, r: StickyRecord): Promise<void> {
  const until = Date.now() + STRAY_HOLD_MS;
  const description = encodeRecord({ ...r, state: "parked", until, by: core.o.instanceId });
  try {
    await core.client.updateEni(e.eniId, { name: e.name, description }, crypto.randomUUID());
    core.log.info("A zone-sticky ENI left in the VPC without a hold is parked for its pod", {
      eniId: e.eniId,
      pod: r.pod,
      ownedBy: r.by,
      until: new Date(until).toISOString(),
    });
  } catch (err) {
    core.log.warn("Cannot park a zone-sticky ENI left in the VPC", { eniId: e.eniId, error: err });
  }
}

/**
 * Deletes an expired parked ENI; true when this node's delete did it (counted and
 * logged once), false when another node got there first or someone claimed it.
 */
async function expire(
  core: BceCore,
  d: BceEni,
  profile: string | null,
  why: string,
): Promise<boolean> {
  const r = decodeRecord(d.description);
  try {
    // A token of this node's own: two nodes sweeping must not both get BCE's
    // idempotent "done" for one delete.
    await core.client.deleteEni(d.eniId, `${core.o.instanceId}-expire-${d.eniId}`);
  } catch (e) {
    if (isEniGone(e)) {
      core.store.dropParked(d.eniId);
      return false;
    }
    if (e instanceof BceApiError && !e.retryable && e.status >= 400 && e.status < 500) {
      // Not available any more: a node is claiming it at this moment.
      core.log.info("An expired parked ENI is being claimed; not deleted", { eniId: d.eniId });
      return false;
    }
    core.log.warn("Cannot delete an expired parked ENI; the next pass tries again", {
      eniId: d.eniId,
      error: e,
    });
    return false;
  }
  const mine = core.store.dropParked(d.eniId);
  core.events.sticky("expiry", profile ?? mine?.profile ?? "default");
  core.log.info("A parked sticky ENI's hold expired with no claim; deleted", {
    eniId: d.eniId,
    pod: r?.pod,
    ifName: r?.ifName,
    parkedBy: r?.by,
    why,
  });
  return true;
}

/** Whether `name` is a zone-sticky name of this provider (never adopted into a pool). */
export function stickyNamed(core: BceCore, name: string): boolean {
  return isStickyName(core.o.namePrefix, name);
}

/** A park intent for pod `pod`'s interface `ifName`, until `until` (epoch ms). */
function parkIntent(pod: string, ifName: string, until: number) {
  return {
    ...newIntent("park"),
    name: "",
    requested_ip: null,
    purpose: "owner",
    owner_pod: pod,
    owner_if: ifName,
    until_ms: until,
  } as const;
}
