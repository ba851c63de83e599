/**
 * CHECK as a pure function: what the attachment's record, the `prevResult` and
 * the live pod say, compared (SPEC.md, "CHECK"; CONVENTIONS.md).
 *
 * The `prevResult` is the truth about the final state of the chain: a later
 * plugin may have changed what it owns (the MAC, through `tuning`; an address
 * or a route it added, or one of enim's it removed and left out of the result),
 * and CHECK accepts all of that. What CHECK reports:
 *
 * - interface mode: the namespace is not the one the ENI was added to; the
 *   interface is missing; it is not the ENI's device (neither the ENI's MAC nor
 *   the alias enim gave it); its MAC is not the one the prevResult says; an
 *   address or a route the prevResult lists is missing from the pod; the
 *   bandwidth shaping the ADD installed is gone or changed (`netns/bandwidth.ts`,
 *   `shapingProblems`: the tbf of each direction, the ingress redirect to the ifb);
 *   the host link the ADD made lacks an end, or the node a route over it to an
 *   ENI address;
 * - IPAM mode (the calling plugin checks the interface itself): an address the
 *   prevResult attributes to this IPAM is not one of the ENI's; the ENI's device
 *   is found neither on the node nor in the pod.
 *
 * Each problem is one sentence naming the value; the manager reports the first.
 *
 * @module
 */
import { normalizeIp } from "../providers/contract.ts";
import type { HostLinkState, Link, NetnsIdentity, PinnedNetns, RouteSpec } from "../netns/types.ts";
import { AddResponseSchema, ApiError, type Bandwidth, type Mode } from "../api/schema.ts";
import { type InstalledShaping, type LiveShaping, shapingProblems } from "../netns/bandwidth.ts";
import { keyOf } from "../providers/schema.ts";
import { hostLinkOf } from "./state.ts";
import { type PodRule, podRulesOf, podRuleText } from "../netns/host_link.ts";
import type { CheckInput } from "./types.ts";
import { type ManagerContext, message } from "./context.ts";

/** What the ADD recorded. */
export interface CheckRecord {
  mode: Mode;
  /** The ENI's own MAC. */
  mac: string;
  /** The device's node name (interface mode: the alias enim set on it in the pod). */
  nodeName: string | null;
  /** The ENI's addresses, CIDR form. */
  addresses: string[];
  /** The namespace's identity at ADD, when it was a namespace file. */
  netns: NetnsIdentity | null;
  /** The host link the ADD made, and the node's routes over it (the ENI's addresses). */
  hostLink?: {
    nodeIfName: string;
    podIfName: string;
    nodeRoutes: string[];
    /** The rules the pod's policy gives it; empty for a link of the legacy layout. */
    podRules: PodRule[];
  } | null;
}

/** What the prevResult says of this attachment. */
export interface CheckExpected {
  /** The MAC of the attachment's interface (interface mode). */
  mac?: string;
  /** The addresses of the attachment's interface (interface mode) or of this IPAM (IPAM mode). */
  addresses: string[];
  /** Every route of the result. */
  routes: RouteSpec[];
}

/** What the system shows (interface mode). */
export interface CheckLive {
  /** The namespace's identity now (null: gone or not a namespace). */
  netns: NetnsIdentity | null;
  /** The interface named CNI_IFNAME in the pod. */
  link: Link | null;
  /** Its addresses, CIDR form. */
  addresses: string[];
  /** The pod's routes (main table). */
  routes: RouteSpec[];
  /** The host link's two ends and the node's routes over it, when the ADD made one. */
  hostLink?: HostLinkState;
}

/** The canonical form of a CIDR (`fd00:0::5/64` → `fd00::5/64`). */
export function cidrKey(c: string): string {
  const [a, l] = c.split("/");
  return l === undefined ? normalizeIp(a) : `${normalizeIp(a)}/${l}`;
}

/** A route's comparable key: "default4"/"default6" for the defaults, `via` the gateway. */
export function routeKey(r: RouteSpec): string {
  const v6 = r.dst.includes(":");
  const dst = r.dst === "0.0.0.0/0" || r.dst === "::/0" || r.dst === "default"
    ? `default${v6 || r.gw?.includes(":") ? "6" : "4"}`
    : cidrKey(r.dst);
  return `${dst}${r.gw ? ` via ${normalizeIp(r.gw)}` : ""}`;
}

const lower = (s: string | undefined) => s?.toLowerCase();

/**
 * The differences between what the prevResult says and the system (interface
 * mode), or between the prevResult and the ENI (IPAM mode); empty when CHECK
 * passes. `where` names the interface and namespace in the messages.
 */
export function checkProblems(
  record: CheckRecord,
  expected: CheckExpected,
  live: CheckLive | null,
  where: { ifName: string; netns: string },
): string[] {
  const problems: string[] = [];
  if (record.mode === "ipam") {
    const own = new Set(record.addresses.map(cidrKey));
    for (const a of expected.addresses) {
      if (!own.has(cidrKey(a))) problems.push(`Address ${a} of the prevResult is not the ENI's`);
    }
    return problems;
  }
  const name = `Interface "${where.ifName}" in "${where.netns}"`;
  if (!live?.netns) return [`Netns "${where.netns}" does not exist`];
  if (
    record.netns && (live.netns.ino !== record.netns.ino || live.netns.dev !== record.netns.dev)
  ) {
    return [`Netns "${where.netns}" is not the namespace the ENI was added to`];
  }
  const link = live.link;
  if (!link) return [`${name} is missing`];
  const mac = lower(link.address);
  const ours = mac === lower(record.mac) ||
    (record.nodeName !== null && link.ifalias === record.nodeName);
  if (!ours) {
    return [
      `${name} is not the ENI's device (MAC ${link.address ?? "none"}, alias ${
        link.ifalias ? `"${link.ifalias}"` : "none"
      }; the ENI's MAC is ${record.mac})`,
    ];
  }
  if (expected.mac !== undefined && mac !== lower(expected.mac)) {
    problems.push(`${name} has MAC ${link.address}, the prevResult says ${expected.mac}`);
  }
  const have = new Set(live.addresses.map(cidrKey));
  for (const a of expected.addresses) {
    if (!have.has(cidrKey(a))) problems.push(`${name} lacks address ${a} of the prevResult`);
  }
  problems.push(...hostLinkProblems(record, live, where));
  const routes = new Set(live.routes.map(routeKey));
  const dsts = new Set(live.routes.map((r) => routeKey({ dst: r.dst })));
  for (const r of expected.routes) {
    const found = r.gw ? routes.has(routeKey(r)) : dsts.has(routeKey({ dst: r.dst }));
    if (!found) {
      problems.push(
        `Netns "${where.netns}" lacks route ${r.dst}${
          r.gw ? ` via ${r.gw}` : ""
        } of the prevResult`,
      );
    }
  }
  return problems;
}

/** The shaping an ADD recorded, every burst as installed (a record always has them). */
function installedOf(b: Bandwidth): InstalledShaping {
  const one = (l: Bandwidth["ingress"]) => l && { rate: l.rate, burst: l.burst ?? 0 };
  const ingress = one(b.ingress), egress = one(b.egress);
  return { ...(ingress ? { ingress } : {}), ...(egress ? { egress } : {}) };
}

/** What is wrong with the attachment's host link: an end missing, a node route missing. */
function hostLinkProblems(
  record: CheckRecord,
  live: CheckLive,
  where: { ifName: string; netns: string },
): string[] {
  const want = record.hostLink;
  if (!want) return [];
  const got = live.hostLink;
  const problems: string[] = [];
  if (!got?.podEnd) {
    problems.push(`Host link "${want.podIfName}" in "${where.netns}" is missing`);
  }
  if (!got?.nodeEnd) {
    problems.push(`The node end "${want.nodeIfName}" of the host link is missing from the node`);
    return problems;
  }
  const have = new Set(got.nodeRoutes.map(cidrKey));
  for (const r of want.nodeRoutes) {
    if (!have.has(cidrKey(r))) {
      problems.push(`The node lacks route ${r} over the host link "${want.nodeIfName}"`);
    }
  }
  for (const r of want.podRules) {
    const found = (got.podRules ?? []).some((l) =>
      l.priority === r.priority && l.table === r.table &&
      (r.dst === undefined || (l.dst !== undefined && normalizeIp(l.dst) === r.dst)) &&
      (r.iif === undefined || l.iif === r.iif)
    );
    if (!found) {
      problems.push(
        `The pod lacks its host-link rule "${podRuleText(r)}" in "${where.netns}"`,
      );
    }
  }
  return problems;
}

/**
 * CHECK against the system: reads the record and the live pod, then applies
 * {@linkcode checkProblems}; throws `check_failed` naming the first problem.
 */
export async function checkAttachment(ctx: ManagerContext, req: CheckInput): Promise<void> {
  const row = ctx.state.get(req);
  const name = `"${keyOf(req)}"`;
  const fail = (msg: string): never => {
    throw new ApiError("check_failed", msg);
  };
  if (!row) return fail(`Attachment ${name} is not known to the agent`);
  if ((row.state !== "ready" && row.state !== "recycling") || !row.result || !row.mac) {
    return fail(`Attachment ${name} is ${row.state}, not ready`);
  }
  const result = AddResponseSchema.parse(JSON.parse(row.result));
  const link = hostLinkOf(row);
  const record: CheckRecord = {
    hostLink: link
      ? {
        nodeIfName: link.nodeIfName,
        podIfName: link.podIfName,
        nodeRoutes: result.ips.map((i) => {
          const a = i.address.split("/")[0];
          return `${a}/${a.includes(":") ? 128 : 32}`;
        }),
        podRules: link.table === undefined ? [] : podRulesOf(podAddressesOf(result.ips)),
      }
      : null,
    mode: row.mode,
    mac: row.mac,
    nodeName: row.nodeName,
    addresses: result.ips.map((i) => i.address),
    netns: row.netnsIno !== null && row.netnsDev !== null
      ? { dev: row.netnsDev, ino: row.netnsIno }
      : null,
  };
  let live: CheckLive | null = null;
  let shaping: LiveShaping | null = null;
  if (row.mode === "interface") {
    let pinned: PinnedNetns;
    try {
      pinned = await ctx.devices.pin(req.netns);
    } catch (err) {
      return fail(err instanceof Error ? err.message : String(err));
    }
    try {
      const pod = await ctx.devices.inspect({ netns: pinned, ifName: req.ifName }).catch((
        err,
      ) => fail(`Cannot read the pod's interface: ${message(err)}`));
      const hostLink = link
        ? await ctx.devices.inspectHostLink({ netns: pinned, hostLink: link }).catch((err) =>
          fail(`Cannot read the pod's host link: ${message(err)}`)
        )
        : undefined;
      live = {
        netns: pinned.identity,
        link: pod.link,
        addresses: pod.addresses,
        routes: pod.routes,
        ...(hostLink ? { hostLink } : {}),
      };
      if (result.bandwidth && pod.link) {
        shaping = await ctx.devices.inspectShaping({ netns: pinned, ifName: req.ifName })
          .catch((err) => fail(`Cannot read the pod's bandwidth shaping: ${message(err)}`));
      }
    } finally {
      pinned.close();
    }
  }
  const problems = checkProblems(record, req.expected, live, req);
  if (problems.length > 0) fail(problems[0]);
  if (shaping && result.bandwidth) {
    const wrong = shapingProblems(installedOf(result.bandwidth), shaping, {
      ifName: req.ifName,
      netns: req.netns,
      mac: row.mac,
    });
    if (wrong.length > 0) fail(wrong[0]);
  }
  if (row.mode === "ipam") {
    const mac = row.mac;
    const link = await ctx.devices.findByMac(mac).catch(() => null) ??
      await ctx.devices.findByMac(mac, req.netns).catch(() => null);
    if (!link) fail(`No device with MAC ${mac} (ENI "${row.eniId}") on the node or in the pod`);
  }
}

/** The pod's ENI address per family, from a result's `ips`. */
function podAddressesOf(ips: { address: string }[]): { ipv4?: string; ipv6?: string } {
  const out: { ipv4?: string; ipv6?: string } = {};
  for (const i of ips) {
    const a = i.address.split("/")[0];
    if (a.includes(":")) out.ipv6 ??= normalizeIp(a);
    else out.ipv4 ??= a;
  }
  return out;
}
