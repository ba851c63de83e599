/**
 * A zone-sticky pod's comeback on any node of its zone: its ENI is looked up in
 * the cloud by its sticky name and attached to this instance, so the pod gets
 * the same ENI, IP and MAC. The cloud is the arbiter: an ENI attaches to one
 * instance at most, so of two nodes claiming one ENI at once exactly one attach
 * succeeds and the other ADD fails with `sticky_conflict`.
 *
 * | the lookup finds the ENI                         | this node                                              |
 * | ------------------------------------------------ | ------------------------------------------------------ |
 * | nowhere (a new pod, or its hold ended)           | allocates as usual; the ENI gets the pod's sticky name |
 * | in another zone                                  | `wrong_zone`, naming both zones                        |
 * | `available` (parked)                             | claims it                                              |
 * | `detaching` (being parked)                       | waits for it (up to `detachMs`), then claims it        |
 * | attached to an instance BCE reports `Stopped`,   | detaches it from there, then claims it                 |
 * | `Deleted`, `Recycled` or `Expired`, or not found |                                                        |
 * | attached to any other instance (Running, …)      | `sticky_conflict`: never taken from a running node     |
 *
 * **Lookups are paged and cheap** (`_lookup.ts`): one name-filtered list per
 * comeback, or a shared index of the VPC should BCE ignore the filter.
 *
 * **Crash safety.** A `claim` intent (the ENI, the owner, the clientToken of the
 * attach) is recorded with the node slot it takes before the attach, and the
 * owned row replaces it in one transaction after. A claim found unfinished at
 * start-up belongs to an ADD the manager rolls back, so it is rolled back too:
 * the ENI is detached into the VPC again, its record untouched (still parked for
 * its pod until the same expiry). So no ENI is ever attached to this node
 * without a record of it here.
 *
 * **Owned record** (`_owned.ts`): while a zone-sticky pod owns its ENI, the
 * cloud shows the pod's sticky name and an `owned` record naming this instance.
 *
 * @module
 */
import { type Eni, type Owner, ProviderError } from "../contract.ts";
import type { BceEni } from "./client.ts";
import { BceApiError } from "./errors.ts";
import type { Groups, IntentRow } from "./_store.ts";
import type { BceCore, BceProfile } from "./_core.ts";
import { recordOf, toEni, zoneOf } from "./_convert.ts";
import { readEni, release } from "./_lifecycle.ts";
import { BceAttachedElsewhereError, waitAttached } from "./_attach.ts";
import { claimGroups } from "./_groups.ts";
import { reserveClaim } from "./_slots.ts";
import { sleep } from "../../lib/async.ts";
import { decodeRecord, recordNames, stickyName } from "./_sticky.ts";
import { runTask } from "./_park.ts";
import { lookup } from "./_lookup.ts";

/**
 * Instance statuses that prove an instance runs nothing: bce-sdk-go
 * services/bcc/api/model.go InstanceStatus. `Expired` is a prepaid instance BCE
 * has shut down at its expiry (UNVERIFIED beyond the name).
 */
const DOWN = new Set(["Stopped", "Deleted", "Recycled", "Expired"]);

/**
 * The zone-sticky pod's ENI from the cloud, claimed for `owner`; null when the
 * cloud has none for it (the caller allocates as usual).
 */
export async function claimParked(
  core: BceCore,
  owner: Owner,
  profile: BceProfile,
  wanted: Groups | null,
): Promise<Eni | null> {
  const cluster = core.o.clusterId!;
  const name = await stickyName(core.o.namePrefix, cluster, owner.pod, owner.ifName);
  const found = (await lookup(core, name)).filter((e) => {
    const r = decodeRecord(e.description);
    return e.name === name && r !== null && r.cluster === cluster &&
      recordNames(r, owner.pod, owner.ifName);
  });
  if (found.length === 0) return null;
  // A parked one first, then one on its way there, then attached ones.
  const rank = (e: BceEni) => e.status === "available" ? 0 : e.status === "detaching" ? 1 : 2;
  found.sort((a, b) => rank(a) - rank(b));
  const e = found[0];
  const where = `ENI "${e.eniId}" of sticky pod "${owner.pod}" (${owner.ifName})`;

  // The ENI's subnet is zonal: it attaches only to an instance of that zone.
  const mine = await zoneOf(core, profile.subnetId);
  const its = e.zoneName || await zoneOf(core, e.subnetId);
  if (mine && its && mine !== its) {
    core.log.warn("A sticky pod's ENI is in another zone; not claimed", {
      eniId: e.eniId,
      pod: owner.pod,
      eniZone: its,
      zone: mine,
    });
    throw new ProviderError(
      "wrong_zone",
      `${where} is in zone "${its}" (subnet "${e.subnetId}"), and this node (instance "${core.o.instanceId}") is in zone "${mine}": an ENI attaches only to an instance of its subnet's zone. Schedule the pod in zone "${its}" (docs/sticky_pods.md, "Keep a StatefulSet in its zone")`,
    );
  }
  // This node's own park (or the rollback of a claim) of this ENI finishes first.
  await core.eniTasks.get(e.eniId);
  const d = await readEni(core, e.eniId);
  if (d === null) return null; // reclaimed at its expiry meanwhile: a new ENI then
  // On this node already: another attachment's here (the pod's older container still
  // holds it), never taken from it; the pod gets another ENI, as the seed's rule says.
  if (d.instanceId === core.o.instanceId) return null;
  const free = await fromElsewhere(core, d, where, profile);
  return await claim(core, owner, profile, wanted, free);
}

/**
 * Brings the ENI to `available` when another instance has it and may lose it:
 * waits out a detach, takes it from a stopped or gone instance; refuses otherwise.
 */
async function fromElsewhere(
  core: BceCore,
  d: BceEni,
  where: string,
  profile: BceProfile,
): Promise<BceEni> {
  const me = core.o.instanceId;
  if (d.status === "available" || !d.instanceId || d.instanceId === me) return d;
  const from = d.instanceId;
  if (d.status !== "detaching") {
    const status = await instanceStatus(core, from);
    if (!DOWN.has(status) && status !== "gone") {
      core.events.sticky("claim_conflict", profile.name);
      if (d.status === "attaching") {
        // Another node's attach is on its way (its claim won the race to BCE).
        throw new ProviderError(
          "sticky_conflict",
          `${where} was claimed by instance "${from}" at the same moment (BCE attaches an ENI to one instance only); the pod runs there`,
        );
      }
      core.log.warn("A sticky pod's ENI is attached to a running instance; not taken", {
        eniId: d.eniId,
        instanceId: from,
        instanceStatus: status,
      });
      throw new ProviderError(
        "sticky_conflict",
        `${where} is ${d.status} on instance "${from}", which BCE reports ${status}: the pod may still run there (a partitioned node keeps its pods), so it is never taken from an instance that is not stopped. That node parks it when its node hold ends; another node takes it once BCE reports "${from}" stopped or gone. Until then this ADD fails and the runtime retries it`,
      );
    }
    core.log.warn(`Taking a sticky pod's ENI from an instance BCE reports ${status}`, {
      eniId: d.eniId,
      instanceId: from,
      instanceStatus: status,
    });
    // A fresh clientToken for this take (the SDK's examples make a UUID per operation;
    // BCE does not say how long it remembers one): a token fixed per node and ENI would
    // make this node's second take of the same ENI a no-op on a cloud that remembers
    // it. The client's retries of this call reuse it; a take repeated after a failure is
    // a new operation (a detach of an ENI that is no longer attached is refused, which
    // the loop below reads as the take being done).
    try {
      await core.client.detachEni(d.eniId, from, crypto.randomUUID());
    } catch (err) {
      if (!refused(err)) throw err;
    }
  }
  const deadline = Date.now() + core.t.detachMs;
  let delay = core.t.pollMs;
  for (;;) {
    const now = await readEni(core, d.eniId);
    if (now === null) {
      throw new ProviderError("not_found", `${where} was deleted while it was being detached`);
    }
    if (now.status === "available") return now;
    if (now.instanceId && now.instanceId !== from) {
      core.events.sticky("claim_conflict", profile.name);
      throw new ProviderError(
        "sticky_conflict",
        `${where} was claimed by instance "${now.instanceId}" at the same moment (BCE attaches an ENI to one instance only); the pod runs there`,
      );
    }
    if (Date.now() + delay > deadline || core.closed.signal.aborted) {
      throw new ProviderError(
        "sticky_conflict",
        `${where} is still ${now.status} on instance "${from}" after ${core.t.detachMs} ms; the runtime's retry tries again`,
      );
    }
    await sleep(delay, core.closed.signal);
    delay = Math.min(5000, delay * 2);
  }
}

/** Attaches the parked ENI `d` here for `owner`; null when it went away meanwhile. */
async function claim(
  core: BceCore,
  owner: Owner,
  profile: BceProfile,
  wanted: Groups | null,
  d: BceEni,
): Promise<Eni | null> {
  const record = decodeRecord(d.description);
  const where = `ENI "${d.eniId}" of sticky pod "${owner.pod}"`;
  const reservation = reserveClaim(core, profile, d.eniId, owner);
  if (!reservation) {
    throw new ProviderError(
      "no_eni_available",
      `${where} is parked, but this node is at its ENI limit (${core.limit.max}) with no idle ENI to release for it`,
    );
  }
  const { intent, evicted } = reservation;
  const drop = () => {
    core.store.deleteIntent(intent.id);
    core.active.delete(intent.id);
  };
  let attached = false;
  try {
    if (evicted) {
      core.log.info("The node is at its ENI limit: releasing an idle ENI for a sticky pod's", {
        released: evicted.eni_id,
        eniId: d.eniId,
        pod: owner.pod,
      });
      await release(core, evicted);
    }
    // From here the attach may have happened (its answer lost on the way back):
    // a failure rolls it back, unless BCE refused it.
    attached = true;
    let refusal = await attachHere(core, d.eniId, `${intent.client_token}-attach`);
    let ready: BceEni | null = null;
    if (refusal === null) {
      try {
        ready = await waitInuse(core, d.eniId);
      } catch (e) {
        // Refused, but the ENI read attaching with no instanceId yet: it was another
        // node's attach, not ours.
        if (!(e instanceof BceAttachedElsewhereError)) throw e;
        refusal = { gone: false, holder: e.holder, cause: e };
      }
    }
    if (refusal !== null) {
      attached = false;
      drop();
      if (refusal.gone) return null;
      core.events.sticky("claim_conflict", profile.name);
      core.log.warn("Another node claimed the sticky pod's ENI at the same moment", {
        eniId: d.eniId,
        pod: owner.pod,
        instanceId: refusal.holder,
      });
      throw new ProviderError(
        "sticky_conflict",
        `${where} was claimed by ${
          refusal.holder ? `instance "${refusal.holder}"` : "another node"
        } at the same moment (BCE attaches an ENI to one instance only); the pod runs there`,
        { cause: refusal.cause },
      );
    }
    if (ready === null) throw new Error("unreachable: a claim without a refusal or an attach");
    if (core.ctx.waitForDevice) await core.ctx.waitForDevice(ready.macAddress, core.t.deviceMs);
    const rec = await recordOf(core, ready, profile.name);
    core.store.finishClaim(
      intent.id,
      { ...rec, name: markerName(core), description: ready.description ?? null },
      owner,
      { cloudName: ready.name, from: record?.by ?? null, now: Date.now() },
    );
    core.active.delete(intent.id);
  } catch (err) {
    if (attached) {
      // The ADD fails: the ENI goes back to the VPC, still parked for its pod.
      runTask(core, intent, () => rollbackClaim(core, intent));
    } else if (core.store.intent(intent.id)) {
      drop();
    }
    throw err;
  }
  core.events.sticky("claim", profile.name);
  core.log.info("Claimed the sticky pod's ENI from the VPC", {
    eniId: d.eniId,
    pod: owner.pod,
    ifName: owner.ifName,
    from: record?.by ?? null,
    record: record?.state ?? null,
  });
  const row = core.store.row(d.eniId);
  if (!row) {
    throw new ProviderError("unavailable", `${where} left this node while it was being claimed`);
  }
  await claimGroups(core, row, owner, wanted);
  return toEni(core, core.store.row(d.eniId) ?? row);
}

/**
 * Attaches the ENI here. Null when it is (or is on its way); otherwise why BCE
 * refused: the ENI is gone, or another instance (`holder`) has it.
 */
async function attachHere(
  core: BceCore,
  eniId: string,
  token: string,
): Promise<{ gone: boolean; holder: string | null; cause: unknown } | null> {
  try {
    await core.client.attachEni(eniId, core.o.instanceId, token);
    return null;
  } catch (err) {
    if (!refused(err)) throw err;
    // Refused: another node attached it first, it went away, or ours went through.
    const now = await readEni(core, eniId);
    if (now === null) return { gone: true, holder: null, cause: err };
    // Decided on status: while attaching its instanceId may still be "" (no source says
    // it is set before the attach is done); waitInuse() fails it if another instance shows up.
    const onItsWay = now.status === "attaching" || now.status === "inuse";
    if (onItsWay && (!now.instanceId || now.instanceId === core.o.instanceId)) return null;
    return { gone: false, holder: now.instanceId || null, cause: err };
  }
}

/** A fresh name with this node's marker (what a claimed ENI goes back to when freed). */
function markerName(core: BceCore): string {
  const suffix = Array.from(
    crypto.getRandomValues(new Uint8Array(3)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
  return `${core.o.namePrefix}/${core.o.instanceId}/${suffix}`.slice(0, 65);
}

/**
 * Rolls back a claim (a failure after the attach, or found unfinished at
 * start-up): the ENI is detached into the VPC again, still parked for its pod.
 */
export async function rollbackClaim(core: BceCore, intent: IntentRow): Promise<void> {
  const eniId = intent.eni_id!;
  const me = core.o.instanceId;
  let d = await readEni(core, eniId);
  if (d !== null && d.status === "attaching" && (!d.instanceId || d.instanceId === me)) {
    // Ours on its way (its instanceId may be "" until it is done): wait for it to land,
    // or to fall back, before deciding.
    d = await waitInuse(core, eniId);
  }
  if (d !== null && d.instanceId === me && d.status === "inuse") {
    try {
      await core.client.detachEni(eniId, me, `${intent.client_token}-undo`);
    } catch (e) {
      if (!refused(e)) throw e;
    }
    const deadline = Date.now() + core.t.detachMs;
    let delay = core.t.pollMs;
    for (;;) {
      d = await readEni(core, eniId);
      if (d === null || d.status === "available" || d.instanceId !== me) break;
      if (Date.now() + delay > deadline || core.closed.signal.aborted) {
        throw new Error(`ENI "${eniId}" is still ${d.status} after the detach`);
      }
      await sleep(delay, core.closed.signal);
      delay = Math.min(5000, delay * 2);
    }
  }
  core.store.deleteIntent(intent.id);
  core.log.info(
    "Rolled back an unfinished claim: the sticky pod's ENI is parked in the VPC again",
    { eniId, pod: intent.owner_pod },
  );
}

/**
 * Polls until the ENI is `inuse` on this instance (up to `attachMs`), decided on its
 * status; fails when another instance shows up or the attach falls back (`_lifecycle.ts`
 * waitAttached).
 */
async function waitInuse(core: BceCore, eniId: string): Promise<BceEni> {
  return await waitAttached(core, eniId, Date.now() + core.t.attachMs);
}

/** An instance's status as BCE reports it, `gone` when BCE has no such instance. */
export async function instanceStatus(core: BceCore, instanceId: string): Promise<string> {
  try {
    return (await core.client.getInstance(instanceId)).status ?? "unknown";
  } catch (e) {
    if (e instanceof BceApiError && e.missing === "instance") return "gone";
    throw e;
  }
}

/** Whether BCE refused a call outright (a 4xx that is not retried: the ENI says what happened). */
function refused(e: unknown): boolean {
  return e instanceof BceApiError && !e.retryable && e.status >= 400 && e.status < 500;
}
