/**
 * `CNI_ARGS` (`K=V;K=V`), the requested IPs, and the owner (pod) of an attachment.
 *
 * Parsing follows the reference plugins (`pkg/types` LoadArgs): every pair has
 * exactly one `=`; known keys are `K8S_POD_NAMESPACE`, `K8S_POD_NAME`,
 * `K8S_POD_INFRA_CONTAINER_ID`, `K8S_POD_UID`, `IP`, `IgnoreUnknown` and enim's
 * `ENIM_PROFILE`, `ENIM_SECURITY_GROUP_IDS`, `ENIM_STICKY` (see selection.ts); any
 * other key is refused unless `IgnoreUnknown` is `1` or `true` (any case).
 * Empty segments (`A=1;;B=2`, a trailing `;`) are skipped. A bad `CNI_ARGS`
 * is a bad environment variable, so it gets code 4 and the message names
 * `CNI_ARGS` and the key (the reference plugins return a plain error, which
 * their skel turns into the unspecified 999; the spec's 4 fits better).
 *
 * Requested IPs, first non-empty source wins (CONVENTIONS.md: a plugin that
 * understands `args` must ignore the equivalent CNI_ARGS field):
 * `runtimeConfig.ips` (capability) → `args.cni.ips` → `IP=` (comma-separated).
 * Prefix lengths are accepted and dropped: the ENI's subnet decides them.
 *
 * @module
 */
import { type Pod, PodSchema } from "../api/schema.ts";
import { CNI_CODES, CniError } from "./errors.ts";
import { listOf, quote } from "../lib/clip.ts";
import { isIpMaybePrefix, type NetworkConfig } from "./config.ts";
import { KNOWN_ARGS, type KnownArg, splitCniArgs } from "./spec.ts";

export { KNOWN_ARGS, type KnownArg };

/** Parsed CNI_ARGS: the known keys only. */
export type CniArgs = Partial<Record<KnownArg, string>>;

/** The namespace used when the runtime passes no `K8S_POD_NAMESPACE` (podman, cnitool). */
export const FALLBACK_NAMESPACE = "default";

function bad(msg: string): CniError {
  return new CniError(CNI_CODES.INVALID_ENV, `Invalid CNI_ARGS: ${msg}`);
}

/**
 * Parses `CNI_ARGS` (its syntax is `cni/spec.ts`'s {@linkcode splitCniArgs}, which the
 * plugin process applies too).
 *
 * @throws {CniError} code 4 naming CNI_ARGS and the bad pair or key
 */
export function parseCniArgs(raw: string): CniArgs {
  const split = splitCniArgs(raw);
  if (!split.ok) throw new CniError(CNI_CODES.INVALID_ENV, split.msg);
  const out: CniArgs = {};
  for (const [k, v] of split.pairs) out[k] = v;
  return out;
}

/** Strips a prefix length: `10.0.0.5/24` → `10.0.0.5`. */
function stripPrefix(ip: string): string {
  return ip.split("/")[0];
}

/** Where the requested IPs came from. */
export type IpSource = "runtimeConfig.ips" | "args.cni.ips" | "CNI_ARGS IP" | "none";

/**
 * The IPs an ADD asks for (see the module doc for precedence).
 *
 * @throws {CniError} code 4 for a bad `IP=` (config-sourced IPs are validated by the config schema)
 */
export function requestedIps(
  config: Pick<NetworkConfig, "args" | "runtimeConfig">,
  args: CniArgs,
): { ips: string[]; source: IpSource } {
  const capability = config.runtimeConfig?.ips;
  if (capability && capability.length > 0) {
    return { ips: capability.map(stripPrefix), source: "runtimeConfig.ips" };
  }
  const conventional = config.args?.cni?.ips;
  if (conventional && conventional.length > 0) {
    return { ips: conventional.map(stripPrefix), source: "args.cni.ips" };
  }
  if (args.IP !== undefined && args.IP !== "") {
    const list = args.IP.split(",").map((s) => s.trim()).filter((s) => s !== "");
    const invalid = list.filter((s) => !isIpMaybePrefix(s));
    if (invalid.length > 0) {
      throw bad(
        `IP is not an IP address (optionally with a prefix length): ${
          listOf(invalid.map((s) => quote(s, 100)))
        }`,
      );
    }
    return { ips: list.map(stripPrefix), source: "CNI_ARGS IP" };
  }
  return { ips: [], source: "none" };
}

/** Makes a pod name from a container id when the runtime passes no K8S_POD_NAME. */
function nameFromContainerId(containerId: string): string {
  const cut = containerId.slice(0, 253).replace(/[^A-Za-z0-9]+$/, "");
  return cut === "" ? "unknown" : cut;
}

/**
 * The owner (pod) of an attachment: from `K8S_POD_NAMESPACE`/`K8S_POD_NAME`/
 * `K8S_POD_UID`, falling back to namespace "default" and the container id as
 * name when the runtime passes no Kubernetes keys.
 *
 * @throws {CniError} code 4 naming the CNI_ARGS key that is not a valid Kubernetes name
 */
export function podOf(args: CniArgs, containerId: string): Pod {
  const candidate = {
    namespace: args.K8S_POD_NAMESPACE || FALLBACK_NAMESPACE,
    name: args.K8S_POD_NAME || nameFromContainerId(containerId),
    ...(args.K8S_POD_UID ? { uid: args.K8S_POD_UID } : {}),
  };
  const parsed = PodSchema.safeParse(candidate);
  if (!parsed.success) {
    const keyOf: Record<string, string> = {
      namespace: "K8S_POD_NAMESPACE",
      name: "K8S_POD_NAME",
      uid: "K8S_POD_UID",
    };
    throw bad(
      parsed.error.issues.map((i) => {
        const field = String(i.path[0]);
        const value = (candidate as Record<string, string>)[field] ?? "";
        return `${keyOf[field] ?? field}: ${i.message}; got ${quote(value, 100)}`;
      }).join("; "),
    );
  }
  return parsed.data;
}
