/**
 * The mock provider's config: the `default` profile's settings at the top level,
 * named profiles, the node limit, and the simulated cloud's behaviour (latency,
 * failure injection).
 *
 * @module
 */
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import { isCidr, overlaps, parseCidr } from "../../lib/ip.ts";
import { DEFAULT_PROFILE, ProfileNameSchema, SecurityGroupIdSchema } from "../contract.ts";

/** One simulated subnet: CIDR and gateway (default: the first host). */
export const MockSubnetSchema = z.strictObject({
  cidr: z.string().check(z.refine(isCidr, "Expected a CIDR such as 10.99.0.0/24")),
  gateway: z.optional(z.union([z.ipv4(), z.ipv6()])),
});

const SubnetsSchema = z.strictObject({
  ipv4: z.optional(MockSubnetSchema),
  ipv6: z.optional(MockSubnetSchema),
}).check(z.refine((s) => s.ipv4 || s.ipv6, "Expected at least one of ipv4 and ipv6"));

/** What each profile has: its subnets, groups, inventory and who may use it. */
const profileFields = {
  /** How many ENIs the simulated cloud has for this profile on this node. */
  enis: z._default(z.number().check(z.int(), z.minimum(0), z.maximum(4096)), 8),
  /** How many are attached when the inventory is first created (default: all, to the limit). */
  preattached: z.optional(z.number().check(z.int(), z.minimum(0))),
  /** The regular security groups of the profile's ENIs. */
  securityGroupIds: z._default(z.array(SecurityGroupIdSchema), ["g-mockdefault"]),
  /** The enterprise security groups of the profile's ENIs. */
  enterpriseSecurityGroupIds: z._default(z.array(SecurityGroupIdSchema), []),
  /** The Kubernetes namespaces whose pods may use the profile (default: all). */
  namespaces: z.optional(z.array(z.string().check(z.minLength(1)))),
  /** The groups a pod may name inline (default: none, so inline groups are off). */
  allowedSecurityGroupIds: z._default(z.array(SecurityGroupIdSchema), []),
};

/** A named profile of the mock cloud. */
export const MockProfileSchema = z.strictObject({
  ...profileFields,
  subnets: SubnetsSchema,
});

/**
 * Each profile has its own addresses: a profile's subnet that overlaps another profile's
 * (the default's included) is refused, naming both, as the same addresses would be
 * handed to ENIs of both.
 */
function refuseOverlaps(
  cfg: {
    subnets: z.output<typeof SubnetsSchema>;
    profiles: Record<string, { subnets: z.output<typeof SubnetsSchema> }>;
  },
  ctx: z.core.$RefinementCtx,
): void {
  const all = [
    [DEFAULT_PROFILE, cfg.subnets] as const,
    ...Object.entries(cfg.profiles).map(([n, p]) => [n, p.subnets] as const),
  ];
  const seen: { profile: string; fam: "ipv4" | "ipv6"; cidr: string }[] = [];
  for (const [profile, subnets] of all) {
    for (const fam of ["ipv4", "ipv6"] as const) {
      const cidr = subnets[fam]?.cidr;
      const mine = cidr === undefined ? null : parseCidr(cidr);
      if (!mine) continue;
      const other = seen.find((o) => overlaps(parseCidr(o.cidr)!, mine));
      if (other) {
        ctx.addIssue({
          code: "custom",
          message: `Subnet "${cidr}" of profile "${profile}" overlaps subnet "${other.cidr}" of ` +
            `profile "${other.profile}": each profile needs addresses of its own`,
          path: profile === DEFAULT_PROFILE
            ? ["subnets", fam]
            : ["profiles", profile, "subnets", fam],
          input: cidr,
        });
      }
      seen.push({ profile, fam, cidr: cidr! });
    }
  }
}

/**
 * One rule of the simulated cloud's security groups: `group` admits `from` (a group
 * id, or a CIDR) on `protocol` port `port` (a test VPC's bridge enforces it per port).
 */
export const MockGroupRuleSchema = z.strictObject({
  group: SecurityGroupIdSchema,
  from: z.union([
    SecurityGroupIdSchema,
    z.string().check(z.refine(isCidr, 'Expected a group id such as "g-web" or a CIDR')),
  ]),
  protocol: z.enum(["tcp", "udp"]),
  port: z.number().check(z.int(), z.minimum(1), z.maximum(65535)),
});

/** The mock provider's config (`provider.mock` in the agent config). */
export const MockConfigSchema = z.strictObject({
  ...profileFields,
  /**
   * How many ENIs can be attached to the node at once, all profiles together (default:
   * every profile's `enis` together). It may exceed the inventory: a pod's fixed IP that
   * no ENI carries makes the mock create one more ENI, which takes a free slot; only at
   * the limit is an idle ENI of another profile released for it (and logged).
   */
  maxEnisPerNode: z.optional(z.number().check(z.int(), z.minimum(0))),
  subnets: z._default(SubnetsSchema, { ipv4: { cidr: "10.99.0.0/24" } }),
  /** Named profiles besides `default` (the top-level settings). */
  profiles: z._default(
    z.record(ProfileNameSchema, MockProfileSchema).check(
      z.refine((p) => !(DEFAULT_PROFILE in p), 'The "default" profile is the top-level settings'),
    ),
    {},
  ),
  /** The first three bytes of every MAC. */
  macPrefix: z._default(
    z.string().check(
      z.regex(/^[0-9a-f]{2}(:[0-9a-f]{2}){2}$/, 'Expected three bytes like "02:e1:0a"'),
    ),
    "02:e1:0a",
  ),
  /** Id prefix; ids are the prefix and a 4-digit number. */
  idPrefix: z._default(z.string().check(z.minLength(1), z.maxLength(32)), "eni-mock-"),
  /** How long attaching a new ENI takes. */
  attachLatencyMs: z._default(z.number().check(z.int(), z.minimum(0), z.maximum(600_000)), 0),
  /** How long listing the ENIs takes (a slow cloud API, e.g. at the agent's start). */
  listLatencyMs: z._default(z.number().check(z.int(), z.minimum(0), z.maximum(600_000)), 0),
  /** Probability that an allocate or deallocate fails with reason "unavailable". */
  errorRate: z._default(z.number().check(z.minimum(0), z.maximum(1)), 0),
  /** Probability that an allocate or deallocate fails with reason "throttled". */
  throttleRate: z._default(z.number().check(z.minimum(0), z.maximum(1)), 0),
  /** Seed of the failure injection's random numbers (reproducible runs). */
  seed: z._default(z.number().check(z.int()), 1),
  /**
   * The simulated cloud's security group rules, enforced by the device simulator's VPC
   * (tests and demos): a group a rule names as `group` admits only what its rules name
   * (and the replies); every other group admits everything.
   */
  securityGroupRules: z._default(z.array(MockGroupRuleSchema), []),
}).check(z.superRefine(refuseOverlaps));
/** The mock provider's config, defaults applied. */
export type MockConfig = z.output<typeof MockConfigSchema>;
/** The mock provider's config as written (defaults optional). */
export type MockConfigInput = z.input<typeof MockConfigSchema>;
