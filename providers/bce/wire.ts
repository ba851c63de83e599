/**
 * What BCE's API sends and takes (reference §1, §2): the response bodies enim
 * reads, each a zod schema the client parses with, and the request arguments.
 *
 * @module
 */
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";

/**
 * A string field that may come as `null` or be absent: read as `""`, as bce-sdk-go
 * does (services/eni/model.go declares these fields plain `string`, and Go's JSON
 * decoder leaves a string untouched, so `""`, on a `null`).
 */
const GoString = z.pipe(z.nullish(z.string()), z.transform((v) => v ?? ""));

/** One private IP of an ENI. */
export const BcePrivateIpSchema = z.object({
  privateIpAddress: GoString,
  primary: z._default(z.boolean(), false),
  publicIpAddress: z.nullish(z.string()),
});

/** An ENI as the BCE API returns it (§2.1). */
export const BceEniSchema = z.object({
  eniId: z.string().check(z.minLength(1)),
  name: GoString,
  description: z.nullish(z.string()),
  zoneName: z.nullish(z.string()),
  instanceId: z.nullish(z.string()),
  macAddress: GoString,
  vpcId: z.nullish(z.string()),
  subnetId: GoString,
  status: GoString,
  privateIpSet: z.pipe(
    z.nullish(z.array(BcePrivateIpSchema)),
    z.transform((v) => v ?? []),
  ),
  ipv6PrivateIpSet: z.pipe(
    z.nullish(z.array(BcePrivateIpSchema)),
    z.transform((v) => v ?? []),
  ),
  securityGroupIds: z.nullish(z.array(z.string())),
  enterpriseSecurityGroupIds: z.nullish(z.array(z.string())),
  createdTime: z.nullish(z.string()),
  networkInterfaceTrafficMode: z.nullish(z.string()),
});
/** An ENI as the BCE API returns it. */
export type BceEni = z.infer<typeof BceEniSchema>;

/**
 * A list page. Its entries are read one by one ({@linkcode BceEniSchema}): the VPC holds
 * other tools' ENIs, and one that cannot be read must not fail the whole list.
 */
export const ListResultSchema = z.object({
  enis: z.pipe(z.nullish(z.array(z.unknown())), z.transform((v) => v ?? [])),
  marker: z.nullish(z.string()),
  isTruncated: z._default(z.boolean(), false),
  nextMarker: z.nullish(z.string()),
  maxKeys: z.nullish(z.number()),
});
export const CreateResultSchema = z.object({ eniId: z.string().check(z.minLength(1)) });
export const StatusResultSchema = z.object({ status: z.string() });
export const QuotaResultSchema = z.object({
  totalQuantity: z.number().check(z.int()),
  availableQuantity: z.number().check(z.int()),
});
/** A subnet's detail (`GET /v1/subnet/{id}`; bce-sdk-go services/vpc model.go Subnet). */
export const BceSubnetSchema = z.object({
  subnetId: z.string(),
  cidr: z.string(),
  ipv6Cidr: z.nullish(z.string()),
  zoneName: z.nullish(z.string()),
  vpcId: z.nullish(z.string()),
});
/** A subnet's detail. */
export type BceSubnet = z.infer<typeof BceSubnetSchema>;
export const SubnetResultSchema = z.object({ subnet: BceSubnetSchema });
/**
 * The fields of an instance's detail the provider reads (`GET /v2/instance/{id}?isDeploySet=false`;
 * bce-sdk-go services/bcc/api/instance.go GetInstanceDetail, model.go InstanceModel: `id`,
 * `eniQuota`, `cpuCount`). CCE reads `eniQuota` from it (cce-network-v2/pkg/bce/vpceni/node_bcc.go).
 */
export const BceInstanceSchema = z.object({
  id: z.nullish(z.string()),
  eniQuota: z.nullish(z.number().check(z.int(), z.minimum(0))),
  cpuCount: z.nullish(z.number().check(z.int(), z.minimum(0))),
  /** `Running`, `Stopped`, … (bce-sdk-go services/bcc/api/model.go InstanceStatus). */
  status: z.nullish(z.string()),
  /** The instance's availability zone (`zoneName`, bce-sdk-go InstanceModel). */
  zoneName: z.nullish(z.string()),
});
/** An instance's detail (the fields the provider reads). */
export type BceInstance = z.infer<typeof BceInstanceSchema>;
export const InstanceResultSchema = z.object({ instance: BceInstanceSchema });
export const ErrorBodySchema = z.object({
  code: z._default(z.string(), ""),
  message: z._default(z.string(), ""),
  requestId: z.nullish(z.string()),
});

/** Arguments of {@linkcode BceClient.createEni}. */
export interface CreateEniArgs {
  name: string;
  subnetId: string;
  securityGroupIds: string[];
  enterpriseSecurityGroupIds: string[];
  /** A fixed primary IPv4, or undefined for auto-assignment. */
  privateIpAddress?: string;
  /**
   * An IPv6 address too (the subnet needs an IPv6 range): `true` for an
   * auto-assigned one, a string for that fixed address.
   */
  ipv6?: boolean | string;
  description?: string;
}

/** Arguments of {@linkcode BceClient.updateEni}. */
export interface UpdateEniArgs {
  /** The ENI's current name, sent along so it can never be lost (the marker). */
  name?: string;
  description: string;
}

/** Filters of {@linkcode BceClient.listEnis}. */
export interface ListEnisArgs {
  vpcId: string;
  /** Sent to the server (`instanceId`): only ENIs attached to this instance. */
  instanceId?: string;
  /**
   * Matched on our side only. BCE's `name` filter is not sent for a prefix: whether
   * it matches names exactly, by prefix or fuzzily is unverified (reference §1.2).
   */
  namePrefix?: string;
  /**
   * One exact name, sent as BCE's `name` filter so the answer is small whichever
   * way BCE matches. Not filtered here: the caller matches the names, and can tell
   * from what BCE returned whether it ignored the filter.
   */
  name?: string;
  maxKeys?: number;
}
