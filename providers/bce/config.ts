/**
 * The `bce` provider's config schema and credential loading.
 *
 * Profiles: the top-level subnet, security groups, warm pool, `namespaces` and
 * `allowedSecurityGroupIds` are the `default` profile (a config written before
 * profiles means exactly what it did); `profiles` adds named ones, each with its
 * own subnet, groups (regular or enterprise, one kind) and warm pool. The node
 * limit is shared by all of them (see `_slots.ts`).
 *
 * Credentials come from a JSON file (`{accessKeyId, secretAccessKey,
 * sessionToken?}`) that must not be readable or writable by group or others,
 * or from `ENIM_BCE_ACCESS_KEY_ID` / `ENIM_BCE_SECRET_ACCESS_KEY` /
 * `ENIM_BCE_SESSION_TOKEN`. They are never logged and never in an error. The
 * file is read again when it changes ({@linkcode credentialsSource}): a Secret
 * mounted as files rotates the key without a restart.
 *
 * @module
 */
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import {
  DEFAULT_PROFILE,
  isEnterpriseGroup,
  NetworkCidrSchema,
  ProfileNameSchema,
  ProviderError,
  SecurityGroupIdSchema,
} from "../contract.ts";
import { overlaps, parseCidr } from "../../lib/ip.ts";
import { ClusterIdSchema } from "./_sticky.ts";
import { DEFAULT_METADATA_URL } from "./metadata.ts";

/** ENIs of one profile kept attached and free. */
const WarmPoolSchema = z._default(
  z.object({
    minIdle: z._default(z.number().check(z.int(), z.minimum(0)), 0),
    maxIdle: z._default(z.number().check(z.int(), z.minimum(0)), 2),
  }),
  { minIdle: 0, maxIdle: 2 },
).check(z.refine((w) => w.minIdle <= w.maxIdle, {
  message: "warmPool.minIdle must not exceed warmPool.maxIdle",
}));

/** The Kubernetes namespaces whose pods may use a profile (absent: every namespace). */
const NamespacesSchema = z.optional(z.array(z.string().check(z.minLength(1))));

/**
 * The groups a pod of a profile may name inline (`enim.dev/security-group-ids`);
 * empty (the default): inline groups are off for the profile.
 */
const AllowedGroupsSchema = z._default(z.array(SecurityGroupIdSchema), []);

/** Whether a profile's own groups are set when inline groups are allowed (they are restored after the pod). */
function groupsToRestore(
  p: {
    securityGroupIds: string[];
    enterpriseSecurityGroupIds: string[];
    allowedSecurityGroupIds: string[];
  },
): boolean {
  return p.allowedSecurityGroupIds.length === 0 ||
    p.securityGroupIds.length + p.enterpriseSecurityGroupIds.length > 0;
}
const RESTORE_MESSAGE =
  "allowedSecurityGroupIds needs the profile's own securityGroupIds or enterpriseSecurityGroupIds: they are put back on the ENI when the pod leaves";

/**
 * How far the profile's sticky pods (`enim.dev/sticky`) keep their ENI: `node`
 * (the default: the node that ran the pod holds it for its next container there)
 * or `zone` (after `nodeHoldSeconds` on the node, the ENI is parked in the VPC
 * and any node of its zone takes it for the pod; the cloud is the record and the
 * arbiter). The whole hold is the agent's `sticky.holdSeconds`.
 */
const StickySchema = z._default(
  z.strictObject({
    scope: z._default(z.enum(["node", "zone"]), "node"),
    /** Zone scope: how long the ENI stays attached to the node first (same-node re-creates stay instant). */
    nodeHoldSeconds: z._default(z.number().check(z.minimum(0), z.maximum(7 * 86_400)), 30),
  }),
  { scope: "node", nodeHoldSeconds: 30 },
);

/** A CIDR of one family. */
function cidrOfFamily(family: 4 | 6) {
  return NetworkCidrSchema.check(z.refine(
    (s) => (family === 6) === s.includes(":"),
    `Expected an IPv${family} prefix`,
  ));
}

/** What {@linkcode refuseOverlaps} reads of a profile. */
interface SubnetOf {
  subnetId?: string;
  subnetCidr?: string;
  subnetIpv6Cidr?: string;
}

/**
 * Two profiles may share one subnet (the same `subnetId`, other groups); two different
 * subnets whose CIDRs, as given, overlap cannot both exist in a VPC: a typo, refused
 * naming both. The default profile's subnet counts when its `subnetId` is set.
 */
function refuseOverlaps(
  cfg: SubnetOf & { profiles: Record<string, SubnetOf> },
  ctx: z.core.$RefinementCtx,
): void {
  const all: [string, SubnetOf][] = [[DEFAULT_PROFILE, cfg], ...Object.entries(cfg.profiles)];
  const seen: { profile: string; subnetId: string; cidr: string }[] = [];
  for (const [profile, p] of all) {
    if (p.subnetId === undefined) continue;
    for (const key of ["subnetCidr", "subnetIpv6Cidr"] as const) {
      const cidr = p[key];
      const mine = cidr === undefined ? null : parseCidr(cidr);
      if (!mine) continue;
      const other = seen.find((o) =>
        o.subnetId !== p.subnetId && overlaps(parseCidr(o.cidr)!, mine)
      );
      if (other) {
        ctx.addIssue({
          code: "custom",
          message: `${key} "${cidr}" of profile "${profile}" (subnet "${p.subnetId}") overlaps ` +
            `"${other.cidr}" of profile "${other.profile}" (subnet "${other.subnetId}"), another ` +
            `subnet: a VPC's subnets never overlap`,
          path: profile === DEFAULT_PROFILE ? [key] : ["profiles", profile, key],
          input: cidr,
        });
      }
      seen.push({ profile, subnetId: p.subnetId, cidr: cidr! });
    }
  }
}

/** A named profile (`profiles.<name>`): its subnet, groups, warm pool and who may use it. */
export const ProfileConfigSchema = z.strictObject({
  /** The subnet the profile's ENIs are created in. */
  subnetId: z.string().check(z.minLength(1)),
  /** The subnet's CIDR, to skip the subnet lookup. */
  subnetCidr: z.optional(cidrOfFamily(4)),
  /** The subnet's IPv6 CIDR, to skip the subnet lookup. */
  subnetIpv6Cidr: z.optional(cidrOfFamily(6)),
  /** The regular groups (`g-…`) of the profile's ENIs; or set enterpriseSecurityGroupIds. */
  securityGroupIds: z._default(z.array(SecurityGroupIdSchema), []),
  /** The enterprise groups (`esg-…`) of the profile's ENIs; or set securityGroupIds. */
  enterpriseSecurityGroupIds: z._default(z.array(SecurityGroupIdSchema), []),
  warmPool: WarmPoolSchema,
  namespaces: NamespacesSchema,
  allowedSecurityGroupIds: AllowedGroupsSchema,
  /** How far its sticky pods keep their ENI (`scope: "zone"` needs `clusterId`). */
  sticky: StickySchema,
}).check(
  z.refine(
    (p) => (p.securityGroupIds.length > 0) !== (p.enterpriseSecurityGroupIds.length > 0),
    "Set securityGroupIds or enterpriseSecurityGroupIds (one kind: an ENI has one)",
  ),
  z.refine(
    (p) =>
      !p.securityGroupIds.some(isEnterpriseGroup) &&
      p.enterpriseSecurityGroupIds.every(isEnterpriseGroup),
    'Expected regular groups ("g-…") in securityGroupIds and enterprise groups ("esg-…") in enterpriseSecurityGroupIds',
  ),
  z.refine(groupsToRestore, RESTORE_MESSAGE),
);
/** A named profile's config. */
export type ProfileConfig = z.infer<typeof ProfileConfigSchema>;

/** The `provider.bce` object of the agent config. */
export const configSchema = z.object({
  /** The region (`bj`, `gz`, …): the endpoint is `https://bcc.<region>.baidubce.com`. From metadata when absent. */
  region: z.optional(z.string().check(z.regex(/^[a-z0-9-]+$/))),
  /** An endpoint override (`host[:port]` or a URL); https when no scheme is given. */
  endpoint: z.optional(z.string().check(z.minLength(1))),
  /** A JSON credentials file, mode 0600 or stricter. Env vars are used when absent. */
  credentialsFile: z.optional(z.string().check(z.minLength(1))),
  /** The VPC; from metadata when absent. */
  vpcId: z.optional(z.string().check(z.minLength(1))),
  /** The subnet new ENIs are created in; the primary NIC's subnet (metadata) when absent. */
  subnetId: z.optional(z.string().check(z.minLength(1))),
  /** The subnet's CIDR, to skip the subnet lookup (prefix length and gateway). */
  subnetCidr: z.optional(z.string()),
  securityGroupIds: z._default(z.array(z.string().check(z.minLength(1))), []),
  enterpriseSecurityGroupIds: z._default(z.array(z.string().check(z.minLength(1))), []),
  /** This node's instance id; from metadata when absent. */
  instanceId: z.optional(z.string().check(z.minLength(1))),
  metadataUrl: z._default(z.url(), DEFAULT_METADATA_URL),
  /** ENIs of the default profile kept attached and free. */
  warmPool: WarmPoolSchema,
  /** The namespaces whose pods may use the default profile (absent: every namespace). */
  namespaces: NamespacesSchema,
  /** The groups a pod of the default profile may name inline (empty: inline groups are off). */
  allowedSecurityGroupIds: AllowedGroupsSchema,
  /** How far the default profile's sticky pods keep their ENI (`scope: "zone"` needs `clusterId`). */
  sticky: StickySchema,
  /**
   * This cluster's id, in the cloud records of zone-sticky ENIs (their names and
   * descriptions): it keeps clusters sharing a VPC from taking each other's pods'
   * ENIs. Needed by a `sticky.scope` of `zone`; the same on every node of the cluster.
   */
  clusterId: z.optional(ClusterIdSchema),
  /**
   * Named profiles besides `default` (the top-level subnet, groups and warm pool),
   * each with its own subnet, groups and warm pool; the node limit is shared.
   */
  profiles: z._default(
    z.record(ProfileNameSchema, ProfileConfigSchema).check(
      z.refine(
        (p) => !(DEFAULT_PROFILE in p),
        'The "default" profile is the top-level settings; name the others differently',
      ),
    ),
    {},
  ),
  /**
   * The most ENIs this node may have attached (the primary NIC not counted). The
   * provider also asks BCE (`/v1/eni/quota`, else the instance's `eniQuota`) and uses
   * the smaller of the two; this value alone when BCE does not answer.
   */
  maxEnisPerNode: z.optional(z.number().check(z.int(), z.minimum(1), z.maximum(64))),
  /** The name prefix marking ENIs this provider created; it never touches others. */
  namePrefix: z._default(z.string().check(z.regex(/^[A-Za-z][A-Za-z0-9\-_.]{0,23}$/)), "enim"),
  description: z._default(z.string().check(z.maxLength(200)), "created by enim, do not modify"),
  /**
   * IPv6 on new ENIs: `auto` asks for an address when the subnet has an IPv6 range
   * (`ipv6Cidr` in its detail, or `subnetIpv6Cidr`), `always` asks in any case,
   * `never` never asks.
   */
  ipv6: z._default(z.enum(["auto", "always", "never"]), "auto"),
  /** The subnet's IPv6 CIDR, to skip the subnet lookup. */
  subnetIpv6Cidr: z.optional(z.string()),
  timeouts: z.prefault(
    z.object({
      requestMs: z._default(z.number().check(z.int(), z.minimum(1)), 20_000),
      totalMs: z._default(z.number().check(z.int(), z.minimum(1)), 60_000),
      maxAttempts: z._default(z.number().check(z.int(), z.minimum(1), z.maximum(20)), 5),
      baseDelayMs: z._default(z.number().check(z.int(), z.minimum(0)), 1000),
      maxDelayMs: z._default(z.number().check(z.int(), z.minimum(0)), 10_000),
      /**
       * How long a new or claimed ENI may take to become `inuse`, refusals of a young ENI's
       * attach included: Baidu's CNI tolerates 5 min (cce-network-v2/pkg/bce/bcesync/eni.go
       * `ENIMaxCreateDuration`).
       */
      attachMs: z._default(z.number().check(z.int(), z.minimum(1)), 300_000),
      /** How long to wait for a detach to finish before escalating. */
      detachMs: z._default(z.number().check(z.int(), z.minimum(1)), 60_000),
      /** After the escalation's detach, how long to wait before deleting anyway. */
      escalateMs: z._default(z.number().check(z.int(), z.minimum(1)), 15_000),
      /** How long a not-found on an ENI this provider has just created is retried. */
      createVisibilityMs: z._default(z.number().check(z.int(), z.minimum(0)), 10_000),
      /** How long to wait for a new ENI's device to appear on the node. */
      deviceMs: z._default(z.number().check(z.int(), z.minimum(1)), 30_000),
      /** The first poll interval while waiting for a status (doubling, capped at 5 s). */
      pollMs: z._default(z.number().check(z.int(), z.minimum(1)), 1000),
      /** The warm pool loop's period while something changes. */
      poolIntervalMs: z._default(z.number().check(z.int(), z.minimum(1)), 30_000),
      /** The longest period, reached by doubling while nothing changes. */
      idleIntervalMs: z._default(z.number().check(z.int(), z.minimum(1)), 300_000),
      /** A pass lists the whole VPC (orphan scan) at most this often; other passes list this instance's ENIs. */
      orphanScanIntervalMs: z._default(z.number().check(z.int(), z.minimum(1)), 3_600_000),
      /** How often a quarantined (stuck) ENI is tried again. */
      quarantineRetryMs: z._default(z.number().check(z.int(), z.minimum(1)), 600_000),
      /** The shortest gap between two passes, even when an allocation asks for one. */
      minPassGapMs: z._default(z.number().check(z.int(), z.minimum(0)), 5_000),
      /** How often the node's ENI limit is asked again (an instance's quota can change). */
      limitRefreshMs: z._default(z.number().check(z.int(), z.minimum(1)), 600_000),
      /** Each period is multiplied by a random factor in [1 - jitter, 1 + jitter]. */
      jitter: z._default(z.number().check(z.minimum(0), z.maximum(0.9)), 0.2),
      /**
       * A parked ENI whose hold expired is deleted by the node that parked it at once,
       * by any other node's orphan scan only this long after (clocks differ).
       */
      parkedExpiryGraceMs: z._default(z.number().check(z.int(), z.minimum(0)), 60_000),
      /**
       * Should BCE ignore the list's name filter: how long the shared index of the VPC's
       * zone-sticky ENIs serves lookups before it is listed again.
       */
      stickyIndexTtlMs: z._default(z.number().check(z.int(), z.minimum(0)), 10_000),
    }),
    {},
  ),
}).check(
  z.refine((c) => !(c.securityGroupIds.length && c.enterpriseSecurityGroupIds.length), {
    message: "Set securityGroupIds or enterpriseSecurityGroupIds, not both",
  }),
  z.refine(groupsToRestore, RESTORE_MESSAGE),
  z.superRefine(refuseOverlaps),
  z.refine(
    (c) =>
      c.clusterId !== undefined ||
      (c.sticky.scope !== "zone" &&
        Object.values(c.profiles).every((p) => p.sticky.scope !== "zone")),
    {
      message:
        'A sticky.scope of "zone" needs clusterId (the same on every node of the cluster: it keeps clusters sharing a VPC apart)',
      path: ["clusterId"],
    },
  ),
);
/** The `bce` provider config. */
export type BceConfig = z.infer<typeof configSchema>;

/**
 * The regions whose BCC endpoint is `bcc.<region>.baidubce.com`: the ENI SDK page's
 * endpoint table (bj, gz, su, hkg, fwh, bd; https://cloud.baidu.com/doc/VPC/s/Olq384whg)
 * and Baidu's CNI's own table (cce-network-v2/pkg/bce/api/cloud/types.go `BCCEndpoints`,
 * which adds sin, fsh, yq, nj, cd). Baidu's CNI takes the region from its config through
 * that table and never from the metadata service, whose `region` format no source shows.
 */
export const KNOWN_REGIONS: readonly string[] = [
  "bj",
  "gz",
  "su",
  "hkg",
  "fwh",
  "bd",
  "sin",
  "fsh",
  "yq",
  "nj",
  "cd",
];

/**
 * The API endpoint URL for a config: the override (https by default) or the region's
 * BCC host, the region checked against {@linkcode KNOWN_REGIONS} (another region needs
 * `endpoint`).
 */
export function endpointFor(
  endpoint: string | undefined,
  region: string | undefined,
  regionFrom = "provider.bce.region",
): string {
  if (endpoint) return /^[a-z]+:\/\//i.test(endpoint) ? endpoint : `https://${endpoint}`;
  if (!region) {
    throw new ProviderError("other", "Cannot tell the BCE endpoint: set region or endpoint");
  }
  if (!KNOWN_REGIONS.includes(region)) {
    throw new ProviderError(
      "other",
      `Region "${region}" (${regionFrom}) is not a known BCE region (${
        KNOWN_REGIONS.join(", ")
      }): set provider.bce.region to one of them, or provider.bce.endpoint to the BCC endpoint (for example "bcc.bj.baidubce.com")`,
    );
  }
  return `https://bcc.${region}.baidubce.com`;
}

export { credentialsSource, loadCredentials } from "./credentials.ts";
