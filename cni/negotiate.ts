/**
 * CNI spec versions: negotiation, the VERSION answer, the canonical (1.1.0)
 * result shape, its conversion to each supported version, and `prevResult`.
 *
 * Unknown patch versions: the CNI spec follows semver and its result format
 * has only ever changed with a minor or major release, so a version the plugin
 * has never seen but whose major.minor it knows (the seed's `"1.0.10"`) is
 * served with that minor's format (1.0.x → the 1.0.0 format), and every output
 * echoes the requested string unchanged. A major.minor enim does not know
 * (`"1.2.0"`, `"2.0.0"`, `"0.2.0"`) is refused with code 1.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { CNI_CODES, CniError, formatZodIssues } from "./errors.ts";
import {
  incompatibleVersion,
  LATEST_VERSION,
  SUPPORTED_VERSIONS,
  type SupportedVersion,
  versionAtLeast,
  versionFormat,
  versionResult,
} from "./spec.ts";

export { LATEST_VERSION, SUPPORTED_VERSIONS, type SupportedVersion, versionAtLeast, versionResult };

/** A negotiated version: what the runtime asked for and the format enim answers in. */
export interface NegotiatedVersion {
  /** The runtime's string, echoed in every output. */
  requested: string;
  /** The known version whose format is used. */
  format: SupportedVersion;
}

/**
 * Picks the result format for a requested version (see the module doc for patch
 * versions; the rule is `versionFormat` in spec.ts, which the plugin process applies too).
 *
 * @throws {CniError} code 1 naming the supported versions
 */
export function negotiateVersion(requested: string): NegotiatedVersion {
  const format = versionFormat(requested);
  if (format) return { requested, format };
  throw new CniError(CNI_CODES.INCOMPATIBLE_VERSION, incompatibleVersion(requested));
}

const Uint = z.number().check(z.int(), z.minimum(0));

/** An interface in a result (1.1.0 fields; older versions drop `mtu`, `socketPath`, `pciID`). */
export const ResultInterfaceSchema = z.looseObject({
  name: z.optional(z.string()),
  mac: z.optional(z.string()),
  mtu: z.optional(Uint),
  sandbox: z.optional(z.string()),
  socketPath: z.optional(z.string()),
  pciID: z.optional(z.string()),
});
/** An IP config in a result; `version` only exists before 1.0.0. */
export const ResultIpConfigSchema = z.looseObject({
  address: z.string().check(z.minLength(1)),
  gateway: z.optional(z.string()),
  interface: z.optional(Uint),
  version: z.optional(z.enum(["4", "6"])),
});
/** A route in a result (1.1.0 adds `mtu`, `advmss`, `priority`, `table`, `scope`). */
export const ResultRouteSchema = z.looseObject({
  dst: z.string().check(z.minLength(1)),
  gw: z.optional(z.string()),
  mtu: z.optional(Uint),
  advmss: z.optional(Uint),
  priority: z.optional(Uint),
  table: z.optional(Uint),
  scope: z.optional(Uint),
});
/** DNS settings in a result. */
export const ResultDnsSchema = z.looseObject({
  nameservers: z.optional(z.array(z.string())),
  domain: z.optional(z.string()),
  search: z.optional(z.array(z.string())),
  options: z.optional(z.array(z.string())),
});
/** A CNI success result of any supported version, parsed loosely (unknown fields kept). */
export const CniResultSchema = z.looseObject({
  cniVersion: z.optional(z.string()),
  interfaces: z.optional(z.array(ResultInterfaceSchema)),
  ips: z.optional(z.array(ResultIpConfigSchema)),
  routes: z.optional(z.array(ResultRouteSchema)),
  dns: z.optional(ResultDnsSchema),
});

/** The canonical (1.1.0-shaped) result enim builds before converting it. */
export interface CniResult {
  interfaces: z.infer<typeof ResultInterfaceSchema>[];
  ips: z.infer<typeof ResultIpConfigSchema>[];
  routes: z.infer<typeof ResultRouteSchema>[];
  dns: z.infer<typeof ResultDnsSchema>;
}

/** "4" or "6" for a CIDR or plain address. */
export function ipFamily(address: string): "4" | "6" {
  return address.includes(":") ? "6" : "4";
}

/**
 * Parses `prevResult` of any supported version into the canonical shape
 * (`ips[].version` dropped).
 *
 * @throws {CniError} code 7 naming the bad fields
 */
export function parsePrevResult(value: unknown): CniResult {
  const parsed = CniResultSchema.safeParse(value);
  if (!parsed.success) {
    throw new CniError(
      CNI_CODES.INVALID_CONFIG,
      `Invalid prevResult: ${formatZodIssues(parsed.error, ["prevResult"])}`,
    );
  }
  const r = parsed.data;
  return {
    interfaces: r.interfaces ?? [],
    ips: (r.ips ?? []).map(({ version: _v, ...ip }) => ip),
    routes: r.routes ?? [],
    dns: r.dns ?? {},
  };
}

/** Removes the keys whose value is `undefined`, so JSON output stays minimal. */
function compact<T extends Record<string, unknown>>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

/**
 * Converts a canonical result to the negotiated version's format.
 *
 * - 1.1.0: as built.
 * - 1.0.0: interfaces lose `mtu`, `socketPath`, `pciID`; routes keep `dst` and `gw`.
 * - 0.4.0, 0.3.x: as 1.0.0, plus `ips[].version` ("4"/"6").
 *
 * `ips[].interface` means the same in every version.
 */
export function convertResult(
  result: CniResult,
  version: NegotiatedVersion,
): Record<string, unknown> {
  const v11 = versionAtLeast(version.format, "1.1.0");
  const v10 = versionAtLeast(version.format, "1.0.0");
  const interfaces = result.interfaces.map((i) => {
    if (v11) return compact({ ...i });
    const { mtu: _m, socketPath: _s, pciID: _p, ...rest } = i;
    return compact(rest);
  });
  const ips = result.ips.map((ip) => {
    const { version: _v, ...rest } = ip;
    return v10 ? compact(rest) : compact({ ...rest, version: ipFamily(ip.address) });
  });
  const routes = result.routes.map((r) => {
    if (v11) return compact({ ...r });
    const { mtu: _m, advmss: _a, priority: _p, table: _t, scope: _s, ...rest } = r;
    return compact(rest);
  });
  return {
    cniVersion: version.requested,
    ...(interfaces.length > 0 ? { interfaces } : {}),
    ips,
    routes,
    dns: result.dns,
  };
}
