/**
 * The owned record of a zone-sticky pod's ENI: while the pod owns it, the cloud
 * shows the pod's sticky name and an `owned` record naming this instance
 * (`_sticky.ts`), written after the ADD in the background. Should this node
 * die, another node of the zone finds the ENI by its name and judges it by this
 * instance's state (`_claim.ts`). When the ENI goes back to the pool instead of
 * being parked, this node's marker and the configured description come back.
 *
 * @module
 */
import type { BceCore, BceProfile } from "./_core.ts";
import { encodeRecord, stickyName } from "./_sticky.ts";

/** Whether the profile keeps its sticky pods' ENIs zone-wide. */
export function zoneScoped(core: BceCore, profile: BceProfile): boolean {
  return profile.sticky.scope === "zone" && core.o.clusterId !== null;
}

/**
 * Marks the ENI just given to a zone-sticky pod as such, and writes its owned
 * record in the background (never delaying the ADD).
 */
export function keepFindable(core: BceCore, eniId: string, pod: string): void {
  if (core.store.row(eniId)?.pod !== pod) return;
  core.store.setSticky(eniId, true);
  core.track(
    markOwned(core, eniId).catch((e) =>
      core.log.warn("Cannot record the sticky pod's ENI as owned in the cloud", { eniId, error: e })
    ),
  );
}

/**
 * Writes the owned record on a zone-sticky ENI this node's pod owns (its sticky
 * name, `owned` by this instance). No call when the cloud shows it already.
 */
export function markOwned(core: BceCore, eniId: string): Promise<void> {
  return core.serialRecord(eniId, () => writeOwned(core, eniId));
}

async function writeOwned(core: BceCore, eniId: string): Promise<void> {
  const row = core.store.row(eniId);
  if (!row || !row.sticky || row.pod === null || row.if_name === null) return;
  const name = await stickyName(core.o.namePrefix, core.o.clusterId!, row.pod, row.if_name);
  const description = encodeRecord({
    state: "owned",
    cluster: core.o.clusterId!,
    pod: row.pod,
    ifName: row.if_name,
    until: null,
    by: core.o.instanceId,
  });
  if (row.cloud_name === name && row.description === description) return;
  await core.client.updateEni(eniId, { name, description }, crypto.randomUUID());
  // Only if the same pod still owns it (a DEL may have parked or freed it meanwhile).
  const now = core.store.row(eniId);
  if (now?.pod === row.pod && now.sticky) core.store.setCloudRecord(eniId, name, description);
}

/**
 * Puts this node's marker name and the configured description back on an ENI a
 * zone-sticky pod no longer owns (freed into the pool, not parked). No call when
 * the cloud shows them already; false when BCE did not take it (the caller takes
 * the ENI out of the pool: with the pod's name on it, another node would take it
 * for that pod).
 */
export function unmarkOwned(core: BceCore, eniId: string): Promise<boolean> {
  return core.serialRecord(eniId, () => writeUnowned(core, eniId));
}

async function writeUnowned(core: BceCore, eniId: string): Promise<boolean> {
  const row = core.store.row(eniId);
  if (!row || row.cloud_name === null || row.name === null) return true;
  try {
    await core.client.updateEni(
      eniId,
      { name: row.name, description: core.o.description },
      crypto.randomUUID(),
    );
  } catch (e) {
    core.log.warn("Cannot take a zone-sticky pod's record off its freed ENI", { eniId, error: e });
    return false;
  }
  core.store.setCloudRecord(eniId, null, core.o.description);
  return true;
}
