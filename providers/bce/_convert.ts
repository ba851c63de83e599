/**
 * Subnets, groups and conversion: the CIDRs of the subnets ENIs live in (from
 * the config or one subnet lookup each, then cached), an ENI's security groups
 * compared with its profile's, and BCE's ENI (or a stored row) as the provider
 * contract's {@linkcode Eni}. The gateway is the subnet's first host, as in
 * CCE's exclusive mode (reference §2.3).
 *
 * @module
 */
import {
  contains,
  formatIp,
  networkOf,
  nthAddress,
  parseCidr,
  parseIp,
  prefixSize,
} from "../../lib/ip.ts";
import {
  DEFAULT_PROFILE,
  type Eni,
  type EniAddress,
  EniAddressSchema,
  isEnterpriseGroup,
  type Owner,
} from "../contract.ts";
import type { BceEni } from "./client.ts";
import type { EniRecord, EniRow, Groups } from "./_store.ts";
import type { BceCore, BceProfile } from "./_core.ts";

/** The subnet's IPv4 CIDR (looked up once when not configured). */
export async function cidrOf(core: BceCore, subnetId: string): Promise<string> {
  const known = core.cidrs.get(subnetId);
  if (known) return known;
  await lookupSubnet(core, subnetId);
  return core.cidrs.get(subnetId)!;
}

/** The subnet's IPv6 CIDR, null when it has none (or it cannot be told). */
export async function cidr6Of(core: BceCore, subnetId: string): Promise<string | null> {
  if (core.cidrs6.has(subnetId)) return core.cidrs6.get(subnetId) ?? null;
  try {
    await lookupSubnet(core, subnetId);
  } catch (e) {
    core.log.warn("Cannot read the subnet's IPv6 range", { subnetId, error: e });
    return null;
  }
  return core.cidrs6.get(subnetId) ?? null;
}

async function lookupSubnet(core: BceCore, subnetId: string): Promise<void> {
  const s = await core.client.getSubnet(subnetId);
  core.cidrs.set(subnetId, s.cidr);
  core.cidrs6.set(subnetId, s.ipv6Cidr || null);
  core.zones.set(subnetId, s.zoneName || null);
}

/**
 * The subnet's availability zone (an ENI attaches only to an instance of its
 * subnet's zone): from its detail, looked up once; null when BCE does not say.
 */
export async function zoneOf(core: BceCore, subnetId: string): Promise<string | null> {
  if (core.zones.has(subnetId)) return core.zones.get(subnetId) ?? null;
  try {
    await lookupSubnet(core, subnetId);
  } catch (e) {
    core.log.warn("Cannot read the subnet's zone", { subnetId, error: e });
    return null;
  }
  return core.zones.get(subnetId) ?? null;
}

/** Whether new ENIs in the subnet ask for an IPv6 address. */
export async function wantIpv6(core: BceCore, subnetId: string): Promise<boolean> {
  if (core.o.ipv6 === "never") return false;
  if (core.o.ipv6 === "always") return true;
  return (await cidr6Of(core, subnetId)) !== null;
}

// ---- groups ---------------------------------------------------------------------------

/** A profile's own groups; null when it has none (then BCE's choice is never replaced). */
export function profileGroups(p: BceProfile): Groups | null {
  if (p.securityGroupIds.length + p.enterpriseSecurityGroupIds.length === 0) return null;
  return {
    securityGroupIds: [...p.securityGroupIds],
    enterpriseSecurityGroupIds: [...p.enterpriseSecurityGroupIds],
  };
}

/** Inline groups (all of one kind, the manager checked) as an ENI's groups. */
export function inlineGroups(ids: string[]): Groups {
  return {
    securityGroupIds: ids.filter((g) => !isEnterpriseGroup(g)),
    enterpriseSecurityGroupIds: ids.filter(isEnterpriseGroup),
  };
}

/** The groups BCE reports on an ENI. */
export function groupsOfDetail(d: BceEni): Groups {
  return {
    securityGroupIds: d.securityGroupIds ?? [],
    enterpriseSecurityGroupIds: d.enterpriseSecurityGroupIds ?? [],
  };
}

/** The groups on a stored ENI: what the row records, else its profile's. */
export function rowGroups(core: BceCore, r: EniRow): Groups | null {
  if (r.security_groups !== null || r.enterprise_security_groups !== null) {
    return {
      securityGroupIds: r.security_groups ?? [],
      enterpriseSecurityGroupIds: r.enterprise_security_groups ?? [],
    };
  }
  const p = core.profiles.get(r.profile);
  return p ? profileGroups(p) : null;
}

/** Whether two sets of groups are the same (order aside); null is "unknown" and equals nothing. */
export function sameGroups(a: Groups | null, b: Groups | null): boolean {
  if (a === null || b === null) return false;
  const key = (g: Groups) =>
    JSON.stringify([[...g.securityGroupIds].sort(), [...g.enterpriseSecurityGroupIds].sort()]);
  return key(a) === key(b);
}

/** What a row records of an ENI's groups: null when they are its profile's. */
export function groupsToRecord(core: BceCore, profile: string, g: Groups): Groups | null {
  const p = core.profiles.get(profile);
  return p && sameGroups(profileGroups(p), g) ? null : g;
}

/**
 * The profile an ENI of ours belongs to, from its subnet and groups (an adopted
 * ENI: its intent is gone): the profile with both, else the first with its
 * subnet (`default` first); null when no profile uses its subnet.
 */
export function profileOfDetail(core: BceCore, d: BceEni): BceProfile | null {
  const inSubnet = [...core.profiles.values()].filter((p) => p.subnetId === d.subnetId);
  return inSubnet.find((p) => sameGroups(profileGroups(p), groupsOfDetail(d))) ??
    inSubnet[0] ?? null;
}

// ---- ENIs ------------------------------------------------------------------------------

/** What a row records of a new (or adopted) ENI of `profile`. */
export async function recordOf(core: BceCore, d: BceEni, profile: string): Promise<EniRecord> {
  const eni = await eniFromDetail(core, d, null, profile);
  return {
    ...eni,
    name: d.name || null,
    groups: groupsToRecord(core, profile, groupsOfDetail(d)),
  };
}

/** An ENI of `profile` from BCE's detail (or list entry), free or owned by `owner`. */
export async function eniFromDetail(
  core: BceCore,
  d: BceEni,
  owner: Owner | null,
  profile: string = DEFAULT_PROFILE,
): Promise<Eni> {
  const v4 = d.privateIpSet.find((p) => p.primary) ?? d.privateIpSet[0];
  const v6 = d.ipv6PrivateIpSet[0];
  let ipv4: EniAddress | null = null;
  let ipv6: EniAddress | null = null;
  if (v4) {
    const cidr = await cidrOf(core, d.subnetId);
    ipv4 = {
      address: v4.privateIpAddress,
      prefixLength: prefixOf(cidr),
      gateway: firstHost(cidr),
    };
  }
  if (v6) {
    const cidr6 = await cidr6Of(core, d.subnetId);
    if (cidr6) {
      // BCE documents no IPv6 gateway; the first host of the range, as for IPv4
      // (CCE's exclusive mode reuses the IPv4 gateway for both families). UNVERIFIED.
      ipv6 = {
        address: v6.privateIpAddress,
        prefixLength: prefixOf(cidr6),
        gateway: firstHost(cidr6),
      };
    } else {
      core.log.warn("ENI has an IPv6 address but its subnet's IPv6 range is unknown", {
        eniId: d.eniId,
        subnetId: d.subnetId,
      });
    }
  }
  return {
    id: d.eniId,
    mac: d.macAddress.toLowerCase(),
    ipv4,
    ipv6,
    subnetId: d.subnetId || null,
    state: owner ? "owned" : "free",
    owner,
    profile,
    securityGroupIds: d.securityGroupIds ?? [],
    enterpriseSecurityGroupIds: d.enterpriseSecurityGroupIds ?? [],
    description: d.description ?? null,
    cloudState: "ok",
  };
}

/** A stored row as the contract's ENI. */
export function toEni(core: BceCore, r: EniRow): Eni {
  const owner = r.pod && r.container_id && r.if_name
    ? { pod: r.pod, containerId: r.container_id, ifName: r.if_name }
    : null;
  const groups = rowGroups(core, r);
  return {
    id: r.eni_id,
    mac: r.mac,
    ipv4: r.ipv4 ? EniAddressSchema.parse(JSON.parse(r.ipv4)) : null,
    ipv6: r.ipv6 ? EniAddressSchema.parse(JSON.parse(r.ipv6)) : null,
    subnetId: r.subnet_id,
    state: owner ? "owned" : "free",
    owner,
    profile: r.profile,
    securityGroupIds: [...groups?.securityGroupIds ?? []],
    enterpriseSecurityGroupIds: [...groups?.enterpriseSecurityGroupIds ?? []],
    description: r.description,
    cloudState: r.lost_reason !== null ? "lost" : "ok",
  };
}

/** Whether `ip` lies in `cidr` (false when either does not parse). */
export function inCidr(ip: string, cidr: string): boolean {
  const c = parseCidr(cidr), a = parseIp(ip);
  return c !== null && a !== null && contains(c, a);
}

/** Whether two CIDRs share an address (one contains the other's network address). */
export function overlaps(a: string, b: string): boolean {
  const ca = parseCidr(a), cb = parseCidr(b);
  if (!ca || !cb || ca.ip.family !== cb.ip.family) return false;
  return contains(ca, networkOf(cb)) || contains(cb, networkOf(ca));
}

function prefixOf(cidr: string): number {
  const c = parseCidr(cidr);
  if (!c) throw new RangeError(`"${cidr}" is not a prefix`);
  return c.prefix;
}

/** The first host of a CIDR (network address + 1): BCE's subnet gateway. */
export function firstHost(cidr: string): string {
  const c = parseCidr(cidr);
  if (!c) throw new RangeError(`"${cidr}" is not a prefix`);
  // A single-address prefix has no other host: its only address.
  return formatIp(prefixSize(c) > 1 ? nthAddress(c, 1) : networkOf(c));
}
