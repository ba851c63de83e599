/**
 * An ENI's life in the cloud: created and attached (an intent carried out), or
 * detached and deleted (disposed of), and what happens when it gets stuck.
 *
 * **Creating.** A create intent carries its clientToken and the ENI's name, so a
 * retry or a restart repeats the *same* create; and its profile (the subnet, the
 * groups), a pod's inline groups and fixed IPs, which the create asks for. A not-found right after the
 * create is BCE catching up: retried for `createVisibilityMs`. An ENI still
 * `attaching` after `attachMs` (counted from the intent) is stuck: the intent is
 * cleaned up, which escalates.
 *
 * **Disposing.** Bounded in time: at most `detachMs` waiting for a normal
 * detach, then `escalateMs` after the escalation's detach, then a delete whatever
 * the status; if BCE refuses that too, the ENI is quarantined with a status field
 * and an error line an operator can act on, and its node slot is freed.
 *
 * @module
 */
import { ProviderError } from "../contract.ts";
import type { BceEni } from "./client.ts";
import { sleep } from "../../lib/async.ts";
import { BceApiError, isEniGone } from "./errors.ts";
import type { IntentRow } from "./_store.ts";
import type { BceCore, Disposal } from "./_core.ts";
import { profileGroups, recordOf, wantIpv6 } from "./_convert.ts";
import { attachNew, untilVisible, waitAttached } from "./_attach.ts";
import { isParked } from "./_sticky.ts";

/**
 * Creates (or finds, via its clientToken), attaches and readies the ENI of an intent.
 * The attach waits for `beforeAttach` (the release of an ENI this one displaces).
 * On failure the intent is abandoned (the ENI cleaned up) and the error thrown.
 */
export async function materialize(
  core: BceCore,
  intent: IntentRow,
  beforeAttach?: Promise<unknown>,
): Promise<BceEni> {
  core.active.add(intent.id);
  const c = core.client;
  try {
    const profile = core.profiles.get(intent.profile);
    if (!profile) {
      throw new ProviderError(
        "other",
        `Profile "${intent.profile}" of the ENI being created is not configured any more`,
      );
    }
    let eniId = intent.eni_id;
    let visibleFrom = intent.created_ms;
    if (!eniId) {
      const inline = intent.security_groups !== null ||
        intent.enterprise_security_groups !== null;
      const own = profileGroups(profile);
      const ipv6 = intent.requested_ip6 ?? await wantIpv6(core, profile.subnetId);
      eniId = await c.createEni({
        name: intent.name,
        subnetId: profile.subnetId,
        securityGroupIds: inline ? intent.security_groups ?? [] : own?.securityGroupIds ?? [],
        enterpriseSecurityGroupIds: inline
          ? intent.enterprise_security_groups ?? []
          : own?.enterpriseSecurityGroupIds ?? [],
        privateIpAddress: intent.requested_ip ?? undefined,
        ipv6,
        description: core.o.description,
      }, intent.client_token);
      intent.eni_id = eniId;
      visibleFrom = Date.now();
      core.store.setIntentEni(intent.id, eniId);
      core.log.info("Created an ENI", {
        eniId,
        clientToken: intent.client_token,
        profile: profile.name,
        subnetId: profile.subnetId,
        ipv6,
        ...(intent.requested_ip ? { privateIpAddress: intent.requested_ip } : {}),
      });
    }
    const id = eniId;
    const visibleBy = visibleFrom + core.t.createVisibilityMs;
    let d = await untilVisible(core, id, visibleBy, () => c.getEni(id));
    // The attach gets its full `attachMs`, counted from the intent (a restart does not
    // restart the clock), or from the end of the wait for a displaced ENI's release.
    let attachFrom = intent.created_ms;
    if (d.status === "available") {
      if (beforeAttach) {
        await beforeAttach;
        attachFrom = Date.now();
      }
      await attachNew(
        core,
        id,
        `${intent.client_token}-attach`,
        visibleBy,
        Math.max(attachFrom + core.t.attachMs, Date.now()),
      );
    } else if (d.instanceId && d.instanceId !== core.o.instanceId) {
      throw new ProviderError(
        "wrong_state",
        `ENI "${id}" is attached to instance "${d.instanceId}", not "${core.o.instanceId}"`,
      );
    }
    d = await waitAttached(core, id, Math.max(attachFrom + core.t.attachMs, Date.now()));
    if (core.ctx.waitForDevice) {
      await core.ctx.waitForDevice(d.macAddress, core.t.deviceMs);
    }
    if (
      d.ipv6PrivateIpSet.length === 0 &&
      (intent.requested_ip6 !== null || await wantIpv6(core, profile.subnetId))
    ) {
      core.log.warn("Asked BCE for an IPv6 address but the ENI has none", { eniId: id });
    }
    return d;
  } catch (e) {
    await abandon(core, intent, e);
    throw e;
  }
}

/** Finishes a create intent into the free pool (pool growth, or resuming after a restart). */
export async function finishCreate(core: BceCore, intent: IntentRow): Promise<void> {
  const d = await materialize(core, intent);
  core.store.insert(await recordOf(core, d, intent.profile), null, Date.now(), intent.id);
  core.active.delete(intent.id);
  core.log.info("ENI joined the free pool", { eniId: d.eniId, profile: intent.profile });
}

/** After a failed create/attach: undo what the cloud did, or leave it for the loop. */
async function abandon(core: BceCore, intent: IntentRow, cause: unknown): Promise<void> {
  core.log.warn("Creating or attaching an ENI failed; cleaning up", {
    eniId: intent.eni_id,
    error: cause,
  });
  core.store.setIntentPhase(intent.id, "cleanup");
  intent.phase = "cleanup";
  if (core.closed.signal.aborted) {
    core.active.delete(intent.id);
    return;
  }
  await cleanup(core, intent).catch((e) => {
    core.log.warn("ENI cleanup failed; the pool loop will retry", {
      eniId: intent.eni_id,
      error: e,
    });
  });
}

/** Disposes of the ENI of a failed intent (detach, delete, or quarantine), then drops the intent. */
export async function cleanup(core: BceCore, intent: IntentRow): Promise<void> {
  core.active.add(intent.id);
  try {
    let eniId = intent.eni_id;
    if (!eniId) {
      // The create may have happened with its response lost: find it by its unique
      // name, matched here (the list's name filter is never relied on).
      const found = await core.client.listEnis({ vpcId: core.o.vpcId, namePrefix: intent.name });
      eniId = found.find((e) => e.name === intent.name)?.eniId ?? null;
    }
    if (eniId) await dispose(core, eniId, intent.client_token, "failed create");
    core.store.deleteIntent(intent.id);
  } finally {
    core.active.delete(intent.id);
  }
}

/** Detaches and deletes the ENI of a release intent, then drops the intent. */
export async function release(core: BceCore, intent: IntentRow): Promise<void> {
  core.active.add(intent.id);
  try {
    const why = intent.purpose === "owner" ? "released for a pod" : "surplus";
    const outcome = intent.eni_id
      ? await dispose(core, intent.eni_id, intent.client_token, why)
      : "gone";
    core.store.deleteIntent(intent.id);
    core.quotaBlockedUntil = 0; // a slot freed up
    core.log.info("Released an ENI", { eniId: intent.eni_id, outcome, why });
  } finally {
    core.active.delete(intent.id);
  }
}

/**
 * Gets rid of an ENI of ours: detaches it from this node when attached here, deletes
 * it, and escalates when it is stuck (see the module doc).
 */
export async function dispose(
  core: BceCore,
  eniId: string,
  token: string,
  why: string,
): Promise<Disposal> {
  let d = await readEni(core, eniId);
  if (d === null) return "gone";
  if (!core.isOurs(d)) {
    core.log.warn("Refusing to delete an ENI without our marker", { eniId, name: d.name });
    return "not-ours";
  }
  if (d.status === "available" && isParked(d.description)) return "elsewhere"; // its pod's
  const me = core.o.instanceId;
  if (d.instanceId && d.instanceId !== me && d.status !== "available") {
    core.log.warn("Not touching an ENI of ours attached to another instance", {
      eniId,
      instanceId: d.instanceId,
      status: d.status,
    });
    return "elsewhere";
  }
  if (d.status === "inuse") {
    await detachQuietly(core, eniId, `${token}-detach`);
    d = await pollUntilFree(core, eniId, Date.now() + core.t.detachMs);
    if (d === null) return "gone";
  } else if (d.status === "detaching") {
    d = await pollUntilFree(core, eniId, Date.now() + core.t.detachMs);
    if (d === null) return "gone";
  }
  if (d.status === "available") return await deleteEni(core, eniId, `${token}-delete`);

  // Stuck in attaching, detaching (or inuse after a detach): escalate.
  core.log.warn("ENI is stuck; escalating: detach, then delete", {
    eniId,
    status: d.status,
    why,
  });
  await detachQuietly(core, eniId, `${token}-escalate`);
  d = await pollUntilFree(core, eniId, Date.now() + core.t.escalateMs);
  if (d === null) return "gone";
  if (d.status === "available") return await deleteEni(core, eniId, `${token}-delete`);
  try {
    await core.client.deleteEni(eniId, `${token}-force`);
    core.log.info("Deleted a stuck ENI", { eniId, status: d.status });
    core.store.unquarantine(eniId);
    return "deleted";
  } catch (e) {
    if (isEniGone(e)) return "gone";
    if (!(e instanceof BceApiError) || e.retryable || e.status < 400 || e.status >= 500) {
      throw e;
    }
    quarantine(
      core,
      eniId,
      d.status,
      `stuck in ${d.status} (${why}); BCE refused the delete: ${e.code}`,
    );
    return "quarantined";
  }
}

/** Records a stuck ENI and tells the operator what to do. */
function quarantine(core: BceCore, eniId: string, status: string, reason: string): void {
  const first = !core.store.quarantined().some((q) => q.eni_id === eniId);
  core.store.quarantine(eniId, status, reason, Date.now());
  const fields = {
    eniId,
    status,
    reason,
    retryInMs: core.t.quarantineRetryMs,
    action:
      `In the BCE console (or with the ENI API), detach ENI "${eniId}" from instance "${core.o.instanceId}" and delete it; enim checks it again every ${
        Math.round(core.t.quarantineRetryMs / 1000)
      } s and forgets it once it is gone`,
  };
  if (first) {
    core.log.error(
      "ENI quarantined: stuck and BCE refuses to detach or delete it; its node slot is freed",
      fields,
    );
  } else {
    core.log.warn("ENI still quarantined", fields);
  }
}

/** The ENI's detail, null when it is gone. */
export async function readEni(core: BceCore, eniId: string): Promise<BceEni | null> {
  try {
    return await core.client.getEni(eniId);
  } catch (e) {
    if (isEniGone(e)) return null;
    throw e;
  }
}

/** Detaches from this node; a 4xx (not attached, wrong state) is left to the status polls. */
async function detachQuietly(core: BceCore, eniId: string, token: string): Promise<void> {
  try {
    await core.client.detachEni(eniId, core.o.instanceId, token);
  } catch (e) {
    if (isEniGone(e)) return;
    if (e instanceof BceApiError && !e.retryable && e.status >= 400 && e.status < 500) {
      core.log.info("BCE refused a detach", { eniId, code: e.code, status: e.status });
      return;
    }
    throw e;
  }
}

async function deleteEni(core: BceCore, eniId: string, token: string): Promise<Disposal> {
  try {
    await core.client.deleteEni(eniId, token);
    core.log.info("Deleted an ENI", { eniId });
    return "deleted";
  } catch (e) {
    if (isEniGone(e)) return "gone";
    throw e;
  }
}

/** Polls until the ENI is `available` or gone (null), or the deadline passes (its last detail). */
async function pollUntilFree(
  core: BceCore,
  eniId: string,
  deadline: number,
): Promise<BceEni | null> {
  let delay = core.t.pollMs;
  for (;;) {
    const d = await readEni(core, eniId);
    if (d === null || d.status === "available") return d;
    if (Date.now() + delay > deadline || core.closed.signal.aborted) return d;
    await sleep(delay, core.closed.signal);
    delay = Math.min(5000, delay * 2);
  }
}
