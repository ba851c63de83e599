/**
 * The orphan scan: from a whole-VPC list (at most once per
 * `orphanScanIntervalMs`), the ENIs this node created that nobody knows any more.
 *
 * An ENI of this node has a name starting with `<prefix>/<instanceId>/`, matched
 * here (BCE's name filter is never relied on: whether it matches exactly, by
 * prefix or fuzzily is unverified). One that is `available` and known to no row,
 * intent or quarantine entry is a leftover of a crash or of a detach by someone
 * else, and is deleted. A zone-sticky pod's parked ENI (its sticky name, not this
 * node's marker) is never one: the scan leaves it alone until its hold expires,
 * then deletes it (`_park.ts`, whichever node sweeps first). An ENI of another node
 * of this prefix (`<prefix>/<other instance>/`) that is `available` while BCE has no
 * such instance any more (released: its node is gone for good) is deleted too, by
 * whichever node's scan meets it first, so a gone node's ENIs are reclaimed within one
 * `orphanScanIntervalMs` plus one pool pass of any live node (issue 51; docs/agent.md).
 * Nothing else is ever touched: an ENI of a node that exists (stopped, or running with
 * its agent down) stays, and so does a zone-sticky pod's ENI (its hold decides).
 *
 * @module
 */
import type { BceEni } from "./client.ts";
import { BceApiError, isEniGone } from "./errors.ts";
import type { BceCore } from "./_core.ts";
import { stickyNamed, sweepParked } from "./_park.ts";
import { instanceStatus } from "./_claim.ts";
import { decodeRecord } from "./_sticky.ts";

/**
 * Deletes this node's orphaned ENIs among `listed`, and the parked ENIs of the
 * cluster whose hold expired (`_park.ts`); resolves to whether it found any.
 */
export async function collectOrphans(core: BceCore, listed: BceEni[]): Promise<boolean> {
  const expired = await sweepParked(core, listed);
  const mine = `${core.o.namePrefix}/${core.o.instanceId}/`;
  const intents = core.store.intents();
  const known = new Set([
    ...core.store.rows().map((r) => r.eni_id),
    ...intents.map((i) => i.eni_id).filter((x) => x !== null),
    ...core.store.quarantined().map((q) => q.eni_id),
  ]);
  const names = new Set(intents.map((i) => i.name));
  let found = false;
  for (const e of listed) {
    if (e.status !== "available" || !e.name.startsWith(mine)) continue;
    if (known.has(e.eniId) || names.has(e.name)) continue;
    found = true;
    try {
      await core.client.deleteEni(e.eniId, crypto.randomUUID());
      core.log.info("Deleted an orphaned ENI of this node", { eniId: e.eniId, name: e.name });
    } catch (err) {
      if (!isEniGone(err)) {
        core.log.warn("Cannot delete an orphaned ENI", { eniId: e.eniId, error: err });
      }
    }
  }
  const gone = await reclaimGoneNodes(core, listed, known);
  return found || expired || gone;
}

/**
 * Deletes the ENIs of this prefix that another node created and left `available`
 * while BCE no longer has its instance (a detail call answers not found: the
 * instance was released, its node is gone for good). One detail call per such
 * instance and scan. Never touched: an ENI attached anywhere or on its way
 * (only `available` with no instance qualifies), one with a zone-sticky name or
 * record (a pod's parked or owned ENI: {@linkcode sweepParked} alone decides, at
 * its hold's expiry), one this node knows (a row, an intent, a quarantine entry),
 * and one whose instance BCE reports in any state at all (`Stopped` included: it
 * may boot again and its agent collects its own). BCE refuses to delete an ENI
 * that is not `available`, so a node claiming one at this moment keeps it.
 */
async function reclaimGoneNodes(
  core: BceCore,
  listed: BceEni[],
  known: Set<string>,
): Promise<boolean> {
  const prefix = `${core.o.namePrefix}/`;
  const statuses = new Map<string, Promise<string>>();
  let found = false;
  for (const e of listed) {
    if (e.status !== "available" || e.instanceId || !e.name.startsWith(prefix)) continue;
    if (known.has(e.eniId) || stickyNamed(core, e.name) || decodeRecord(e.description)) continue;
    const instance = e.name.slice(prefix.length).split("/")[0];
    if (!/^i-[A-Za-z0-9]+$/.test(instance) || instance === core.o.instanceId) continue;
    if (!statuses.has(instance)) {
      statuses.set(instance, instanceStatus(core, instance).catch(() => "unknown"));
    }
    if ((await statuses.get(instance)) !== "gone") continue;
    try {
      await core.client.deleteEni(e.eniId, crypto.randomUUID());
      found = true;
      core.log.info("Deleted an ENI left by a node that is gone (BCE has no such instance)", {
        eniId: e.eniId,
        name: e.name,
        instanceId: instance,
      });
    } catch (err) {
      if (isEniGone(err)) continue;
      if (err instanceof BceApiError && !err.retryable && err.status >= 400 && err.status < 500) {
        // Not available any more: a node is attaching it at this moment.
        core.log.info("An ENI left by a node that is gone is being attached; not deleted", {
          eniId: e.eniId,
        });
        continue;
      }
      core.log.warn("Cannot delete an ENI left by a node that is gone; the next scan tries again", {
        eniId: e.eniId,
        error: err,
      });
    }
  }
  return found;
}
