/**
 * The host link in the network config (issue 27): the fields of enim's section,
 * their checks, and the ADD request's `hostLink`.
 *
 * - `serviceCidrs`: the cluster's Service CIDRs, IPv4 and IPv6 (kube-apiserver's
 *   `--service-cluster-ip-range`);
 * - `hostStackCidrs`: other prefixes the node serves (NodeLocal DNS's
 *   169.254.20.10/32, …);
 * - `hostLink`: `{"enabled", "podIfName", "nodeIfPrefix"}`. `enabled` defaults to on
 *   for a Kubernetes pod's primary interface (the runtime passes `K8S_POD_NAMESPACE`
 *   in CNI_ARGS, as every CRI runtime does for kubelet, and the attachment has the
 *   pod's default routes) and off otherwise: podman and cnitool (no kube-proxy, no
 *   Services), a second enim interface with `"defaultRoutes": false` (the first one's
 *   link serves the pod). `false` gives exactly enim's behaviour without it.
 *   The pod end is `host0` unless `podIfName` says otherwise; node ends are
 *   `nodeIfPrefix` (default `enimh`) and a hash of the attachment, 15 bytes.
 *
 * Every value is checked before anything is allocated (code 7 naming the field): a
 * CIDR of the wrong form, one listed twice (in either list or as a `routes` dst), a
 * pod end named like the ENI's interface, `hostLink.enabled` in IPAM mode. The
 * agent checks the CIDRs against the subnets (`manager/host_link.ts`).
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { canonicalCidr, parseCidr } from "../lib/ip.ts";
import { NetworkCidrSchema } from "../providers/schema.ts";
import {
  type HostLinkRequest,
  IfNameSchema,
  MarkConfigSchema,
  type Mode,
  NodeIfPrefixSchema,
} from "../api/schema.ts";
import { CNI_CODES, CniError } from "./errors.ts";
import { DEFAULT_MARKS } from "../netns/host_link.ts";

/** The default name of the host link's pod end. */
export const DEFAULT_POD_IF_NAME = "host0";
/** The default prefix of node-end names (the rest is a hash of the attachment key). */
export const DEFAULT_NODE_IF_PREFIX = "enimh";

/** The host link's fields of enim's section (spread into `EnimSectionSchema`). */
export const hostLinkFields = {
  /** The cluster's Service CIDRs (IPv4 and IPv6), routed through the host link. */
  serviceCidrs: z._default(z.array(NetworkCidrSchema), []),
  /** Other prefixes the node serves (NodeLocal DNS, …), routed through the host link. */
  hostStackCidrs: z._default(z.array(NetworkCidrSchema), []),
  /** The host link's switch and the names of its ends. */
  hostLink: z.optional(z.strictObject({
    enabled: z.optional(z.boolean()),
    podIfName: z._default(IfNameSchema, DEFAULT_POD_IF_NAME),
    nodeIfPrefix: z._default(NodeIfPrefixSchema, DEFAULT_NODE_IF_PREFIX),
    marks: z.optional(z.strictObject({
      answer: z.optional(MarkConfigSchema),
      return: z.optional(MarkConfigSchema),
    })),
  })),
};

/** What {@linkcode hostLinkRequest} reads of enim's section. */
export interface HostLinkConfig {
  serviceCidrs: string[];
  hostStackCidrs: string[];
  hostLink?: {
    enabled?: boolean;
    podIfName: string;
    nodeIfPrefix: string;
    marks?: { answer?: number; return?: number };
  };
  routes: { dst: string }[];
  defaultRoutes: boolean;
}

function bad(msg: string): CniError {
  return new CniError(CNI_CODES.INVALID_CONFIG, `Invalid network config: ${msg}`);
}

/**
 * Checks the host link's CIDRs of a parsed section: no prefix listed twice across
 * `serviceCidrs`, `hostStackCidrs` and the `routes` destinations (two routes to one
 * destination collide in the pod). `where` prefixes the field names (`ipam.` in IPAM mode).
 *
 * @throws {CniError} code 7 naming the second field
 */
export function checkHostLinkCidrs(c: HostLinkConfig, where = ""): void {
  const seen = new Map<string, string>();
  const entries = [
    ...c.routes.map((r, i) => [`${where}routes[${i}].dst`, r.dst] as const),
    ...c.serviceCidrs.map((v, i) => [`${where}serviceCidrs[${i}]`, v] as const),
    ...c.hostStackCidrs.map((v, i) => [`${where}hostStackCidrs[${i}]`, v] as const),
  ];
  for (const [field, text] of entries) {
    const p = parseCidr(text);
    if (!p) continue;
    const key = canonicalCidr(p);
    const first = seen.get(key);
    if (first) throw bad(`${field}: ${text} is listed already as ${first}`);
    seen.set(key, field);
  }
}

/**
 * The ADD request's host link, or undefined when the pod gets none: on by default
 * for a Kubernetes pod's primary interface (`defaultRoutes` on) in interface mode,
 * off otherwise; `hostLink.enabled` decides when set.
 *
 * @throws {CniError} code 7: `hostLink.enabled` in IPAM mode, a pod end named
 *   like `CNI_IFNAME`
 */
export function hostLinkRequest(
  c: HostLinkConfig,
  mode: Mode,
  args: PodArgs,
  ifName: string,
): HostLinkRequest | undefined {
  const where = mode === "ipam" ? "ipam." : "";
  if (mode === "ipam") {
    if (c.hostLink?.enabled === true) {
      throw bad(
        `${where}hostLink.enabled: the host link needs interface mode (in IPAM mode the calling plugin owns the pod's interfaces)`,
      );
    }
    return undefined;
  }
  const enabled = c.hostLink?.enabled ?? (isKubernetesPod(args) && c.defaultRoutes);
  if (!enabled) return undefined;
  const podIfName = c.hostLink?.podIfName ?? DEFAULT_POD_IF_NAME;
  if (podIfName === ifName) {
    throw bad(
      `hostLink.podIfName: "${podIfName}" is the ENI's interface (CNI_IFNAME); name the host link's pod end otherwise`,
    );
  }
  const marks = c.hostLink?.marks;
  if (marks) {
    const set = Object.entries({
      answer: DEFAULT_MARKS.answer,
      return: DEFAULT_MARKS.return,
      ...marks,
    })
      .filter(([, v]) => v !== undefined);
    for (const [i, [k, v]] of set.entries()) {
      const twin = set.slice(0, i).find(([, w]) => w === v);
      if (twin) {
        const [a, b] = (k in marks ? [k, twin[0]] : [twin[0], k]) as [string, string];
        throw bad(
          `hostLink.marks.${a}: 0x${
            v!.toString(16)
          } is the mark of hostLink.marks.${b} already; each mark needs a bit of its own`,
        );
      }
    }
  }
  return {
    podIfName,
    nodeIfPrefix: c.hostLink?.nodeIfPrefix ?? DEFAULT_NODE_IF_PREFIX,
    serviceCidrs: c.serviceCidrs,
    hostStackCidrs: c.hostStackCidrs,
    ...(marks ? { marks } : {}),
  };
}

/** What the host link reads of CNI_ARGS (`cni/args.ts` parses them). */
export interface PodArgs {
  K8S_POD_NAMESPACE?: string;
}

/** Whether the runtime says the pod is a Kubernetes pod (CRI runtimes pass its namespace). */
export function isKubernetesPod(args: PodArgs): boolean {
  return (args.K8S_POD_NAMESPACE ?? "") !== "";
}
