/**
 * Looking a zone-sticky pod's ENI up in the cloud, paged and cheap: one
 * `GET /v1/eni?vpcId=…&name=<sticky name>` per comeback (paged like every
 * list), matched exactly on our side. Should BCE ignore the `name` filter (its
 * semantics are unverified, reference §1.2), the answer is the whole VPC: the
 * provider notices, says so once, and from then on looks pods up in one shared
 * index of the VPC's zone-sticky ENIs of this cluster, listed at most once per
 * `stickyIndexTtlMs` for the lookups that find their pod in it. A lookup that
 * finds nothing waits for a listing that began after it was asked (a miss must
 * never hand a returning pod a new IP), shared by every lookup waiting. So a
 * thousand nodes never scan the VPC for each ADD.
 *
 * @module
 */
import type { BceEni } from "./client.ts";
import type { BceCore } from "./_core.ts";
import { stickyPrefix } from "./_sticky.ts";

/** The listed ENIs named `name` (see the module doc: the filter, else the shared index). */
export async function lookup(core: BceCore, name: string): Promise<BceEni[]> {
  if (!core.nameFilterIgnored) {
    const listed = await core.client.listEnis({ vpcId: core.o.vpcId, name });
    // Exact, prefix and fuzzy matching all return only names that contain `name`.
    if (listed.every((e) => e.name.includes(name))) return listed.filter((e) => e.name === name);
    core.nameFilterIgnored = true;
    core.log.warn(
      "BCE ignored the name filter of an ENI list: sticky pods are looked up in a shared index of the VPC from now on",
      { returned: listed.length },
    );
    return index(core, listed, Date.now()).get(name) ?? [];
  }
  const asked = Date.now();
  const idx = core.stickyIndex;
  if (idx && asked - idx.at < core.t.stickyIndexTtlMs) {
    const hit = idx.map.get(name);
    if (hit) return hit;
  }
  // A miss (or a stale index) waits for a listing that began after it was asked.
  let map: Map<string, BceEni[]>;
  do {
    map = await refreshIndex(core);
  } while ((core.stickyIndex?.at ?? 0) < asked);
  return map.get(name) ?? [];
}

/** One whole-VPC list shared by the lookups waiting for it. */
function refreshIndex(core: BceCore): Promise<Map<string, BceEni[]>> {
  if (!core.stickyIndexLoading) {
    const began = Date.now();
    core.stickyIndexLoading = core.client.listEnis({ vpcId: core.o.vpcId })
      .then((listed) => index(core, listed, began))
      .finally(() => core.stickyIndexLoading = null);
  }
  return core.stickyIndexLoading;
}

/** Indexes a whole-VPC listing's zone-sticky ENIs of this cluster by name. */
function index(core: BceCore, listed: BceEni[], at: number): Map<string, BceEni[]> {
  const prefix = stickyPrefix(core.o.namePrefix, core.o.clusterId!);
  const map = new Map<string, BceEni[]>();
  for (const e of listed) {
    if (!e.name.startsWith(prefix)) continue;
    map.set(e.name, [...map.get(e.name) ?? [], e]);
  }
  core.stickyIndex = { at, map };
  return map;
}
