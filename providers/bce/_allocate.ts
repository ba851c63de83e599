/**
 * Giving an owner an ENI of its profile, and taking it back.
 *
 * In order: the ENI it holds already; the one a sticky pod's previous container
 * holds (`takeOver`); a zone-sticky pod's ENI from the cloud (`_claim.ts`: parked
 * in the VPC, or left on a stopped node); a free ENI of its profile that matches the request
 * (assigned synchronously, so atomic against other allocations; one whose
 * groups are the wanted ones first); else a new ENI created in the profile's
 * subnet with the wanted groups, when the node has a slot or room can be made
 * (`_slots.ts`). Inline groups on a free ENI are `_groups.ts`'s.
 *
 * **Fixed IPs.** When no free ENI of the profile carries the requested IP(s), a
 * new ENI is created with them: the IPv4 as its primary `privateIpAddress`, the
 * IPv6 in `ipv6PrivateIpSet`. They are checked against the profile's subnets
 * and against every ENI the provider tracks before anything is reserved; an IP
 * BCE says is taken (`PrivateIpInUseException`) or refuses otherwise fails with
 * `requested_ip_unavailable`, and the create's cleanup leaves nothing behind.
 *
 * **Release.** The profile's groups are put back before the ENI rejoins the
 * free pool; an ENI whose profile is no longer configured (or moved to another
 * subnet), or whose groups cannot be put back, is detached and deleted instead.
 *
 * @module
 */
import { familyOf } from "../../lib/ip.ts";
import {
  type AllocationRequest,
  type Eni,
  eniMatches,
  normalizeIp,
  type Owner,
  ProviderError,
} from "../contract.ts";
import type { BceEni } from "./client.ts";
import { BceApiError } from "./errors.ts";
import type { EniRow, Groups } from "./_store.ts";
import type { BceCore, BceProfile } from "./_core.ts";
import {
  cidr6Of,
  cidrOf,
  eniFromDetail,
  inCidr,
  inlineGroups,
  overlaps,
  recordOf,
  rowGroups,
  sameGroups,
  toEni,
} from "./_convert.ts";
import { claimGroups, leavePool, restoreGroups, wantedGroups } from "./_groups.ts";
import { dispose, materialize, release } from "./_lifecycle.ts";
import { ensureSynced } from "./_reconcile.ts";
import { reserveForOwner, resolveLimit, slotsUsed } from "./_slots.ts";
import { claimParked } from "./_claim.ts";
import { unmarkOwned, zoneScoped } from "./_owned.ts";

/** Gives `owner` an ENI (see the module doc). */
export async function allocate(core: BceCore, owner: Owner, req: AllocationRequest): Promise<Eni> {
  const profile = core.profile(req.profile);
  const held = core.store.rowOf(owner);
  if (held) return toEni(core, held);
  const inline = req.securityGroupIds ? inlineGroups(req.securityGroupIds) : null;
  const wanted = wantedGroups(profile, inline);
  if (req.eniId !== undefined) return await claimBack(core, owner, req.eniId, wanted);
  if (req.takeOver) {
    const kept = await takeOver(core, owner, req.takeOver, inline);
    if (kept) return kept;
  }
  // A zone-sticky pod's ENI, parked in the VPC (or left on a stopped node), comes back.
  if (req.sticky && zoneScoped(core, profile)) {
    const claimed = await claimParked(core, owner, profile, wanted);
    if (claimed) return claimed;
  }
  const picked = await pickFree(core, owner, req, profile, wanted);
  if (picked) return picked;

  // From here until a slot is reserved (or the attempt fails), warm pool refills
  // leave a slot for this pod.
  core.demand++;
  let reservation;
  try {
    await ensureSynced(core);
    // The sync awaited: look again before creating.
    const again = await pickFree(core, owner, req, profile, wanted);
    if (again) return again;
    if (core.limit.source === "unresolved") await resolveLimit(core, true);
    const fixed = await checkRequest(core, req, profile);
    if (Date.now() < core.quotaBlockedUntil) {
      throw new ProviderError(
        req.ips.length ? "requested_ip_unavailable" : "no_eni_available",
        `No free ENI of profile "${profile.name}" on instance "${core.o.instanceId}", and BCE refused the last attach with a quota error; no new ENI before ${
          new Date(core.quotaBlockedUntil).toISOString()
        }`,
      );
    }
    reservation = reserveForOwner(
      core,
      { profile, ip4: fixed.ip4, ip6: fixed.ip6, groups: inline },
      req.ips.length > 0 || req.ranges.length > 0,
    );
    if (!reservation) {
      throw new ProviderError(
        req.ips.length ? "requested_ip_unavailable" : "no_eni_available",
        `No free ENI of profile "${profile.name}" on instance "${core.o.instanceId}"${
          req.ips.length ? ` with IP ${JSON.stringify(req.ips)}` : ""
        } and the node is at its limit (${
          slotsUsed(core)
        } of ${core.limit.max} ENIs attached or in flight; limit from ${core.limit.source}), with no idle ENI of another profile to release`,
      );
    }
  } finally {
    core.demand--;
  }

  const { intent, evicted } = reservation;
  let room: Promise<void> | undefined;
  if (evicted) {
    core.log.info(
      "The node is at its ENI limit: releasing an idle ENI of another profile to make room for a pod",
      {
        released: evicted.eni_id,
        releasedProfile: evicted.profile,
        owner,
        profile: profile.name,
        maxEnisPerNode: core.limit.max,
      },
    );
    room = release(core, evicted);
    core.track(room.catch(() => {}));
  }
  // The attach waits until the evicted ENI is gone (the create goes ahead meanwhile).
  const gate = room?.catch((e) => {
    throw new ProviderError(
      "no_eni_available",
      `No free ENI of profile "${profile.name}": the idle ENI "${evicted?.eni_id}" released to make room could not be detached (${
        (e as Error).message
      })`,
      { cause: e },
    );
  });
  gate?.catch(() => {});
  let detail: BceEni;
  try {
    detail = await materialize(core, intent, gate);
  } catch (e) {
    if (e instanceof ProviderError && e.reason === "quota_exceeded") {
      throw new ProviderError(
        "no_eni_available",
        `No free ENI on instance "${core.o.instanceId}": BCE refused to attach another (${e.message})`,
        { cause: e, requestId: e.requestId },
      );
    }
    if (fixedIps(intent) !== null && ipRefused(e)) {
      const subnet = `subnet "${profile.subnetId}"`;
      throw new ProviderError(
        "requested_ip_unavailable",
        `BCE refused to create an ENI with the requested IP ${
          fixedIps(intent)
        } in ${subnet} of profile "${profile.name}" (${
          (e as BceApiError).code
        }: the address is taken or not usable there); nothing was left behind`,
        { cause: e, requestId: (e as BceApiError).requestId },
      );
    }
    throw e;
  }
  const record = await recordOf(core, detail, profile.name);
  const eni = await eniFromDetail(core, detail, null, profile.name);
  if (!eniMatches(eni, req)) {
    core.store.insert(record, null, Date.now(), intent.id);
    core.active.delete(intent.id);
    throw new ProviderError(
      "requested_ip_unavailable",
      `The new ENI "${detail.eniId}" (${eni.ipv4?.address}) does not match the requested ranges; it joined the free pool`,
    );
  }
  core.store.insert(record, owner, Date.now(), intent.id);
  core.active.delete(intent.id);
  core.log.info("Allocated a new ENI", { eniId: detail.eniId, owner, profile: profile.name });
  return ownedEni(core, detail.eniId);
}

/** The ENI just assigned, as the contract's (an error if the reconcile dropped it meanwhile). */
function ownedEni(core: BceCore, eniId: string): Eni {
  const r = core.store.row(eniId);
  if (!r) {
    throw new ProviderError(
      "unavailable",
      `ENI "${eniId}" left this node while it was being assigned; try again`,
    );
  }
  return toEni(core, r);
}

/** The fixed IPs of a create intent, as text (null when none). */
function fixedIps(intent: { requested_ip: string | null; requested_ip6: string | null }) {
  const ips = [intent.requested_ip, intent.requested_ip6].filter((x) => x !== null);
  return ips.length ? ips.join(", ") : null;
}

/** Whether a create failed because BCE would not give the requested IP (taken, or refused). */
function ipRefused(e: unknown): boolean {
  if (!(e instanceof BceApiError) || e.op !== "CreateEni") return false;
  if (e.reason === "requested_ip_unavailable") return true;
  return e.reason === "other" && !e.retryable && e.status >= 400 && e.status < 500;
}

/**
 * Checks a request against the profile's subnets and the ENIs tracked (before
 * anything is reserved); resolves to the fixed IPs the new ENI is created with.
 */
async function checkRequest(
  core: BceCore,
  req: AllocationRequest,
  profile: BceProfile,
): Promise<{ ip4: string | null; ip6: string | null }> {
  const cidr = await cidrOf(core, profile.subnetId);
  const cidr6 = req.ips.some((ip) => familyOf(ip) === 6) ||
      req.ranges.some((set) => set.some((r) => r.subnet.includes(":")))
    ? await cidr6Of(core, profile.subnetId)
    : null;
  const where = `subnet "${profile.subnetId}" (${cidr}${
    cidr6 ? `, ${cidr6}` : ""
  }) of profile "${profile.name}"`;
  const unreachable = req.ranges.find((set) =>
    !set.some((r) => overlaps(r.subnet, cidr) || (cidr6 !== null && overlaps(r.subnet, cidr6)))
  );
  if (unreachable) {
    throw new ProviderError(
      "requested_ip_unavailable",
      `No free ENI matches the requested range ${
        JSON.stringify(unreachable.map((r) => r.subnet))
      } and it does not overlap ${where}`,
    );
  }
  const ip4 = req.ips.find((ip) => familyOf(ip) === 4) ?? null;
  const ip6 = req.ips.find((ip) => familyOf(ip) === 6) ?? null;
  for (const [ip, range] of [[ip4, cidr], [ip6, cidr6]] as const) {
    if (ip !== null && (range === null || !inCidr(ip, range))) {
      throw new ProviderError(
        "requested_ip_unavailable",
        `No free ENI carries the requested IP ${
          JSON.stringify(req.ips)
        } and ${ip} is not in ${where}`,
      );
    }
  }
  // An IP on an ENI the provider tracks is taken: say by whom, without asking BCE.
  const wanted = new Set([ip4, ip6].filter((x) => x !== null).map(normalizeIp));
  for (const r of core.store.rows()) {
    const e = toEni(core, r);
    const hit = [e.ipv4?.address, e.ipv6?.address].find((a) => a && wanted.has(normalizeIp(a)));
    if (!hit) continue;
    throw new ProviderError(
      "requested_ip_unavailable",
      `The requested IP ${hit} is on ENI "${r.eni_id}", ${
        r.pod
          ? `held by pod "${r.pod}"`
          : `a free ENI of profile "${r.profile}" (not "${profile.name}")`
      }`,
    );
  }
  return { ip4, ip6 };
}

/**
 * Assigns a free ENI of the profile that matches the request to `owner`
 * (synchronously), then gives it the wanted groups. Null when none matches.
 */
async function pickFree(
  core: BceCore,
  owner: Owner,
  req: AllocationRequest,
  profile: BceProfile,
  wanted: Groups | null,
): Promise<Eni | null> {
  const ready = (r: EniRow) => wanted === null || sameGroups(rowGroups(core, r), wanted);
  const candidates = core.store.freeRows(profile.name)
    .filter((r) => eniMatches(toEni(core, r), req))
    .sort((a, b) => Number(ready(b)) - Number(ready(a)));
  for (const row of candidates) {
    const eni = await take(core, row, owner, wanted, "Allocated a free ENI");
    if (eni) return eni;
  }
  return null;
}

/**
 * Gives the free `row` to `owner` with the wanted groups, logging `what`; null when
 * someone else took it first.
 */
async function take(
  core: BceCore,
  row: EniRow,
  owner: Owner,
  wanted: Groups | null,
  what: string,
): Promise<Eni | null> {
  if (!core.store.assign(row.eni_id, owner, Date.now())) return null;
  core.log.info(what, { eniId: row.eni_id, owner, profile: row.profile });
  await claimGroups(core, row, owner, wanted);
  return ownedEni(core, row.eni_id);
}

/**
 * Reconcile's repair: exactly `eniId`, free in the tables while the manager's state
 * records it for `owner`, becomes `owner`'s again; anything else fails `wrong_state`.
 */
async function claimBack(
  core: BceCore,
  owner: Owner,
  eniId: string,
  wanted: Groups | null,
): Promise<Eni> {
  const row = core.store.row(eniId);
  const eni = row && row.lost_reason === null
    ? await take(core, row, owner, wanted, "Claimed an ENI back for the attachment that holds it")
    : null;
  if (eni) return eni;
  throw new ProviderError(
    "wrong_state",
    `ENI "${eniId}" is ${
      !row ? "not tracked on this node" : row.lost_reason ?? "not free"
    }; it cannot be claimed back`,
  );
}

/**
 * A sticky pod's comeback: the ENI `from` holds becomes `owner`'s, with the
 * wanted groups. Null when `from` holds none (any more).
 */
async function takeOver(
  core: BceCore,
  owner: Owner,
  from: Owner,
  inline: Groups | null,
): Promise<Eni | null> {
  const eniId = core.store.reassign(from, owner, Date.now());
  if (!eniId) return null;
  const row = core.store.row(eniId)!;
  core.log.info("A sticky pod takes its ENI back", { eniId, owner, from });
  const profile = core.profiles.get(row.profile);
  if (profile) await claimGroups(core, row, owner, wantedGroups(profile, inline));
  return ownedEni(core, eniId);
}

/** Takes back what `owner` holds (see the module doc); succeeds when it holds nothing. */
export async function deallocate(core: BceCore, owner: Owner): Promise<void> {
  const row = core.store.rowOf(owner);
  if (!row) return;
  if (row.lost_reason) {
    core.store.drop(row.eni_id);
    core.log.info("Forgot a lost ENI at its owner's release", {
      eniId: row.eni_id,
      owner,
      lost: row.lost_reason,
    });
    // A zone-sticky pod's ENI left with its pod's record (another node took it from
    // this stopped one): it is the pod's, not ours to clean up.
    if (row.sticky) return;
    // Detached (not deleted) out of band: it may still exist, ours and available.
    core.track(
      dispose(core, row.eni_id, crypto.randomUUID(), "lost ENI released").catch((e) =>
        core.log.warn("Cannot clean up a lost ENI; the orphan scan will retry", {
          eniId: row.eni_id,
          error: e,
        })
      ),
    );
    core.kick();
    return;
  }
  const profile = core.profiles.get(row.profile);
  if (!profile || (row.subnet_id !== null && row.subnet_id !== profile.subnetId)) {
    leavePool(core, row.eni_id, `no configured profile "${row.profile}" has its subnet any more`);
    return;
  }
  if (!(await restoreGroups(core, row))) {
    leavePool(core, row.eni_id, `the groups of profile "${row.profile}" could not be put back`);
    return;
  }
  if (!(await unmarkOwned(core, row.eni_id))) {
    leavePool(core, row.eni_id, "its zone-sticky pod's record could not be taken off");
    return;
  }
  core.store.unassign(row.eni_id, Date.now());
  core.log.info("ENI returned to the free pool", {
    eniId: row.eni_id,
    owner,
    profile: row.profile,
  });
  if (core.store.freeRows(row.profile).length > profile.warmPool.maxIdle) core.kick();
}
