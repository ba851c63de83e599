/**
 * The host link's datapath, as `ip` commands and nftables rulesets (pure: nothing
 * here runs anything). The host link is a veth pair beside the pod's ENI: its pod
 * end (`host0` by default) carries what lives only on the node (Services at
 * ClusterIPs, the node's own addresses, host-stack CIDRs such as NodeLocal DNS),
 * its node end (`enimh<hash>`) is in the node's namespace. Everything else leaves
 * through the ENI, and so does a pod's Service traffic to anything beyond the node:
 * the node never sends a pod's packet out of its own NIC and never masquerades it
 * (docs/kubernetes.md, "The pod's identity").
 *
 * Why one file: the node's side, the pod's side and both rulesets are one datapath
 * whose marks, tables, zones and priorities must agree line for line.
 *
 * What each side gets:
 *
 * - node: the node end, up, in link group {@linkcode HOST_LINK_GROUP}, with the
 *   MAC {@linkcode HostLinkSpec.nodeMac}; a host route to each of the pod's ENI
 *   addresses over it with the node's primary address of that family as the
 *   preferred source, and a permanent neighbour entry for each (no ARP/NDP). What
 *   comes in from the node end with the pod's address as source (after kube-proxy's
 *   DNAT) is routed by three rules of the pod's own ({@linkcode NODE_RULE_PREF}): marked
 *   by kube-proxy for masquerade, the main table (kube-proxy gives it the node's
 *   address); to a host route of the main table (another pod of this node), that
 *   route; anything else back over the node end (the pod's own table
 *   {@linkcode HostLinkSpec.table}), so that it leaves by the pod's ENI. The node's
 *   nftables table ({@linkcode nodeTableRuleset}) takes from each node end only what
 *   its own pod may send (the source check: a pod never speaks as another), and keeps
 *   the node's ICMP redirects off the node ends.
 * - pod: the pod end, up; routes via the link-local next hop
 *   {@linkcode LINK_GATEWAY}, which is a permanent neighbour at the node end's MAC;
 *   connection marks and one conntrack zone ({@linkcode podRuleset}): a connection that
 *   arrived through the pod end is answered through it (the answer mark and its rule); the pod's own Service traffic that the node
 *   sends back is forwarded out of the ENI in its own conntrack zone, its source port
 *   changed only where the pod's own direct flow to the same backend holds the same
 *   5-tuple, and its replies (the return mark, whose rule precedes the local
 *   table: {@linkcode POD_RULE_PREF}) go back
 *   through the pod end to the node, whose conntrack reverses the DNAT.
 *
 * @module
 */
import { normalizeIp } from "../lib/ip.ts";

/** The link group of every node end: what the node's nftables table matches. ("enim" in ASCII.) */
export const HOST_LINK_GROUP = 0x656e696d;

/**
 * The mark bits a host link uses. `answer` and `return` live only inside the pod's own
 * namespace; `node` only on packets that came in from a node end, on the node;
 * `kubeProxyMasquerade` is kube-proxy's masquerade bit on the node
 * (`--iptables-masquerade-bit`, 14 by default), which enim reads and never sets.
 */
export interface HostLinkMarks {
  /**
   * On the node: a connection a pod opened through its node end (conntrack mark), and
   * the packets of such a connection that kube-proxy DNATed and did not masquerade
   * (packet mark): the pod's own Service traffic, sent back to leave by its ENI.
   */
  node: number;
  /** In the pod: a connection that arrived through the pod end; its answers go back through it. */
  answer: number;
  /** In the pod: the pod's Service traffic the node sent back to leave by the ENI; its replies return through the pod end. */
  return: number;
  /** On the node: kube-proxy's masquerade mark (such traffic has the node's identity). Read, never set. */
  kubeProxyMasquerade: number;
}

/** The default marks ({@linkcode HostLinkMarks}). */
export const DEFAULT_MARKS: HostLinkMarks = {
  node: 0x1000,
  answer: 0x1000,
  return: 0x2000,
  kubeProxyMasquerade: 0x4000,
};

/** The pod's routing table for what goes back through the pod end. */
export const HOST_LINK_TABLE = 2000;
/**
 * The priority of the pod's rules: 0, all of them, in this order: the return rule, the
 * answer rule, the local table (moved behind them) and the main table's host routes. A
 * rule added without a priority (`sbr` chained after enim: `from <pod address>`) gets the
 * kernel's default, the second rule's priority less one: 0 here, after all of them.
 */
export const POD_RULE_PREF = 0;
/** The priority of the answer rule before the pod's identity was kept (issue 34): removed when found. */
export const LEGACY_ANSWER_PREF = 1000;
/** The priorities of the node's two rules per pod address (host routes, the pod's table). */
export const NODE_RULE_PREF = { hosts: 1500, pod: 1501 } as const;
/** The first node-side table of a pod; each pod's table is this plus 24 bits of its key's hash. */
export const NODE_TABLE_BASE = 0x10000000;
/** The conntrack zone (original direction) of the pod's Service traffic the node sent back. */
export const RETURN_ZONE = 0x656e;
/**
 * The source ports of what a pod opens through its pod end: outside the kernel's default
 * ephemeral range (32768-60999), so a Service flow and the pod's own direct flow to the
 * same backend never share a 5-tuple.
 */
export const SERVICE_PORTS = "61000-65535";
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
  /** The node-side routing table that sends the pod's traffic back over its node end. */
  table: number;
  /** The mark bits ({@linkcode DEFAULT_MARKS} unless configured). */
  marks: HostLinkMarks;
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
  cmds.push(...nodeRouteCommands(s));
  for (const fam of ["ipv4", "ipv6"] as const) {
    const addr = s.podAddresses[fam];
    if (!addr) continue;
    // Back over the node end, via the pod's own address (its permanent neighbour).
    cmds.push([
      "route",
      "replace",
      fam === "ipv4" ? "default" : "::/0",
      "via",
      normalizeIp(addr),
      "dev",
      s.nodeIfName,
      "onlink",
      "table",
      String(s.table),
    ]);
  }
  return cmds;
}

/**
 * The sysctls that keep a node end from configuring the node from what its pod sends
 * (issue 48 point 4), each set to 0 on the node end: router advertisements (IPv6
 * `accept_ra`: a default route via the pod, a SLAAC address on the node end), ICMP
 * redirects (`accept_redirects`, both families) and source-routed packets
 * (`accept_source_route`, both families). The node's table drops advertisements and
 * redirects from node ends too ({@linkcode nodeTableRuleset}); these hold while that
 * table is not there. (IPv4's `accept_redirects` of a node end is off once the node
 * forwards, as a Kubernetes node does, whatever `all` says; both must be on otherwise.)
 */
export const NODE_END_SYSCTLS = [
  "ipv4/conf/%s/accept_redirects",
  "ipv4/conf/%s/accept_source_route",
  "ipv6/conf/%s/accept_ra",
  "ipv6/conf/%s/accept_redirects",
  "ipv6/conf/%s/accept_source_route",
] as const;

/**
 * `harden NAME`: {@linkcode NODE_END_SYSCTLS} of one node end set to 0 (the IPv6 ones only
 * where the node has IPv6); fails when the node end is not there.
 */
const HARDEN_FN = [
  "harden() {",
  '  [ -d "/proc/sys/net/ipv4/conf/$1" ] || { echo "No node end $1" >&2; return 1; }',
  ...NODE_END_SYSCTLS.map((f) => {
    const path = `/proc/sys/net/${f.replace("%s", "$1")}`;
    return f.startsWith("ipv6")
      ? `  [ ! -e "${path}" ] || printf 0 > "${path}" || return 1`
      : `  printf 0 > "${path}" || return 1`;
  }),
  "}",
].join("\n");

/**
 * The node's sysctls, written when enim's node table is loaded (before the node's
 * first host link of an agent run, and again with the table, each GC pass): the
 * reverse-path check looks a packet's source up with its mark
 * (`net.ipv4.conf.all.src_valid_mark`, as `wg-quick` sets it; the pod's Service replies
 * come in from its node end with the node mark, which leads their lookup to the pod's
 * table; without it a strict `rp_filter` drops them), and every node end there is (the
 * links of group {@linkcode HOST_LINK_GROUP}, as `$1`, the `ip` binary, lists them; one
 * an older agent made, too) gets {@linkcode NODE_END_SYSCTLS}. (Deno writes under
 * /proc/sys only with every permission: `sh` writes them.)
 */
export const NODE_SYSCTL_SCRIPT = [
  HARDEN_FN,
  "printf 1 > /proc/sys/net/ipv4/conf/all/src_valid_mark || exit 1",
  `"$1" -o link show group ${HOST_LINK_GROUP} | while read -r _ name _; do`,
  '  name="${name%:}"; name="${name%@*}"',
  // A node end removed meanwhile is no failure.
  '  [ ! -d "/proc/sys/net/ipv4/conf/$name" ] || harden "$name" || exit 1',
  "done",
].join("\n");

/**
 * {@linkcode NODE_END_SYSCTLS} of the node ends named in its arguments (a new link's, as
 * soon as the move's batch has made it: before the ADD answers and the pod runs).
 */
export const NODE_END_SYSCTL_SCRIPT = [
  HARDEN_FN,
  'for n in "$@"; do harden "$n" || exit 1; done',
].join("\n");

/**
 * The node's main-table routes and permanent neighbours over a node end (part of
 * {@linkcode nodeCommands}): run again as they are, they restore what the kernel
 * dropped (a route whose source address left the node). The pod's own table and rules
 * name no node address and stay.
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
 * The node's three rules for one of the pod's addresses (`ip rule` needs `-6` for an
 * IPv6 one, which an `ip -batch` line cannot carry: those run in an `ip -6 -batch` of
 * their own). Each matches what comes in from the node end with the pod's address as
 * source: kube-proxy's masquerade mark → the main table (it leaves by the node's NIC
 * with the node's address); a host route of the main table (another pod of this node)
 * → that route; anything else → the pod's table (back over the node end, out of its
 * ENI). `del` forms match by priority and node end alone.
 */
export function nodeRuleCommands(
  s: Pick<HostLinkSpec, "nodeIfName" | "table" | "marks">,
  addr: string,
  op: "add" | "del",
): string[][] {
  const v6 = addr.includes(":");
  const sel = op === "add"
    ? ["from", normalizeIp(addr), "iif", s.nodeIfName]
    : ["iif", s.nodeIfName];
  const m = hex(s.marks.node);
  const rule = (pref: number, what: string[]) => [
    "rule",
    op,
    "pref",
    String(pref),
    ...sel,
    ...(op === "add" ? ["fwmark", `${m}/${m}`, ...what] : []),
  ];
  return [
    rule(NODE_RULE_PREF.hosts, ["lookup", "main", "suppress_prefixlength", v6 ? "127" : "31"]),
    rule(NODE_RULE_PREF.pod, ["lookup", String(s.table)]),
  ];
}

/** A mark as `ip` and `nft` take it. */
function hex(n: number): string {
  return `0x${n.toString(16)}`;
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
 * The pod's nftables ruleset (`eniIfName`: the ENI's name in the pod).
 *
 * - A connection that arrives through the pod end from anything but the pod's own
 *   address (the node, a Service's client after DNAT, a hostPort client) is marked
 *   `answer` (conntrack); every packet of it the pod sends carries the mark (a `route`
 *   chain: the kernel routes the packet again after the mark is set), so the answer
 *   takes the pod end whatever its destination; a packet arriving through the pod end
 *   carries the mark too, so the reverse-path check (with `src_valid_mark`) looks its
 *   source up in the same table.
 * - What arrives through the pod end from the pod's own address is the pod's own
 *   Service traffic that the node routed back (after kube-proxy's DNAT) to leave by
 *   the ENI. It is tracked in conntrack zone {@linkcode RETURN_ZONE} in its original
 *   direction (the reply direction stays in the default zone), marked `return`, forwarded
 *   out of the ENI and source-NATed to the pod's own address: a no-op, unless the
 *   pod's own direct flow to the same backend holds the same 5-tuple, when the kernel
 *   picks another source port so that both flows keep their answers. Its replies
 *   (arriving at the ENI, conntrack mark `return`) get the `return` mark, which the rule
 *   before the local table sends back through the pod end to the node.
 * - Nothing else is forwarded: the pod is no router between the VPC and the node.
 *
 * Idempotent without deleting anything: the table and its base chains are declared
 * (a no-op when an earlier ADD in the same namespace left them), their rules flushed
 * and added again. Deleting a table costs the kernel an RCU grace period: loading
 * this into a fresh namespace takes 6-8 ms against 13-15 ms with a `delete table`
 * first (`nsenter --net … nft -f`, measured on this machine).
 */
export function podRuleset(
  s: Pick<HostLinkSpec, "podIfName" | "podAddresses" | "marks">,
  eniIfName: string,
): string {
  const a = hex(s.marks.answer), r = hex(s.marks.return);
  const t = `inet ${NFT_TABLE}`;
  const pod = `iifname "${s.podIfName}"`;
  const eni = `"${eniIfName}"`;
  const own = ([["ip", s.podAddresses.ipv4], ["ip6", s.podAddresses.ipv6]] as const)
    .filter((x): x is ["ip" | "ip6", string] => x[1] !== undefined);
  const zone = String(RETURN_ZONE);
  return [
    `table ${t} {`,
    `\tchain raw {`,
    `\t\ttype filter hook prerouting priority raw; policy accept;`,
    `\t}`,
    `\tchain prerouting {`,
    `\t\ttype filter hook prerouting priority mangle; policy accept;`,
    `\t}`,
    `\tchain output {`,
    `\t\ttype route hook output priority mangle; policy accept;`,
    `\t}`,
    `\tchain forward {`,
    `\t\ttype filter hook forward priority filter; policy drop;`,
    `\t}`,
    `\tchain postrouting {`,
    `\t\ttype nat hook postrouting priority srcnat; policy accept;`,
    `\t}`,
    `}`,
    ...["raw", "prerouting", "output", "forward", "postrouting"].map((c) =>
      `flush chain ${t} ${c}`
    ),
    ...own.map(([f, ip]) =>
      `add rule ${t} raw ${pod} ${f} saddr ${ip} ct original zone set ${zone}`
    ),
    `add rule ${t} prerouting ${pod} ct original zone ${zone} ct state new ct mark set ct mark | ${r}`,
    `add rule ${t} prerouting ${pod} ct original zone ${zone} meta mark set meta mark | ${r}`,
    `add rule ${t} prerouting ${pod} ct original zone != ${zone} ct state new ct mark set ct mark | ${a}`,
    `add rule ${t} prerouting ${pod} ct original zone != ${zone} meta mark set meta mark | ${a}`,
    `add rule ${t} prerouting iifname ${eni} ct mark & ${r} == ${r} meta mark set meta mark | ${r}`,
    `add rule ${t} output ct mark & ${a} == ${a} meta mark set meta mark | ${a}`,
    `add rule ${t} forward ct state established,related accept`,
    `add rule ${t} forward ${pod} oifname ${eni} ct original zone ${zone} accept`,
    ...own.map(([f, ip]) =>
      `add rule ${t} postrouting oifname ${eni} ct original zone ${zone} ${f} saddr ${ip} snat ${f} to ${ip}`
    ),
    // What the pod opens through its pod end (a Service, the node, NodeLocal DNS) leaves
    // from a source port of its own range, outside the kernel's ephemeral one: after the
    // node's DNAT it never holds the 5-tuple of the pod's own direct flow to a backend on
    // this node (two flows the backend could not tell apart).
    ...own.map(([f, ip]) =>
      `add rule ${t} postrouting oifname "${s.podIfName}" meta l4proto { tcp, udp, sctp } ${f} saddr ${ip} snat ${f} to ${
        f === "ip6" ? `[${ip}]` : ip
      }:${SERVICE_PORTS}`
    ),
    "",
  ].join("\n");
}

/**
 * The node's nftables table, one for every pod.
 *
 * First, the source check (chain `source`, after conntrack and before kube-proxy's
 * DNAT): a node end takes only what its own pod may send, whatever the node's
 * `rp_filter` (Cilium turns it off, many nodes run with it off, IPv6 has none). A
 * packet from a node end passes when its source routes back over that same node end
 * (`fib saddr . iif`: the node's host routes to the pod's own addresses, one per
 * family, which the plug makes and reconcile restores, and the link's own `fe80::/64`
 * for neighbour discovery, and only for that: solicitations and advertisements; the
 * kernel lets a DHCP request from `0.0.0.0` pass too), or
 * when it is a reply of a connection whose answers go back over that node end (`fib
 * daddr . iif`: the replies of the pod's own Service traffic that the node sent back to
 * leave by its ENI, which come in from the backend's address). Anything else (another
 * pod's address, a VPC address, the node's own) is dropped before conntrack keeps it
 * and before any rule judges its source. Whatever its source, a router advertisement or
 * an ICMP redirect from a node end is dropped (issue 48: a pod must never configure the
 * node). No per-pod state: the check follows the
 * routes, which follow the pod's addresses, and goes with the link.
 *
 * What comes in from a node end and
 * must keep the node's own routes gets the `node` mark: a connection's reply direction
 * (the pod's answer to a probe, a hostPort client, a Service client of this node), a
 * connection kube-proxy masqueraded (its first packet carries kube-proxy's mark, the
 * rest the conntrack's source NAT): it then has the node's identity. Everything else the
 * pod's rules on the node send back over its node end, to leave by the pod's ENI. What a
 * pod sends through its node end that no NAT rewrote and that is not a reply (a ClusterIP
 * kube-proxy has not programmed yet, or will never: an unallocated one in iptables mode)
 * is dropped rather than forwarded by the node's own routes, which would send it out of
 * the node's NIC with the pod's address (`tests/k8s_kube_proxy_test.ts`). And
 * the node's ICMP redirects never go to a node end (the node sends that traffic back out
 * of the node end it came from, which the kernel would answer with one). `legacy` names the node
 * ends of pods ADDed by an enim before issue 34 (no rules of their own on the node):
 * what they send out of anything but a node end is masqueraded to the node's address,
 * as it was then, until their next ADD. Loading it replaces the table as a whole
 * (idempotent).
 */
export function nodeTableRuleset(
  legacy: string[] = [],
  marks: Pick<HostLinkMarks, "node" | "kubeProxyMasquerade"> = DEFAULT_MARKS,
): string {
  const g = String(HOST_LINK_GROUP);
  const m = hex(marks.node), k = hex(marks.kubeProxyMasquerade);
  return [
    `table inet ${NFT_TABLE} {}`,
    `delete table inet ${NFT_TABLE}`,
    `table inet ${NFT_TABLE} {`,
    `\tchain source {`,
    `\t\ttype filter hook prerouting priority mangle; policy accept;`,
    `\t\tiifgroup ${g} jump from_pod`,
    `\t}`,
    `\tchain from_pod {`,
    // Nothing a pod sends configures the node: no router advertisement, no redirect (the
    // node ends' sysctls refuse them too: NODE_END_SYSCTLS); of its link-local source,
    // neighbour discovery alone.
    `\t\ticmp type redirect counter drop`,
    `\t\ticmpv6 type { nd-router-advert, nd-redirect } counter drop`,
    `\t\tip6 saddr fe80::/10 icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } fib saddr . iif oif exists return`,
    `\t\tip6 saddr fe80::/10 counter drop`,
    `\t\tfib saddr . iif oif exists return`,
    `\t\tct direction reply fib daddr . iif oif exists return`,
    `\t\tcounter drop`,
    `\t}`,
    `\tchain prerouting {`,
    `\t\ttype filter hook prerouting priority dstnat + 10; policy accept;`,
    `\t\tiifgroup ${g} ct direction original ct state new ct mark set ct mark | ${m}`,
    `\t\tiifgroup ${g} ct mark & ${m} == ${m} ct status & dnat == dnat ct status & snat == 0 meta mark & ${k} == 0 meta mark set meta mark | ${m}`,
    `\t}`,
    `\tchain forward {`,
    `\t\ttype filter hook forward priority filter; policy accept;`,
    ...(legacy.length === 0
      ? [`\t\tiifgroup ${g} oifgroup != ${g} ct direction original ct status & dnat == 0 drop`]
      : [
        `\t\tiifgroup ${g} iifname != { ${
          legacy.map((n) => `"${n}"`).join(", ")
        } } oifgroup != ${g} ct direction original ct status & dnat == 0 drop`,
      ]),
    `\t}`,
    `\tchain output {`,
    `\t\ttype filter hook output priority filter; policy accept;`,
    `\t\toifgroup ${g} icmp type redirect drop`,
    `\t\toifgroup ${g} icmpv6 type nd-redirect drop`,
    `\t}`,
    ...(legacy.length === 0 ? [] : [
      `\tchain postrouting {`,
      `\t\ttype nat hook postrouting priority srcnat + 10; policy accept;`,
      `\t\tiifname { ${legacy.map((n) => `"${n}"`).join(", ")} } oifgroup != ${g} masquerade`,
      `\t}`,
    ]),
    `}`,
    "",
  ].join("\n");
}

/** The exit code of {@linkcode POD_POLICY_SCRIPT} when a policy step failed. */
export const POD_POLICY_FAILED = 97;

/**
 * The host link's pod-side policy, run by the one process a plug starts in the pod's
 * namespace (through `nsenter --net`) before the rest of its arguments, the plug's
 * `ip -batch -` (fed once the device is in the pod): the sysctls (no early demux, which
 * would hand a reply of the pod's Service traffic the node sends back to a local socket
 * of the same 5-tuple and drop it; `src_valid_mark`; forwarding, for that traffic, after
 * that `ip`), the pod's ruleset, and per family the rules, all at priority 0: the return
 * rule and the answer rule, the local table moved behind them and the main table's host
 * routes (an earlier ADD's in the same namespace are cleared when they are in the way; a
 * rule that is not enim's is left alone and enim's are added beside it). The rules wait for
 * the node's rtnl lock, which the device's move holds for most of its time, so they
 * run in the background while the ruleset loads (nftables does not take that lock)
 * and that `ip` starts; the script waits for them before it exits. A failed policy
 * step exits {@linkcode POD_POLICY_FAILED} (without starting that `ip` when a sysctl
 * or the ruleset failed).
 * Arguments: `$1` the pod's IPv4 address (empty: none), `$2` its IPv6 address (empty:
 * none), `$3` the return mark/mask, `$4` the answer mark/mask, `$5` the table, `$6` the
 * ruleset file, `$7` the `ip` binary, `$8` the `nft` binary, then the program to run and
 * its arguments (none: the policy alone). Nothing of the caller's is interpolated
 * into the script text.
 */
export const POD_POLICY_SCRIPT = [
  'v4="$1" v6="$2" ret="$3" answer="$4" table="$5" ip="$7"',
  // rules FAMILY ADDRESS: at priority 0 and in this order, the return rule, the answer
  // rule, the local table moved behind them and the main table's host routes, in one
  // ip (the local table leaves and comes back within it). When that fails (an earlier
  // ADD's rules in this namespace, for another address perhaps), they are deleted and
  // added again.
  "rules() {",
  '  r="rule del pref 0 fwmark $ret lookup $table"',
  "  add() { printf '%s\\n' \"rule add pref 0 to $2 fwmark $ret lookup $table\"" +
  ' "rule add pref 0 iif lo fwmark $answer lookup $table" "rule del pref 0 lookup local"' +
  ' "rule add pref 0 lookup local" "rule add pref 0 lookup main suppress_prefixlength 0" |',
  '    "$ip" "-$1" -batch - 2>&1; }',
  '  add "$1" "$2" >/dev/null && return 0',
  '  printf \'%s\\n\' "$r" "$r" "$r" "rule del pref 0 iif lo fwmark $answer lookup $table"' +
  ' "rule del pref 0 lookup main suppress_prefixlength 0"' +
  ` "rule del pref ${LEGACY_ANSWER_PREF} fwmark $answer lookup $table" |`,
  '    "$ip" "-$1" -force -batch - >/dev/null 2>&1',
  '  out=$(add "$1" "$2") ||',
  '    { echo "Cannot add the IPv$1 rules pref 0 to $2 fwmark $ret lookup $table: $out" >&2; return 1; }',
  "}",
  '{ { [ -z "$v4" ] || rules 4 "$v4"; } && { [ -z "$v6" ] || rules 6 "$v6"; }; } < /dev/null &',
  "rules=$!",
  'sys() { printf %s "$2" > /proc/sys/net/$1; }',
  '{ sys ipv4/ip_early_demux 0 && { [ -z "$v4" ] || sys ipv4/conf/all/src_valid_mark 1; }; } &&',
  '  "$8" -f "$6" ||',
  `  { wait "$rules"; exit ${POD_POLICY_FAILED}; }`,
  "shift 8",
  "rc=0",
  '[ "$#" -eq 0 ] || { "$@"; rc=$?; }',
  // Forwarding once that ip is done, and the move with it: the kernel takes the rtnl lock
  // for these writes with a trylock and restarts the write while it fails, spinning on a
  // core for as long as the move holds the lock.
  '{ [ -z "$v4" ] || sys ipv4/ip_forward 1; } && { [ -z "$v6" ] || sys ipv6/conf/all/forwarding 1; } ||',
  `  { wait "$rules"; exit ${POD_POLICY_FAILED}; }`,
  `wait "$rules" || exit ${POD_POLICY_FAILED}`,
  'exit "$rc"',
].join("\n");

/** The arguments of {@linkcode POD_POLICY_SCRIPT} (after `$0`). */
export function podPolicyArgs(
  s: Pick<HostLinkSpec, "podAddresses" | "marks">,
  rulesetFile: string,
  bins: { ip: string; nft: string },
): string[] {
  const mm = (m: number) => `${hex(m)}/${hex(m)}`;
  return [
    s.podAddresses.ipv4 ?? "",
    s.podAddresses.ipv6 ? normalizeIp(s.podAddresses.ipv6) : "",
    mm(s.marks.return),
    mm(s.marks.answer),
    String(HOST_LINK_TABLE),
    rulesetFile,
    bins.ip,
    bins.nft,
  ];
}

/** A rule of the pod's policy as CHECK looks for it. */
export interface PodRule {
  priority: number;
  table: string;
  /** The destination the rule matches (the return rule: the pod's own address). */
  dst?: string;
  /** The input device the rule matches (the answer rule: `lo`, the pod's own packets). */
  iif?: string;
}

/**
 * The rules {@linkcode POD_POLICY_SCRIPT} gives the pod, per address it has: the return
 * rule (to the address), the answer rule (`iif lo`), the local table behind them and the
 * main table's host routes.
 */
export function podRulesOf(podAddresses: { ipv4?: string; ipv6?: string }): PodRule[] {
  const table = String(HOST_LINK_TABLE);
  return Object.values(podAddresses).filter((a): a is string => a !== undefined).flatMap((
    a,
  ) => [
    { priority: POD_RULE_PREF, table, dst: normalizeIp(a) },
    { priority: POD_RULE_PREF, table, iif: "lo" },
    { priority: POD_RULE_PREF, table: "local" },
    { priority: POD_RULE_PREF, table: "main" },
  ]);
}

/** How a pod rule reads in a message: `ip rule` words. */
export function podRuleText(r: PodRule): string {
  return [
    `pref ${r.priority}`,
    ...(r.dst ? [`to ${r.dst}`] : []),
    ...(r.iif ? [`iif ${r.iif}`] : []),
    `lookup ${r.table}`,
  ].join(" ");
}

/** Whether a link (as `ip -j link` shows it) is a host link's node end: by its group. */
export function isNodeEnd(l: { group?: string | number }): boolean {
  return String(l.group) === String(HOST_LINK_GROUP);
}
