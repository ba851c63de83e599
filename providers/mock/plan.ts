/**
 * The mock cloud's address plan: each profile's subnets and which address the
 * n-th ENI of its inventory gets.
 *
 * @module
 */
import {
  type Cidr,
  formatIp,
  normalizeIp,
  nthAddress as nthOf,
  parseCidr,
  prefixSize,
} from "../../lib/ip.ts";

export function cidrOf(cidr: string): Cidr {
  const c = parseCidr(cidr);
  if (!c) throw new RangeError(`"${cidr}" is not a prefix`);
  return c;
}

/** The `n`-th address of a subnet (0 = the network address). */
export function nthAddress(cidr: string, n: number): string {
  return formatIp(nthOf(cidrOf(cidr), n));
}

/** How many host addresses a subnet offers ENIs (minus network, gateway and, for IPv4, broadcast). */
export function hostCapacity(cidr: string): number {
  const c = cidrOf(cidr);
  return prefixSize(c) - (c.ip.family === 4 ? 3 : 2);
}

/** One subnet of a profile, resolved: prefix length, gateway, and its prefix. */
export interface Plan {
  cidr: string;
  prefixLength: number;
  gateway: string;
  /** The addresses of the inventory, in order (the n-th ENI gets the n-th). */
  addrs: string[];
}

/** The address table of one subnet: ENI number i (1-based) gets the i-th host after the gateway. */
export function addressPlan(
  subnet: { cidr: string; gateway?: string } | undefined,
  count: number,
): Plan | null {
  if (!subnet) return null;
  const c = cidrOf(subnet.cidr);
  if (count > hostCapacity(subnet.cidr)) {
    throw new RangeError(`Subnet "${subnet.cidr}" is too small for ${count} ENIs`);
  }
  const gateway = subnet.gateway ? normalizeIp(subnet.gateway) : nthAddress(subnet.cidr, 1);
  const addrs: string[] = [];
  for (let n = 1; addrs.length < count; n++) {
    const a = nthAddress(subnet.cidr, n);
    if (a !== gateway) addrs.push(a);
  }
  return { cidr: subnet.cidr, prefixLength: c.prefix, gateway, addrs };
}

/** A profile as the mock runs it. */
export interface MockProfile {
  name: string;
  /** Its number: the MAC's fourth byte and the high bits of `idx`. */
  number: number;
  enis: number;
  preattached: number | undefined;
  v4: Plan | null;
  v6: Plan | null;
  securityGroupIds: string[];
  enterpriseSecurityGroupIds: string[];
  namespaces: string[] | null;
  allowedSecurityGroupIds: string[];
}
