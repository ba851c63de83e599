/**
 * The host link's datapath, as `ip` commands and nftables rulesets (pure: nothing
 * here runs anything). The host link is a veth pair beside the pod's ENI: its pod
 * end (`host0` by default) carries what lives only on the node (Services at
 * ClusterIPs, the node's own addresses, host-stack CIDRs such as NodeLocal DNS),
 * its node end (`enimh<hash>`) is in the node's namespace. Everything else keeps
 * leaving through the ENI.
 *
 * What each side gets (see README, "In a Kubernetes cluster", for the why):
 *
 * - node: the node end, up, in link group {@linkcode HOST_LINK_GROUP}, with the
 *   MAC {@linkcode HostLinkSpec.nodeMac}; a host route to each of the pod's ENI
 *   addresses over it with the node's primary address of that family as the
 *   preferred source, and a permanent neighbour entry for each (no ARP/NDP);
 *   one nftables table for all pods ({@linkcode nodeTableRuleset}): what came in
 *   from a node end and leaves through anything else is masqueraded, so the VPC
 *   only ever sees the node's own address on the node's NIC;
 * - pod: the pod end, up; routes via the link-local next hop
 *   {@linkcode LINK_GATEWAY}, which is a permanent neighbour at the node end's MAC;
 *   connection marks ({@linkcode podRuleset}): a connection that arrived through
 *   the pod end is answered through it (fwmark {@linkcode HOST_LINK_MARK} → table
 *   {@linkcode HOST_LINK_TABLE} → default via the node end), and the reverse-path
 *   check of such packets uses that table (`src_valid_mark`).
 *
 * @module
 */
import { normalizeIp } from "../lib/ip.ts";

/** The link group of every node end: what the node's nftables table matches. ("enim" in ASCII.) */
export const HOST_LINK_GROUP = 0x656e696d;
/**
 * The packet and connection mark bit enim uses, on the node (traffic from a node end,
 * to masquerade) and in the pod (connections that arrived through the pod end). Clear
 * of kube-proxy's 0x4000 and 0x8000, of the `portmap` plugin's 0x2000 (its default
 * `markMasqBit` 13: its masquerade rule would take enim's marked packets too, which the
 * tests caught), of the AWS VPC CNI's 0x80, Cilium's 0x0f00 and Calico's upper 16 bits.
 */
export const HOST_LINK_MARK = 0x1000;
/** The pod's routing table for answers through the pod end. */
export const HOST_LINK_TABLE = 2000;
/** The priority of the pod's rule that sends marked packets to {@linkcode HOST_LINK_TABLE}. */
export const HOST_LINK_RULE_PREF = 1000;
/** The next hop of the pod's routes through its pod end, per family (a static neighbour). */
export const LINK_GATEWAY = { ipv4: "169.254.1.1", ipv6: "fe80::1" } as const;
/** The name of enim's nftables table, on the node and in each pod (family `inet`). */
export const NFT_TABLE = "enim";

/** A route of the pod through its pod end. */
export interface LinkRoute {
  /** Destination prefix, canonical CIDR. */
  dst: string;
}

/** Everything the device layer creates for one host link. */
export interface HostLinkSpec {
  /** The node end's name (unique per attachment, at most 15 bytes). */
  nodeIfName: string;
  /** The pod end's name. */
  podIfName: string;
  /** The node end's MAC (the pod's static neighbour for the link gateway). */
  nodeMac: string;
  /** The pod end's MAC (the node's static neighbour for the pod's addresses). */
  podMac: string;
  /** The node end's alias: whose link it is, for people and for GC. */
  alias: string;
  /** The pod's ENI addresses (no prefix), one per family it has. */
  podAddresses: { ipv4?: string; ipv6?: string };
  /** The node's address per family the node's routes to the pod prefer as source. */
  nodeSource: { ipv4?: string; ipv6?: string };
  /** The pod's routes through the pod end (service CIDRs, node addresses, host-stack CIDRs). */
  routes: LinkRoute[];
}

/** What names one host link for removal and CHECK. */
export interface HostLinkRef {
  nodeIfName: string;
  podIfName: string;
}

const isV6 = (cidr: string) => cidr.includes(":");

/**
 * The node-side `ip` commands, run in the node's namespace before the ENI is moved:
 * the veth pair (its pod end created directly in the pod's namespace `podNs`), the
 * node end up, a host route and a permanent neighbour per pod address. Routes and
 * neighbours use `replace`: an address of the pod can only be left over from a link
 * whose pod is gone.
 */
export function nodeCommands(s: HostLinkSpec, podNs: string): string[][] {
  const cmds: string[][] = [[
    "link",
    "add",
    s.nodeIfName,
    "group",
    String(HOST_LINK_GROUP),
    "address",
    s.nodeMac,
    "alias",
    s.alias,
    "type",
    "veth",
    "peer",
    "name",
    s.podIfName,
    "address",
    s.podMac,
    "netns",
    podNs,
  ], ["link", "set", "dev", s.nodeIfName, "up"]];
  return [...cmds, ...nodeRouteCommands(s)];
}

/**
 * The node's routes and permanent neighbours over a node end (the part of
 * {@linkcode nodeCommands} after the link): run again as they are, they restore what
 * the kernel dropped (a route whose source address left the node).
 */
export function nodeRouteCommands(
  s: Pick<HostLinkSpec, "nodeIfName" | "podMac" | "podAddresses" | "nodeSource">,
): string[][] {
  const cmds: string[][] = [];
  for (const fam of ["ipv4", "ipv6"] as const) {
    const addr = s.podAddresses[fam];
    if (!addr) continue;
    const dst = `${normalizeIp(addr)}/${fam === "ipv4" ? 32 : 128}`;
    const src = s.nodeSource[fam];
    cmds.push(["route", "replace", dst, "dev", s.nodeIfName, ...(src ? ["src", src] : [])]);
    cmds.push([
      "neigh",
      "replace",
      normalizeIp(addr),
      "lladdr",
      s.podMac,
      "dev",
      s.nodeIfName,
      "nud",
      "permanent",
    ]);
  }
  return cmds;
}

/**
 * The pod-side `ip` commands, run in the pod's namespace in the same batch as the
 * ENI's configuration (after its addresses, which the routes name as source): the
 * pod end up, the link gateway as a permanent neighbour, every route through the
 * link, and the answer table's default routes (they go with the pod end). The rules
 * that lead to that table are {@linkcode POD_POLICY_SCRIPT}'s: they outlive the link
 * (a DEL leaves them, inert without it), so a later ADD in the same namespace must
 * find them there.
 */
export function podCommands(s: HostLinkSpec): string[][] {
  const dev = s.podIfName;
  const cmds: string[][] = [["link", "set", "dev", dev, "up"]];
  const v4 = s.podAddresses.ipv4, v6 = s.podAddresses.ipv6;
  if (v4) {
    cmds.push(neighbour(LINK_GATEWAY.ipv4, s.nodeMac, dev));
  }
  if (v6) {
    cmds.push(neighbour(LINK_GATEWAY.ipv6, s.nodeMac, dev));
  }
  for (const r of s.routes) {
    const v6Route = isV6(r.dst);
    const src = v6Route ? v6 : v4;
    if (!src) continue;
    cmds.push(linkRoute(r.dst, v6Route, dev, src));
  }
  if (v4) cmds.push([...linkRoute("0.0.0.0/0", false, dev, v4), "table", String(HOST_LINK_TABLE)]);
  if (v6) cmds.push([...linkRoute("::/0", true, dev, v6), "table", String(HOST_LINK_TABLE)]);
  return cmds;
}

function neighbour(address: string, mac: string, dev: string): string[] {
  return ["neigh", "replace", address, "lladdr", mac, "dev", dev, "nud", "permanent"];
}

function linkRoute(dst: string, v6: boolean, dev: string, src: string): string[] {
  return v6
    ? ["route", "add", dst, "via", LINK_GATEWAY.ipv6, "dev", dev, "src", normalizeIp(src)]
    : ["route", "add", dst, "via", LINK_GATEWAY.ipv4, "dev", dev, "onlink", "src", src];
}

/** `0x1000/0x1000`: the mark and its mask as `ip rule` takes them. */
function markMask(): string {
  const m = `0x${HOST_LINK_MARK.toString(16)}`;
  return `${m}/${m}`;
}

/**
 * The routes the CNI result lists for the host link: each destination via the link
 * gateway of its family (what CHECK then finds in the pod), for the families the
 * pod has.
 */
export function resultRoutes(s: Pick<HostLinkSpec, "routes" | "podAddresses">) {
  return s.routes
    .filter((r) => isV6(r.dst) ? s.podAddresses.ipv6 : s.podAddresses.ipv4)
    .map((r) => ({ dst: r.dst, gw: isV6(r.dst) ? LINK_GATEWAY.ipv6 : LINK_GATEWAY.ipv4 }));
}

/**
 * The pod's nftables ruleset: a connection that arrives through the pod end is
 * marked (conntrack), and every packet of it the pod sends carries the mark (a
 * `route` chain: the kernel routes the packet again after the mark is set), so the
 * answer takes the pod end whatever its destination; a packet arriving through the
 * pod end carries the mark too, so the reverse-path check (with `src_valid_mark`)
 * looks its source up in the same table.
 *
 * Idempotent without deleting anything: the table and its two base chains are
 * declared (a no-op when an earlier ADD in the same namespace left them), their
 * rules flushed and added again. Deleting a table costs the kernel an RCU grace
 * period: loading this into a fresh namespace takes 6-8 ms against 13-15 ms with
 * a `delete table` first (`nsenter --net … nft -f`, measured on this machine).
 */
export function podRuleset(podIfName: string): string {
  const m = `0x${HOST_LINK_MARK.toString(16)}`;
  const t = `inet ${NFT_TABLE}`;
  return [
    `table ${t} {`,
    `\tchain prerouting {`,
    `\t\ttype filter hook prerouting priority mangle; policy accept;`,
    `\t}`,
    `\tchain output {`,
    `\t\ttype route hook output priority mangle; policy accept;`,
    `\t}`,
    `}`,
    `flush chain ${t} prerouting`,
    `flush chain ${t} output`,
    `add rule ${t} prerouting iifname "${podIfName}" ct state new ct mark set ct mark | ${m}`,
    `add rule ${t} prerouting iifname "${podIfName}" meta mark set meta mark | ${m}`,
    `add rule ${t} output ct mark & ${m} == ${m} meta mark set meta mark | ${m}`,
    "",
  ].join("\n");
}

/**
 * The node's nftables table, one for every pod: packets that came in through a node
 * end are marked before routing, and a marked packet that leaves through anything
 * but a node end is masqueraded (to the address of the interface it leaves by).
 * kube-proxy masquerades only what it marks itself; without this a pod's Service
 * traffic to a backend elsewhere would leave the node's NIC with the pod's address,
 * which the VPC's source check drops. Runs after kube-proxy's own masquerade
 * (priority srcnat + 10): what kube-proxy translated is not translated again.
 * Loading it replaces the table as a whole (idempotent).
 */
export function nodeTableRuleset(): string {
  const m = `0x${HOST_LINK_MARK.toString(16)}`;
  const g = String(HOST_LINK_GROUP);
  return [
    `table inet ${NFT_TABLE} {}`,
    `delete table inet ${NFT_TABLE}`,
    `table inet ${NFT_TABLE} {`,
    `\tchain prerouting {`,
    `\t\ttype filter hook prerouting priority mangle; policy accept;`,
    `\t\tiifgroup ${g} meta mark set meta mark | ${m}`,
    `\t}`,
    `\tchain postrouting {`,
    `\t\ttype nat hook postrouting priority srcnat + 10; policy accept;`,
    `\t\tmeta mark & ${m} == ${m} oifgroup != ${g} masquerade`,
    `\t}`,
    `}`,
    "",
  ].join("\n");
}

/** The exit code of {@linkcode POD_POLICY_SCRIPT} when a policy step failed. */
export const POD_POLICY_FAILED = 97;

/**
 * The host link's pod-side policy, run by the one process a plug starts in the pod's
 * namespace (through `nsenter --net`) before the rest of its arguments, the plug's
 * `ip -batch -` (fed once the device is in the pod): the rule per family that sends
 * marked packets to the answer table (added unless a rule of that priority is there
 * already: one from an earlier ADD in the same namespace), `src_valid_mark` (IPv4) and
 * the pod's ruleset. The rules wait for the node's rtnl lock, which the device's move
 * holds for most of its time, so they run in the background while the ruleset loads
 * (nftables does not take that lock) and that `ip` starts; the script waits for them
 * before it exits. A failed policy step exits {@linkcode POD_POLICY_FAILED} (without
 * starting that `ip` when the sysctl or the ruleset failed).
 * Arguments: `$1` the pod end's name when the pod has IPv4 (else empty: no IPv4), `$2` the
 * mark/mask, `$3` the table, `$4` the rule's priority, `$5` the ruleset file, `$6`
 * the `ip` binary, `$7` the `nft` binary, `$8` `6` when the pod has IPv6 (else empty),
 * then the program to run and its arguments (none: the policy alone).
 * Nothing of the caller's is interpolated into the script text.
 */
export const POD_POLICY_SCRIPT = [
  'ip="$6" mark="$2" table="$3" pref="$4" v4="$1" v6="$8"',
  // rule FAMILY: added, or (an earlier ADD's) found there already.
  'rule() { "$ip" "-$1" rule add fwmark "$mark" lookup "$table" pref "$pref" 2>/dev/null ||' +
  ' [ -n "$("$ip" "-$1" rule list pref "$pref")" ] ||' +
  ' { echo "Cannot add the IPv$1 rule fwmark $mark lookup $table pref $pref" >&2; return 1; }; }',
  '{ { [ -z "$v4" ] || rule 4; } && { [ -z "$v6" ] || rule 6; }; } < /dev/null &',
  "rules=$!",
  // `all`: the pod end need not exist yet (this runs beside the move). Only packets that
  // arrived through it carry a mark, so the ENI's own reverse-path check is unchanged.
  '{ [ -z "$v4" ] || printf 1 > /proc/sys/net/ipv4/conf/all/src_valid_mark; } && "$7" -f "$5" ||',
  `  { wait "$rules"; exit ${POD_POLICY_FAILED}; }`,
  "shift 8",
  "rc=0",
  '[ "$#" -eq 0 ] || { "$@"; rc=$?; }',
  `wait "$rules" || exit ${POD_POLICY_FAILED}`,
  'exit "$rc"',
].join("\n");

/** The arguments of {@linkcode POD_POLICY_SCRIPT} (after `$0`). */
export function podPolicyArgs(
  s: Pick<HostLinkSpec, "podIfName" | "podAddresses">,
  rulesetFile: string,
  bins: { ip: string; nft: string },
): string[] {
  return [
    s.podAddresses.ipv4 ? s.podIfName : "",
    markMask(),
    String(HOST_LINK_TABLE),
    String(HOST_LINK_RULE_PREF),
    rulesetFile,
    bins.ip,
    bins.nft,
    s.podAddresses.ipv6 ? "6" : "",
  ];
}

/** Whether a link (as `ip -j link` shows it) is a host link's node end: by its group. */
export function isNodeEnd(l: { group?: string | number }): boolean {
  return String(l.group) === String(HOST_LINK_GROUP);
}
