/**
 * The network config on stdin, parsed with zod (loose: unknown fields kept).
 *
 * Mode:
 * - top-level `"type": "enim"` → interface mode (enim moves the ENI into the pod);
 * - otherwise `"ipam": {"type": "enim"}` → IPAM mode (under another plugin's
 *   `type`, or with no top-level `type` at all, as in the seed's example
 *   `{"cniVersion": "1.0.10", "name": "examplenet", "ipam": {"type": "enim"}}`);
 * - neither → code 7.
 *
 * enim's own fields live in *enim's section*, the object whose `type` is
 * "enim": the top level in interface mode, `ipam` in IPAM mode. They are
 * `agentSocket`, `logFile`, `timeoutSeconds`, `mtu`, `routes`, `defaultRoutes`, and the
 * host link's `serviceCidrs`, `hostStackCidrs` and `hostLink` (`./host_link.ts`). In IPAM mode
 * the top level belongs to the other plugin (its `mtu` or `routes` mean
 * something else), so it is not read. The runtime's fields (`cniVersion`,
 * `name`, `args`, `runtimeConfig`, `prevResult`, `cni.dev/valid-attachments`)
 * are always top-level.
 *
 * In interface mode an `ipam` section of another type is refused with code 2:
 * enim takes the addresses from the ENI and delegates to no IPAM plugin.
 *
 * @module
 */
import { DEFAULT_SOCKET } from "../api/wire.ts";
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { IpRangeSchema, NetworkCidrSchema, routeFamilyCheck } from "../providers/schema.ts";
import { ruledString } from "../api/schema.ts";
import { isCidr, isIp, isIpMaybePrefix } from "../lib/ip.ts";

export { isCidr, isIp, isIpMaybePrefix };
import { CNI_CODES, CniError, formatZodIssues } from "./errors.ts";
import {
  DEFAULT_LOG_FILE,
  DEFAULT_TIMEOUT_SECONDS,
  foreignIpamMessage,
  NETWORK_NAME,
  notEnimMessage,
} from "./spec.ts";
import { checkHostLinkCidrs, hostLinkFields } from "./host_link.ts";

export { DEFAULT_LOG_FILE, DEFAULT_TIMEOUT_SECONDS };

/** An IP address without prefix. */
export const IpAddressSchema = z.string().check(
  z.refine(isIp, "Expected an IPv4 or IPv6 address"),
);

/**
 * A route in enim's section: `dst` a network prefix (host bits clear), `gw` (default:
 * the ENI's gateway of that family) an address of `dst`'s family. Checked here, so a
 * bad route is a 7 before anything is allocated.
 */
export const ConfigRouteSchema = z.looseObject({
  dst: NetworkCidrSchema,
  gw: z.optional(IpAddressSchema),
}).check(routeFamilyCheck());

/** enim's own section (top level in interface mode, `ipam` in IPAM mode). */
export const EnimSectionSchema = z.looseObject({
  type: z.literal("enim"),
  agentSocket: z._default(
    z.string().check(z.startsWith("/", "Expected an absolute path"), z.maxLength(107)),
    DEFAULT_SOCKET,
  ),
  logFile: z._default(
    z.string().check(z.startsWith("/", "Expected an absolute path"), z.maxLength(4096)),
    DEFAULT_LOG_FILE,
  ),
  timeoutSeconds: z._default(
    z.number().check(z.positive(), z.maximum(600)),
    DEFAULT_TIMEOUT_SECONDS,
  ),
  mtu: z.optional(z.number().check(z.int(), z.minimum(68), z.maximum(65535))),
  routes: z._default(z.array(ConfigRouteSchema), []),
  /**
   * Whether this attachment installs a default route per family via its ENI's
   * gateway (a second enim interface in the same pod sets it false, and routes only
   * what `routes` says).
   */
  defaultRoutes: z._default(z.boolean(), true),
  // The host link (`serviceCidrs`, `hostStackCidrs`, `hostLink`): cni/host_link.ts.
  ...hostLinkFields,
});
/** enim's own section. */
export type EnimSection = z.infer<typeof EnimSectionSchema>;

/** One attachment of a GC's list. */
const GcAttachmentSchema = z.looseObject({ containerID: z.string(), ifname: z.string() });

/** An `ip[/prefix]` string as in `args.cni.ips` and the `ips` capability. */
const IpMaybePrefix = z.string().check(
  z.refine(isIpMaybePrefix, "Expected an IP address, optionally with a prefix length"),
);

/** The top-level network config; loose, unknown fields kept. */
export const NetworkConfigSchema = z.looseObject({
  cniVersion: z.string().check(z.minLength(1)),
  name: ruledString(NETWORK_NAME),
  type: z.optional(z.string()),
  ipam: z.optional(z.looseObject({ type: z.optional(z.string()) })),
  args: z.optional(z.looseObject({
    cni: z.optional(z.looseObject({ ips: z.optional(z.array(IpMaybePrefix)) })),
  })),
  runtimeConfig: z.optional(z.looseObject({
    ipRanges: z.optional(z.array(z.array(IpRangeSchema))),
    ips: z.optional(z.array(IpMaybePrefix)),
    /**
     * The pod's annotations (containerd's capability; a Go nil map arrives as null). Read
     * by ADD only (cni/selection.ts), so a DEL never fails on them.
     */
    "io.kubernetes.cri.pod-annotations": z.optional(z.unknown()),
    /**
     * The `bandwidth` capability (cni/bandwidth.ts). Read by ADD only, so a DEL never
     * fails on it.
     */
    bandwidth: z.optional(z.unknown()),
  })),
  prevResult: z.optional(z.unknown()),
  /** GC's list of still-valid attachments; `null` (a Go nil slice) means none. */
  "cni.dev/valid-attachments": z.optional(z.nullable(z.array(GcAttachmentSchema))),
  /** The same list under the key some texts of spec 1.1.0 name; both are read. */
  "cni.dev/attachments": z.optional(z.nullable(z.array(GcAttachmentSchema))),
});
/** The top-level network config. */
export type NetworkConfig = z.infer<typeof NetworkConfigSchema>;

export type { Mode } from "../api/schema.ts";
import type { Mode } from "../api/schema.ts";

/** A parsed config: the whole object, the mode, and enim's section. */
export interface ParsedConfig {
  config: NetworkConfig;
  mode: Mode;
  enim: EnimSection;
}

/**
 * Decides interface vs IPAM mode from a decoded config object.
 *
 * @throws {CniError} code 7 when neither `type` nor `ipam.type` is "enim"
 */
export function detectMode(config: Record<string, unknown>): Mode {
  if (config.type === "enim") return "interface";
  const ipam = config.ipam;
  if (ipam && typeof ipam === "object" && (ipam as { type?: unknown }).type === "enim") {
    return "ipam";
  }
  throw new CniError(CNI_CODES.INVALID_CONFIG, notEnimMessage(config));
}

/**
 * Parses a decoded config object (the JSON from stdin).
 *
 * @throws {CniError} code 7 (invalid) or 2 (an `ipam` of another type in interface mode)
 */
export function parseNetworkConfig(value: unknown): ParsedConfig {
  const parsed = NetworkConfigSchema.safeParse(value);
  if (!parsed.success) {
    throw new CniError(
      CNI_CODES.INVALID_CONFIG,
      `Invalid network config: ${formatZodIssues(parsed.error)}`,
    );
  }
  const config = parsed.data;
  const mode = detectMode(config);
  if (mode === "interface" && config.ipam?.type !== undefined && config.ipam.type !== "enim") {
    throw new CniError(CNI_CODES.UNSUPPORTED_FIELD, foreignIpamMessage(config.ipam.type));
  }
  const raw = mode === "interface" ? config : config.ipam;
  const section = EnimSectionSchema.safeParse(raw);
  if (!section.success) {
    throw new CniError(
      CNI_CODES.INVALID_CONFIG,
      `Invalid network config: ${
        formatZodIssues(section.error, mode === "interface" ? [] : ["ipam"])
      }`,
    );
  }
  checkHostLinkCidrs(section.data, mode === "interface" ? "" : "ipam.");
  return { config, mode, enim: section.data };
}
