/**
 * The provider contract's values: pure zod schemas and the error type, with no
 * other dependency, so the CNI plugin's import graph (which parses ENIs and IPs
 * in API answers) stays small. `contract.ts` re-exports everything here and adds
 * the interfaces and the helpers only the agent needs.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { canonicalCidr, familyOf, hasHostBits, inRange, isCidr, parseCidr } from "../lib/ip.ts";

/** A MAC address in the lower-case, colon-separated form the clouds and `ip -j` use. */
export const MacSchema = z.string().check(
  z.regex(/^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/, "Expected a lower-case colon-separated MAC address"),
);

/** An IPv4 or IPv6 address without a prefix length. */
export const IpSchema = z.union([z.ipv4(), z.ipv6()]);

/** The check that a route's gateway is of its destination's family. */
export function routeFamilyCheck<T extends { dst: string; gw?: string }>() {
  return z.refine<T>(
    (r) => r.gw === undefined || familyOf(r.dst) === null || familyOf(r.gw) === familyOf(r.dst),
    { error: "Expected the gateway of the same family as dst", path: ["gw"] },
  );
}

/** One address of an ENI: the address, its subnet's prefix length, and the subnet gateway. */
export const EniAddressSchema = z.object({
  address: IpSchema,
  prefixLength: z.number().check(z.int(), z.minimum(0), z.maximum(128)),
  gateway: IpSchema,
});
/** One address of an ENI. */
export type EniAddress = z.infer<typeof EniAddressSchema>;

/**
 * Who holds an ENI: one CNI attachment of one pod.
 *
 * The seed calls the pod the owner; an attachment is keyed by (containerId, ifName)
 * per the CNI spec, so the provider-level owner carries both. `deallocateENI` frees
 * exactly what this attachment holds, which lets one pod hold a recycling ENI of
 * its old container while its new container gets another one.
 */
export const OwnerSchema = z.object({
  /** The pod, `namespace/name`. */
  pod: z.string().check(
    z.minLength(3),
    z.maxLength(317),
    z.regex(/^[^/\s]+\/[^/\s]+$/, 'Expected "namespace/name"'),
  ),
  containerId: z.string().check(z.minLength(1), z.maxLength(256)),
  ifName: z.string().check(z.minLength(1), z.maxLength(15)),
});
/** Who holds an ENI. */
export type Owner = z.infer<typeof OwnerSchema>;

/** What identifies one CNI attachment (the spec's key): the container and the interface. */
export interface AttachmentKey {
  containerId: string;
  ifName: string;
}

/**
 * An attachment's key as one string, `<containerId>/<ifName>` (for maps, locks and logs).
 *
 * The CNI spec keys a plugin's state by network name, container and interface. enim leaves
 * the network out on purpose: an interface name is unique inside a container's namespace,
 * so (container, interface) already names one attachment whatever the network, and two
 * networks can never both hold `eth0` of one container. The network name is recorded on the
 * attachment (CNI GC reclaims by it) and a DEL or CHECK that names another network for the
 * same key reaches the same one attachment, which is what the runtime meant.
 */
export function keyOf(k: AttachmentKey): string {
  return `${k.containerId}/${k.ifName}`;
}

/** A pod as one string, `namespace/name`: what {@linkcode Owner.pod}, the state and the logs hold. */
export function podKeyOf(pod: { namespace: string; name: string }): string {
  return `${pod.namespace}/${pod.name}`;
}

/** The profile every provider has: its top-level settings, and what a pod gets by default. */
export const DEFAULT_PROFILE = "default";

/** A profile's name: a DNS label (it travels in pod annotations and CNI_ARGS). */
export const ProfileNameSchema = z.string().check(
  z.regex(
    /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/,
    "Expected a profile name: lower-case letters, digits and '-', at most 63",
  ),
);

/**
 * A security group id as BCE writes them: `g-…` for a regular group, `esg-…` for
 * an enterprise one (the mock uses the same forms).
 */
export const SecurityGroupIdSchema = z.string().check(
  z.regex(
    /^(g|esg)-[A-Za-z0-9]{1,63}$/,
    'Expected a security group id such as "g-SY5smEG9" (regular) or "esg-4k9u2z1q" (enterprise)',
  ),
);

/** Whether a security group id names an enterprise group. */
export function isEnterpriseGroup(id: string): boolean {
  return id.startsWith("esg-");
}

/** An ENI as the provider reports it. */
export const EniSchema = z.object({
  /** The cloud's id (`eni-…`). */
  id: z.string().check(z.minLength(1)),
  mac: MacSchema,
  /** The primary IPv4 address, when the ENI has one. */
  ipv4: z.nullable(EniAddressSchema),
  /** The first IPv6 address, when the ENI has one. */
  ipv6: z.nullable(EniAddressSchema),
  subnetId: z._default(z.nullable(z.string()), null),
  /** `free`: attached to this node and available; `owned`: assigned to {@linkcode Owner}. */
  state: z.enum(["free", "owned"]),
  owner: z.nullable(OwnerSchema),
  /** The profile the ENI belongs to (its subnet and default groups). */
  profile: z._default(z.string(), DEFAULT_PROFILE),
  /** The groups the cloud reports on the ENI now (a pod's inline groups while it owns it). */
  securityGroupIds: z._default(z.array(z.string()), []),
  enterpriseSecurityGroupIds: z._default(z.array(z.string()), []),
  /** The description the cloud shows (the owning pod while one owns it), when known. */
  description: z._default(z.nullable(z.string()), null),
  /**
   * `lost`: the cloud no longer has the ENI (deleted out of band) while a pod owns
   * it; the pod keeps a device whose ENI is gone, and DEL or GC forgets it.
   */
  cloudState: z._default(z.enum(["ok", "lost"]), "ok"),
});
/** An ENI as the provider reports it. */
export type Eni = z.infer<typeof EniSchema>;
/** An ENI as a provider may write it (the fields with defaults optional). */
export type EniInput = z.input<typeof EniSchema>;

/** An ENI from a provider's own (trusted) values: the defaults filled in, nothing parsed. */
export function makeEni(e: EniInput): Eni {
  return {
    subnetId: null,
    profile: DEFAULT_PROFILE,
    securityGroupIds: [],
    enterpriseSecurityGroupIds: [],
    description: null,
    cloudState: "ok",
    ...e,
  } as Eni;
}

/**
 * A network prefix: `addr/len` of either family, with its host bits clear
 * (`10.0.0.5/24` is refused, naming `10.0.0.0/24`).
 */
export const NetworkCidrSchema = z.string().check(
  z.refine(isCidr, "Expected a prefix such as 10.0.0.0/24 or fd00::/64"),
  z.refine((s) => {
    const c = parseCidr(s);
    return !c || !hasHostBits(c);
  }, {
    error: (iss) => {
      const c = parseCidr(String(iss.input));
      return `Expected a network address with its host bits clear${
        c ? `: did you mean ${canonicalCidr(c)}?` : ""
      }`;
    },
  }),
);

/** An IP range as in host-local's `ranges` (the `ipRanges` capability). */
export const IpRangeSchema = z.object({
  subnet: NetworkCidrSchema,
  rangeStart: z.optional(IpSchema),
  rangeEnd: z.optional(IpSchema),
  gateway: z.optional(IpSchema),
}).check(
  z.refine(
    (r) =>
      [r.rangeStart, r.rangeEnd, r.gateway].every((a) =>
        a === undefined || !isCidr(r.subnet) || inRange(a, { subnet: r.subnet })
      ),
    "Expected rangeStart, rangeEnd and gateway inside the subnet",
  ),
);
/** An IP range. */
export type IpRange = z.infer<typeof IpRangeSchema>;

/** What an ADD asks for beyond "any ENI". */
export const AllocationRequestSchema = z.object({
  /**
   * Specific IPs (a fixed IP: `enim.dev/ip`, `args.cni.ips`, `IP=`): the ENI must
   * carry every one. A provider that can creates an ENI with them in the profile's
   * subnet when no pooled ENI carries them.
   */
  ips: z._default(z.array(IpSchema), []),
  /** Range sets (the `ipRanges` capability): the ENI's address must fall in one range of each set. */
  ranges: z._default(z.array(z.array(IpRangeSchema)), []),
  /** The profile whose subnet and groups the ENI has (the manager checked the pod may use it). */
  profile: z._default(ProfileNameSchema, DEFAULT_PROFILE),
  /**
   * Inline security groups: the ENI's groups are replaced by these while `owner`
   * holds it, and the profile's restored when it is freed. All of one kind
   * (all `g-…` or all `esg-…`).
   */
  securityGroupIds: z.optional(z.array(SecurityGroupIdSchema)),
  /**
   * A sticky pod's comeback: the ENI `takeOver` holds (the pod's previous
   * container, kept through its DEL) goes to `owner`. When it holds none any more,
   * an ENI is allocated as usual.
   */
  takeOver: z.optional(OwnerSchema),
  /**
   * Reconcile's repair: the state records this ENI for `owner` while the provider
   * shows it free. Exactly this ENI goes to `owner` (with its profile's groups), or
   * the call fails with `wrong_state` and nothing else is allocated.
   */
  eniId: z.optional(z.string().check(z.minLength(1))),
  /**
   * The pod is sticky. With a profile whose sticky scope is `zone`, the provider
   * first looks for the pod's ENI in the cloud (parked in the VPC by any node of
   * the zone, or left on a stopped one) and claims it; failing with
   * `sticky_conflict` or `wrong_zone` when it may not. Without one, an ENI is
   * allocated as usual and kept findable for the pod.
   */
  sticky: z.optional(z.boolean()),
});
/** What an ADD asks for. */
export type AllocationRequest = z.infer<typeof AllocationRequestSchema>;
/** What an ADD asks for, as a caller may write it (`profile` defaults to `default`). */
export type AllocationRequestInput = z.input<typeof AllocationRequestSchema>;

/**
 * How far a profile's sticky pods keep their ENI: `node` (the node that ran the
 * pod holds it for the pod's next container there) or `zone` (after a node hold
 * of `nodeHoldSeconds` the ENI is parked in the VPC, and any node of its zone
 * takes it for the pod; the provider must implement `parkENI`).
 */
export const StickyPolicySchema = z.object({
  scope: z.enum(["node", "zone"]),
  /** Zone scope: how long the ENI first stays attached to the node after the pod's DEL. */
  nodeHoldSeconds: z.number().check(z.minimum(0)),
});
/** How far a profile's sticky pods keep their ENI. */
export type StickyPolicy = z.infer<typeof StickyPolicySchema>;

/** A profile as the provider runs it: what the manager checks a pod's choice against. */
export const ProfileInfoSchema = z.object({
  name: ProfileNameSchema,
  /** The profile's subnets (a requested IP must lie in the one of its family). */
  subnets: z.object({ ipv4: z.optional(z.string()), ipv6: z.optional(z.string()) }),
  securityGroupIds: z.array(z.string()),
  enterpriseSecurityGroupIds: z.array(z.string()),
  /** The Kubernetes namespaces whose pods may use it; null: every namespace. */
  namespaces: z.nullable(z.array(z.string())),
  /** The groups a pod of this profile may name inline (empty: inline groups are off). */
  allowedSecurityGroupIds: z.array(z.string()),
  /** Its sticky pods' scope; absent: `node`. */
  sticky: z.optional(StickyPolicySchema),
});
/** A profile as the provider runs it. */
export type ProfileInfo = z.infer<typeof ProfileInfoSchema>;

/** An ENI this node parked in the VPC for a zone-sticky pod, as long as it is there. */
export const ParkedEniSchema = z.object({
  eniId: z.string(),
  pod: z.string(),
  ifName: z.string(),
  profile: z.string(),
  /** `parking`: recorded, not yet detached; `parked`: in the VPC, waiting for its pod. */
  state: z.enum(["parking", "parked"]),
  /** When it was parked (ISO 8601). */
  since: z.string(),
  /** Until when it is kept for the pod (ISO 8601); then any node reclaims it. */
  until: z.string(),
});
/** An ENI this node parked. */
export type ParkedEni = z.infer<typeof ParkedEniSchema>;

/** A zone-sticky pod's ENI this node claimed from the VPC (or from a stopped node). */
export const StickyClaimSchema = z.object({
  eniId: z.string(),
  pod: z.string(),
  ifName: z.string(),
  /** The instance that parked it or held it, when its record said. */
  from: z.nullable(z.string()),
  /** When (ISO 8601). */
  at: z.string(),
});
/** A claim this node made. */
export type StickyClaim = z.infer<typeof StickyClaimSchema>;

/** Zone-wide sticky pods, as `enim status` shows them. */
export const StickyStatusSchema = z.object({
  parked: z.array(ParkedEniSchema),
  claims: z.array(StickyClaimSchema),
});
/** Zone-wide sticky pods, as `enim status` shows them. */
export type StickyStatus = z.infer<typeof StickyStatusSchema>;

/** One profile's pool. */
export const ProfilePoolSchema = z.object({
  free: z.number().check(z.int(), z.minimum(0)),
  owned: z.number().check(z.int(), z.minimum(0)),
});

/** Pool counts a provider reports. */
export const ProviderStatusSchema = z.object({
  name: z.string(),
  /** ENIs attached to this node and free. */
  free: z.number().check(z.int(), z.minimum(0)),
  /** ENIs attached to this node and owned. */
  owned: z.number().check(z.int(), z.minimum(0)),
  /** How many more ENIs the node can attach (0 when at its limit). */
  attachable: z.number().check(z.int(), z.minimum(0)),
  /** Provider-specific details for `enim status`. */
  details: z._default(z.record(z.string(), z.unknown()), {}),
  /** The pool of each profile (the node limit is shared by all). */
  profiles: z._default(z.record(z.string(), ProfilePoolSchema), {}),
  /** Zone-wide sticky pods: what this node parked in the VPC, and the claims it made (optional). */
  sticky: z.optional(StickyStatusSchema),
});
/** Pool counts a provider reports. */
export type ProviderStatus = z.infer<typeof ProviderStatusSchema>;
/** Pool counts as a provider may write them. */
export type ProviderStatusInput = z.input<typeof ProviderStatusSchema>;

/** Why a provider call failed, as far as the manager and the CNI side care. */
export type ProviderErrorReason =
  | "no_eni_available"
  | "requested_ip_unavailable"
  | "not_found"
  | "wrong_state"
  | "quota_exceeded"
  | "subnet_full"
  | "throttled"
  | "auth_failed"
  | "unavailable"
  /** A zone-sticky pod's ENI is on a running node, or another node claimed it first. */
  | "sticky_conflict"
  /** A zone-sticky pod's ENI is in another zone than this node. */
  | "wrong_zone"
  | "other";

/** A provider failure with a reason the manager maps to an API error code. */
export class ProviderError extends Error {
  readonly reason: ProviderErrorReason;
  readonly requestId?: string;
  constructor(
    reason: ProviderErrorReason,
    message: string,
    options?: { cause?: unknown; requestId?: string },
  ) {
    super(message, { cause: options?.cause });
    this.name = "ProviderError";
    this.reason = reason;
    this.requestId = options?.requestId;
  }
}

/** Slots of the node's ENI limit that pods cannot get, and why. */
export const CapacityHoldSchema = z.object({
  /**
   * The provider's: `foreign` (not enim's), `quarantined` (stuck), `parking` (zone-sticky
   * ENIs detaching into the VPC). The device plugin's (deviceplugin/accounting.ts):
   * `sticky_hold`, `no_device` (attachments kubelet counts no device for).
   */
  reason: z.enum(["foreign", "quarantined", "parking", "sticky_hold", "no_device"]),
  count: z.number().check(z.int(), z.positive()),
  /** The ENIs, when the provider knows them (for `enim status`). */
  eniIds: z._default(z.array(z.string()), []),
});
/** Slots pods cannot get. */
export type CapacityHold = z.infer<typeof CapacityHoldSchema>;

/**
 * How many ENIs pods can get on this node. A provider's figure counts pods' ENIs as
 * theirs; the device plugin takes off what kubelet counts no device for
 * (agent/deviceplugin/accounting.ts) and advertises the rest (`enim.dev/eni`).
 */
export const NodeCapacitySchema = z.object({
  /** The node's ENI limit: how many ENIs it can have attached besides its primary NIC. */
  limit: z.number().check(z.int(), z.minimum(0)),
  /** How many of them pods can get: the limit less the slots in `unavailable`. */
  forPods: z.number().check(z.int(), z.minimum(0)),
  /** The slots pods cannot get, by reason. */
  unavailable: z._default(z.array(CapacityHoldSchema), []),
  /** Where the limit came from (mock: `config`; BCE: `instance-eni-quota`, `eni-quota-api`, …). */
  source: z.string(),
  /** Why the figure may be off (something it is made of could not be read). */
  note: z.optional(z.string()),
}).check(z.refine((c) => c.forPods <= c.limit, "Expected forPods at most the limit"));
/** How many ENIs pods can get on this node. */
export type NodeCapacity = z.infer<typeof NodeCapacitySchema>;
/** A node capacity as a provider may write it. */
export type NodeCapacityInput = z.input<typeof NodeCapacitySchema>;
