/**
 * A pod's ENI choice (profile, inline security groups, fixed IPs) checked against
 * what the operator configured, before anything is recorded or allocated.
 *
 * Annotations are written by whoever can create a pod, so a pod gets only what
 * the config allows: a configured profile, from a namespace the profile admits,
 * inline groups from the profile's allow-list (none by default), all of one kind,
 * and fixed IPs inside the profile's subnets. Each refusal names the rule.
 *
 * @module
 */
import { contains, parseCidr, parseIp } from "../lib/ip.ts";
import { isEnterpriseGroup, type ProfileInfo } from "../providers/contract.ts";
import { ApiError } from "../api/schema.ts";
import { listOf, quote } from "../lib/clip.ts";

/** What a pod asks for. */
export interface Choice {
  /** The pod's Kubernetes namespace. */
  namespace: string;
  profile: string;
  securityGroupIds?: string[];
  ips: string[];
}

/** Values quoted for a message: the first few, clipped, then how many more. */
const quoteAll = (xs: string[]) => listOf(xs.map((x) => quote(x)));

/**
 * Checks `choice` against the provider's profiles and returns the profile it
 * names.
 *
 * @throws {ApiError} `not_allowed` naming the rule (unknown profile, namespace
 *   not admitted, inline groups off or not allowed, mixed kinds), or
 *   `requested_ip_unavailable` for a fixed IP outside the profile's subnets
 */
export function checkChoice(profiles: ProfileInfo[], choice: Choice): ProfileInfo {
  const profile = profiles.find((p) => p.name === choice.profile);
  if (!profile) {
    throw new ApiError(
      "not_allowed",
      `Profile "${choice.profile}" is not configured on this node (configured: ${
        quoteAll(profiles.map((p) => p.name))
      }); nothing was allocated`,
    );
  }
  const name = `Profile "${profile.name}"`;
  if (profile.namespaces !== null && !profile.namespaces.includes(choice.namespace)) {
    throw new ApiError(
      "not_allowed",
      `${name} admits pods of the namespaces ${
        quoteAll(profile.namespaces)
      } only, not of "${choice.namespace}" (the profile's "namespaces" rule); nothing was allocated`,
    );
  }
  const groups = choice.securityGroupIds;
  if (groups !== undefined) {
    if (groups.length === 0) {
      throw new ApiError("not_allowed", "Inline security groups name no group");
    }
    if (profile.allowedSecurityGroupIds.length === 0) {
      throw new ApiError(
        "not_allowed",
        `${name} allows no inline security groups (its "allowedSecurityGroupIds" is empty, so inline groups are off); nothing was allocated`,
      );
    }
    const refused = groups.filter((g) => !profile.allowedSecurityGroupIds.includes(g));
    if (refused.length > 0) {
      throw new ApiError(
        "not_allowed",
        `${name} does not allow the security group${refused.length > 1 ? "s" : ""} ${
          quoteAll(refused)
        } inline (allowed: ${
          quoteAll(profile.allowedSecurityGroupIds)
        }, its "allowedSecurityGroupIds"); nothing was allocated`,
      );
    }
    const enterprise = groups.filter(isEnterpriseGroup);
    if (enterprise.length > 0 && enterprise.length < groups.length) {
      throw new ApiError(
        "not_allowed",
        `Inline security groups must be all regular ("g-…") or all enterprise ("esg-…"), as an ENI has one kind: ${
          quoteAll(groups)
        }`,
      );
    }
  }
  const perFamily = new Map<number, string>();
  for (const ip of choice.ips) {
    const a = parseIp(ip);
    if (!a) throw new ApiError("bad_request", `"${ip}" is not an IP address`);
    const other = perFamily.get(a.family);
    if (other !== undefined) {
      throw new ApiError(
        "requested_ip_unavailable",
        `An ENI has one primary IPv${a.family} address: ${other} and ${ip} were both asked for`,
      );
    }
    perFamily.set(a.family, ip);
    const fam = a.family === 4 ? "ipv4" : "ipv6";
    const subnet = profile.subnets[fam];
    if (subnet === undefined) {
      // A provider that does not know the subnet (yet) decides itself.
      if (Object.keys(profile.subnets).length === 0) continue;
      throw new ApiError(
        "requested_ip_unavailable",
        `${name} has no IPv${a.family} subnet, so it cannot give ${ip}; nothing was allocated`,
      );
    }
    const cidr = parseCidr(subnet);
    if (cidr && !contains(cidr, a)) {
      throw new ApiError(
        "requested_ip_unavailable",
        `${ip} is outside the subnet ${subnet} of profile "${profile.name}"; nothing was allocated`,
      );
    }
  }
  return profile;
}
