/**
 * Giving an owner an ENI: the one it holds already, a free one that matches the
 * request (assigned synchronously, so atomic against other allocations), or a
 * new one created and attached for it when the node has a slot left.
 *
 * A requested IP or range is checked against the subnet before anything is
 * reserved, so nothing after the create can fail on it.
 *
 * @module
 */
import ipaddr from "ipaddr.js";
import {
  type AllocationRequest,
  type Eni,
  eniMatches,
  type Owner,
  ProviderError,
} from "../contract.ts";
import type { BceEni } from "./client.ts";
import type { BceCore } from "./_core.ts";
import { cidrOf, eniFromDetail, inCidr, overlaps, toEni } from "./_convert.ts";
import { materialize } from "./_lifecycle.ts";
import { ensureSynced } from "./_reconcile.ts";
import { reserve, resolveLimit, slotsUsed } from "./_slots.ts";

/** Gives `owner` an ENI (see the module doc). */
export async function allocate(core: BceCore, owner: Owner, req: AllocationRequest): Promise<Eni> {
  const held = core.store.rowOf(owner);
  if (held) return toEni(core, held);
  const picked = pickFree(core, owner, req);
  if (picked) return picked;

  await ensureSynced(core);
  // The sync awaited: look again before creating.
  const again = pickFree(core, owner, req);
  if (again) return again;
  if (core.limit.source === "unresolved") await resolveLimit(core, true);

  const wantIp = req.ips.find((ip) => ipaddr.IPv4.isValid(ip)) ?? null;
  // Known before reserving, so nothing after the create can fail on it.
  const cidr = await cidrOf(core, core.o.subnetId);
  const unreachable = req.ranges.find((set) => !set.some((r) => overlaps(r.subnet, cidr)));
  if (unreachable) {
    throw new ProviderError(
      "requested_ip_unavailable",
      `No free ENI matches the requested range ${
        JSON.stringify(unreachable.map((r) => r.subnet))
      } and it does not overlap subnet "${core.o.subnetId}" (${cidr})`,
    );
  }
  if (req.ips.length > 0) {
    if (!wantIp || !inCidr(wantIp, cidr)) {
      throw new ProviderError(
        "requested_ip_unavailable",
        `No free ENI carries the requested IP ${
          JSON.stringify(req.ips)
        } and it is not in subnet "${core.o.subnetId}" (${cidr})`,
      );
    }
  }
  const now = Date.now();
  if (now < core.quotaBlockedUntil) {
    throw new ProviderError(
      req.ips.length ? "requested_ip_unavailable" : "no_eni_available",
      `No free ENI on instance "${core.o.instanceId}", and BCE refused the last attach with a quota error; no new ENI before ${
        new Date(core.quotaBlockedUntil).toISOString()
      }`,
    );
  }
  const intent = reserve(core, "owner", wantIp);
  if (!intent) {
    const used = slotsUsed(core);
    throw new ProviderError(
      req.ips.length ? "requested_ip_unavailable" : "no_eni_available",
      `No free ENI on instance "${core.o.instanceId}"${
        req.ips.length ? ` with IP ${JSON.stringify(req.ips)}` : ""
      } and the node is at its limit (${used} of ${core.limit.max} ENIs attached or in flight; limit from ${core.limit.source})`,
    );
  }
  let detail: BceEni;
  try {
    detail = await materialize(core, intent);
  } catch (e) {
    if (e instanceof ProviderError && e.reason === "quota_exceeded") {
      throw new ProviderError(
        "no_eni_available",
        `No free ENI on instance "${core.o.instanceId}": BCE refused to attach another (${e.message})`,
        { cause: e, requestId: e.requestId },
      );
    }
    throw e;
  }
  const eni = await eniFromDetail(core, detail, null);
  if (!eniMatches(eni, req)) {
    core.store.insert(eni, null, Date.now(), intent.id);
    core.active.delete(intent.id);
    throw new ProviderError(
      "requested_ip_unavailable",
      `The new ENI "${detail.eniId}" (${eni.ipv4?.address}) does not match the requested ranges; it joined the free pool`,
    );
  }
  core.store.insert(eni, owner, Date.now(), intent.id);
  core.active.delete(intent.id);
  core.log.info("Allocated a new ENI", { eniId: detail.eniId, owner });
  return { ...eni, state: "owned", owner };
}

/** Assigns a free matching ENI to `owner` (synchronous: atomic against other allocations). */
function pickFree(core: BceCore, owner: Owner, req: AllocationRequest): Eni | null {
  for (const row of core.store.freeRows()) {
    const eni = toEni(core, row);
    if (!eniMatches(eni, req)) continue;
    if (!core.store.assign(row.eni_id, owner, Date.now())) continue;
    core.log.info("Allocated a free ENI", { eniId: row.eni_id, owner });
    return { ...eni, state: "owned", owner };
  }
  return null;
}
