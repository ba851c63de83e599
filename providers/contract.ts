/**
 * The provider contract: what every cloud (BCE, mock) implements for the ENI manager.
 *
 * The zod schemas are the one source of the types (`z.infer`). Every value a
 * provider returns is parsed through {@linkcode EniSchema} by the manager, so a
 * provider bug or a malformed cloud response cannot corrupt the agent's state.
 *
 * @module
 */
import { z } from "zod";
import ipaddr from "ipaddr.js";
import type { DatabaseSync } from "node:sqlite";
import type { Logger } from "../lib/log.ts";

/** A MAC address in the lower-case, colon-separated form the clouds and `ip -j` use. */
export const MacSchema = z.string().regex(
  /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/,
  "Expected a lower-case colon-separated MAC address",
);

/** An IPv4 or IPv6 address without a prefix length. */
export const IpSchema = z.union([z.ipv4(), z.ipv6()]);

/** One address of an ENI: the address, its subnet's prefix length, and the subnet gateway. */
export const EniAddressSchema = z.object({
  address: IpSchema,
  prefixLength: z.number().int().min(0).max(128),
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
  pod: z.string().min(3).max(317).regex(/^[^/\s]+\/[^/\s]+$/, 'Expected "namespace/name"'),
  containerId: z.string().min(1).max(256),
  ifName: z.string().min(1).max(15),
});
/** Who holds an ENI. */
export type Owner = z.infer<typeof OwnerSchema>;

/** An ENI as the provider reports it. */
export const EniSchema = z.object({
  /** The cloud's id (`eni-…`). */
  id: z.string().min(1),
  mac: MacSchema,
  /** The primary IPv4 address, when the ENI has one. */
  ipv4: EniAddressSchema.nullable(),
  /** The first IPv6 address, when the ENI has one. */
  ipv6: EniAddressSchema.nullable(),
  subnetId: z.string().nullable().default(null),
  /** `free`: attached to this node and available; `owned`: assigned to {@linkcode Owner}. */
  state: z.enum(["free", "owned"]),
  owner: OwnerSchema.nullable(),
});
/** An ENI as the provider reports it. */
export type Eni = z.infer<typeof EniSchema>;

/** An IP range as in host-local's `ranges` (the `ipRanges` capability). */
export const IpRangeSchema = z.object({
  subnet: z.string().min(1),
  rangeStart: IpSchema.optional(),
  rangeEnd: IpSchema.optional(),
  gateway: IpSchema.optional(),
});
/** An IP range. */
export type IpRange = z.infer<typeof IpRangeSchema>;

/** What an ADD asks for beyond "any ENI". */
export const AllocationRequestSchema = z.object({
  /** Specific IPs (from `args.cni.ips` or `IP=`): the ENI must carry one of them. */
  ips: z.array(IpSchema).default([]),
  /** Range sets (the `ipRanges` capability): the ENI's address must fall in one range of each set. */
  ranges: z.array(z.array(IpRangeSchema)).default([]),
});
/** What an ADD asks for. */
export type AllocationRequest = z.infer<typeof AllocationRequestSchema>;

/** Pool counts a provider reports. */
export const ProviderStatusSchema = z.object({
  name: z.string(),
  /** ENIs attached to this node and free. */
  free: z.number().int().min(0),
  /** ENIs attached to this node and owned. */
  owned: z.number().int().min(0),
  /** How many more ENIs the node can attach (0 when at its limit). */
  attachable: z.number().int().min(0),
  /** Provider-specific details for `enim status`. */
  details: z.record(z.string(), z.unknown()).default({}),
});
/** Pool counts a provider reports. */
export type ProviderStatus = z.infer<typeof ProviderStatusSchema>;

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

/**
 * A hook that makes an attached ENI appear as a network device with the ENI's MAC
 * on the node (the simulated VPC in tests and the demo), and disappear when detached.
 */
export interface DeviceSimulator {
  plug(eni: Eni): Promise<void>;
  unplug(eni: Eni): Promise<void>;
  close?(): Promise<void>;
}

/** What the agent hands a provider when it creates it. */
export interface ProviderContext {
  /** The agent's state database: a provider keeps its own tables in it, prefixed with its name. */
  db: DatabaseSync;
  log: Logger;
  /** Waits until a device with this MAC exists on the node (used after attaching a new ENI). */
  waitForDevice?(mac: string, timeoutMs: number): Promise<void>;
  /** Set by tests and the demo; absent in production. */
  deviceSimulator?: DeviceSimulator;
}

/**
 * The seed's ENIProvider.
 *
 * @example
 * ```ts ignore
 * const eni = await provider.allocateNextENI(
 *   { pod: "default/web-0", containerId: "c1", ifName: "eth0" },
 *   { ips: [], ranges: [] },
 * );
 * await provider.deallocateENI({ pod: "default/web-0", containerId: "c1", ifName: "eth0" });
 * ```
 */
export interface Provider {
  readonly name: string;
  /** A consistent snapshot of every ENI attached to this node. */
  list(): Promise<Eni[]>;
  /**
   * Picks an available ENI (attaching a new one if the provider can) and assigns
   * it to `owner`. If `owner` already holds one, returns it. Never hands one ENI
   * to two owners, whatever runs concurrently. Throws {@linkcode ProviderError}
   * with reason `no_eni_available` or `requested_ip_unavailable` when it cannot.
   */
  allocateNextENI(owner: Owner, request: AllocationRequest): Promise<Eni>;
  /** Frees what `owner` holds; succeeds when it holds nothing. */
  deallocateENI(owner: Owner): Promise<void>;
  /** Pool counts for STATUS and `enim status`. */
  status(): Promise<ProviderStatus>;
  /**
   * Makes the device of an attached ENI reappear on the node after it vanished
   * (the manager calls it when a released device is found nowhere). Optional: the
   * mock re-plugs its simulated device; a cloud provider may detach and re-attach.
   */
  repairDevice?(eniId: string): Promise<void>;
  /** Starts background work (warm pool upkeep). Optional. */
  start?(): Promise<void>;
  /** Stops background work and releases resources. */
  close(): Promise<void>;
}

/** A provider's factory module (`providers/<name>/mod.ts`). */
export interface ProviderModule<C = unknown> {
  /** The provider's own config schema (the `provider.<name>` object of the agent config). */
  configSchema: z.ZodType<C>;
  create(config: C, ctx: ProviderContext): Promise<Provider>;
}

/** Whether an IP lies in `subnet` (CIDR) and, when given, between rangeStart and rangeEnd. */
export function ipInRange(ip: string, range: IpRange): boolean {
  try {
    const addr = ipaddr.parse(ip);
    const [net, len] = ipaddr.parseCIDR(range.subnet);
    if (addr.kind() !== net.kind() || !addr.match(net, len)) return false;
    const key = ipKey(ip);
    if (range.rangeStart && key < ipKey(range.rangeStart)) return false;
    if (range.rangeEnd && key > ipKey(range.rangeEnd)) return false;
    return true;
  } catch {
    return false;
  }
}

/** Whether an ENI satisfies an allocation request (requested IPs and ranges). */
export function eniMatches(eni: Eni, request: AllocationRequest): boolean {
  const addrs = [eni.ipv4?.address, eni.ipv6?.address].filter((a): a is string => !!a);
  if (request.ips.length > 0) {
    const want = new Set(request.ips.map(normalizeIp));
    if (!addrs.some((a) => want.has(normalizeIp(a)))) return false;
  }
  for (const set of request.ranges) {
    if (!addrs.some((a) => set.some((r) => ipInRange(a, r)))) return false;
  }
  return true;
}

/** The canonical text form of an IP (IPv6 compressed, lower case); the input when it is no IP. */
export function normalizeIp(ip: string): string {
  try {
    return ipaddr.parse(ip).toString();
  } catch {
    return ip;
  }
}

/** A sortable key for an address of one family (fixed-width hex of its bytes). */
function ipKey(ip: string): string {
  return ipaddr.parse(ip).toByteArray().map((b) => b.toString(16).padStart(2, "0")).join("");
}
