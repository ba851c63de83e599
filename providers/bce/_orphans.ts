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
 * then deletes it (`_park.ts`, whichever node sweeps first). Nothing else is
 * ever touched.
 *
 * @module
 */
import type { BceEni } from "./client.ts";
import { isEniGone } from "./errors.ts";
import type { BceCore } from "./_core.ts";
import { sweepParked } from "./_park.ts";

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
  return found || expired;
}
