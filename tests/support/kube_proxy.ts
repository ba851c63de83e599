/**
 * kube-proxy's rules, written as kube-proxy writes them, for the simulated node
 * (issue 27): kube-proxy itself does not run here, its rules do. Two modes:
 *
 * - iptables (`pkg/proxy/iptables/proxier.go`): `iptables-restore` input with the
 *   `KUBE-SERVICES` → `KUBE-SVC-<hash>` → `KUBE-SEP-<hash>` DNAT chains, the hairpin
 *   `KUBE-MARK-MASQ` rule per endpoint, `KUBE-POSTROUTING`'s masquerade of what is
 *   marked, and the filter table's `KUBE-FORWARD` (its INVALID drop included);
 * - nftables (`pkg/proxy/nftables/proxier.go`, kube-proxy ≥ 1.31): the `kube-proxy`
 *   table (`ip` or `ip6`) with its sets and verdict maps (`cluster-ips`,
 *   `service-ips`, …), the `service-<hash>-…` and `endpoint-<hash>-…` chains, and
 *   the `mark-for-masquerade` / `masquerading` chains, as 1.31–1.35 write them; or, with
 *   `release` 1.36 or later, as those write them (no endpoint chains without session
 *   affinity, the `hairpin-connections` set; see {@linkcode ProxyOptions.release}).
 *
 * Chain names use kube-proxy's hashes (SHA-256, RFC 4648 base32, truncated), so a
 * service gets the chain names it gets in a cluster (checked against the names in
 * kube-proxy's own tests). Like a kube-proxy started without `--cluster-cidr` (no
 * local-traffic detector), a pod's traffic to a ClusterIP is not marked for
 * masquerade: what enim must handle itself. Written from the rule shapes in
 * kube-proxy's sources and tests; no code of theirs.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { normalizeIp } from "../../lib/ip.ts";
import { runCommand } from "./command.ts";
import { type AptNeed, aptNeeds, lazyTool } from "../../scripts/_deps.ts";

/**
 * What installing kube-proxy's rules needs from Debian (iptables with its nf_tables backend,
 * nft), from scripts/_deps.ts.
 */
export const KUBE_PROXY_NEEDS: AptNeed[] = aptNeeds("iptables", "nftables");

/** One endpoint of a service port. */
export interface Endpoint {
  ip: string;
  port: number;
  /** On this node (default true): from 1.36 only local endpoints are in the hairpin set. */
  local?: boolean;
}

/** One port of a ClusterIP Service, with its ready endpoints. */
export interface ServicePort {
  namespace: string;
  name: string;
  /** The port's name in the Service (`dns`, `http`, …). */
  portName: string;
  protocol: "tcp" | "udp";
  clusterIP: string;
  port: number;
  endpoints: Endpoint[];
}

/** What kube-proxy knows of the node and the cluster, per family. */
export interface ProxyOptions {
  family: 4 | 6;
  /** The Service CIDR of this family (nftables mode drops traffic to unallocated ClusterIPs in it). */
  serviceCidr: string;
  /** The node's addresses of this family (NodePort addresses). */
  nodeIPs: string[];
  /** `--cluster-cidr`: when set, traffic to a ClusterIP from outside it is marked for masquerade. */
  clusterCidr?: string;
  /**
   * The kube-proxy release whose nftables rules to write (default `1.35`). Up to 1.35 each
   * endpoint has a chain (its hairpin masquerade mark, its DNAT) and marking goes through
   * `mark-for-masquerade`; from 1.36 a service without session affinity DNATs in its own
   * chain (through a `numgen` map; from 1.37 one endpoint by a plain `dnat to`), hairpin traffic is
   * masqueraded through the `hairpin-connections` set of local endpoints without a mark,
   * and the cluster-CIDR masquerade is one rule in `services` (checked against the real
   * kube-proxy of the release the tests build: tests/k8s_kube_proxy_test.ts).
   */
  release?: string;
}

/** Whether `release` (`1.36`, `1.37.2`) is at least 1.`minor`. */
function atLeast(release: string | undefined, minor: number): boolean {
  const m = /^1\.(\d+)/.exec(release ?? "1.35");
  return m !== null && Number(m[1]) >= minor;
}

const B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/** RFC 4648 base32 (standard alphabet, as Go's `base32.StdEncoding`), without padding. */
export function base32(bytes: Uint8Array): string {
  let out = "";
  let bits = 0;
  let value = 0;
  for (const b of bytes) {
    value = (value << 8) | b;
    bits += 8;
    while (bits >= 5) {
      out += B32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
    value &= (1 << bits) - 1;
  }
  if (bits > 0) out += B32[(value << (5 - bits)) & 31];
  return out;
}

function sha256Base32(text: string): string {
  return base32(new Uint8Array(createHash("sha256").update(text).digest()));
}

/** `<namespace>/<name>:<portName>`: kube-proxy's ServicePortName string. */
export function servicePortName(s: ServicePort): string {
  return `${s.namespace}/${s.name}${s.portName ? `:${s.portName}` : ""}`;
}

/** An endpoint as `net.JoinHostPort` writes it. */
function hostPort(e: Endpoint): string {
  const ip = normalizeIp(e.ip);
  return ip.includes(":") ? `[${ip}]:${e.port}` : `${ip}:${e.port}`;
}

/** iptables mode: `KUBE-SVC-` and 16 characters of the hash of the port name and protocol. */
export function svcChain(s: ServicePort): string {
  return `KUBE-SVC-${sha256Base32(servicePortName(s) + s.protocol).slice(0, 16)}`;
}

/** iptables mode: `KUBE-SEP-` and 16 characters of the hash of port name, protocol and endpoint. */
export function sepChain(s: ServicePort, e: Endpoint): string {
  return `KUBE-SEP-${sha256Base32(servicePortName(s) + s.protocol + hostPort(e)).slice(0, 16)}`;
}

/** nftables mode: 8 hash characters, a dash, the name (kube-proxy's `hashAndTruncate`). */
function hashAndTruncate(name: string): string {
  const n = `${sha256Base32(name).slice(0, 8)}-${name}`;
  return n.length > 112 ? `${n.slice(0, 109)}...` : n;
}

/** nftables mode: the service port's chain base, `HASH-ns/name/proto/port`. */
export function nftServiceBase(s: ServicePort): string {
  return hashAndTruncate(
    `${s.namespace}/${s.name}/${s.protocol}/${s.portName}`,
  );
}

/** nftables mode: an endpoint's chain base, `HASH-ns/name/proto/port__ip/port`. */
export function nftEndpointBase(s: ServicePort, e: Endpoint): string {
  const ip = normalizeIp(e.ip).replaceAll(":", ".");
  return hashAndTruncate(
    `${s.namespace}/${s.name}/${s.protocol}/${s.portName}__${ip}/${e.port}`,
  );
}

const q = (s: string) => (/\s/.test(s) ? `"${s}"` : s);

/** The `iptables-restore` input kube-proxy's iptables mode writes for `services` of one family. */
export function iptablesRules(
  services: ServicePort[],
  o: ProxyOptions,
): string {
  const mine = services.filter((s) => s.clusterIP.includes(":") === (o.family === 6));
  const filter = [
    "*filter",
    ":KUBE-SERVICES - [0:0]",
    ":KUBE-EXTERNAL-SERVICES - [0:0]",
    ":KUBE-FORWARD - [0:0]",
    ":KUBE-NODEPORTS - [0:0]",
    ":KUBE-PROXY-FIREWALL - [0:0]",
    '-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL',
    '-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS',
    '-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES',
    '-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL',
    '-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD',
    '-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES',
    '-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL',
    '-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
    '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT',
    '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT',
    "COMMIT",
  ];
  const chains: string[] = [];
  const rules: string[] = [];
  for (const s of mine) {
    const spn = servicePortName(s);
    const svc = svcChain(s);
    const ip = normalizeIp(s.clusterIP);
    const match = `-m ${s.protocol} -p ${s.protocol} -d ${ip} --dport ${s.port}`;
    chains.push(`:${svc} - [0:0]`);
    rules.push(
      `-A KUBE-SERVICES -m comment --comment ${q(`${spn} cluster IP`)} ${match} -j ${svc}`,
    );
    if (o.clusterCidr) {
      rules.push(
        `-A ${svc} -m comment --comment ${
          q(`${spn} cluster IP`)
        } ${match} ! -s ${o.clusterCidr} -j KUBE-MARK-MASQ`,
      );
    }
    const n = s.endpoints.length;
    s.endpoints.forEach((e, i) => {
      const sep = sepChain(s, e);
      chains.push(`:${sep} - [0:0]`);
      const prob = i < n - 1
        ? ` -m statistic --mode random --probability ${(1 / (n - i)).toFixed(10)}`
        : "";
      rules.push(
        `-A ${svc} -m comment --comment ${q(`${spn} -> ${hostPort(e)}`)}${prob} -j ${sep}`,
      );
      rules.push(
        `-A ${sep} -m comment --comment ${spn} -s ${normalizeIp(e.ip)} -j KUBE-MARK-MASQ`,
      );
      rules.push(
        `-A ${sep} -m comment --comment ${spn} -m ${s.protocol} -p ${s.protocol} -j DNAT --to-destination ${
          hostPort(e)
        }`,
      );
    });
  }
  const nat = [
    "*nat",
    ":KUBE-SERVICES - [0:0]",
    ":KUBE-NODEPORTS - [0:0]",
    ":KUBE-POSTROUTING - [0:0]",
    ":KUBE-MARK-MASQ - [0:0]",
    ...chains,
    '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
    "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
    "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully',
    "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
    ...rules,
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
    "COMMIT",
  ];
  return [...filter, ...nat, ""].join("\n");
}

/** The `nft -f` input kube-proxy's nftables mode writes for `services` of one family. */
export function nftablesRules(
  services: ServicePort[],
  o: ProxyOptions,
): string {
  const mine = services.filter((s) => s.clusterIP.includes(":") === (o.family === 6));
  const fam = o.family === 6 ? "ip6" : "ip";
  const addr = o.family === 6 ? "ipv6_addr" : "ipv4_addr";
  const t = `${fam} kube-proxy`;
  const modern = atLeast(o.release, 36);
  // A service of one endpoint DNATs to it without a map from 1.37 (1.36.3 still maps it).
  const single = atLeast(o.release, 37);
  const out = [
    `add table ${t} { comment "rules for kube-proxy" ; }`,
    ...(modern
      ? [
        `add set ${t} hairpin-connections { type ${addr} . ${addr} . inet_proto . inet_service ; comment "service hairpin connections" ; }`,
      ]
      : []),
    `add set ${t} cluster-ips { type ${addr} ; comment "Active ClusterIPs" ; }`,
    `add set ${t} nodeport-ips { type ${addr} ; comment "IPs that accept NodePort traffic" ; }`,
    `add map ${t} firewall-ips { type ${addr} . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }`,
    `add map ${t} no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }`,
    `add map ${t} no-endpoint-services { type ${addr} . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }`,
    `add map ${t} service-ips { type ${addr} . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }`,
    `add map ${t} service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }`,
    `add chain ${t} cluster-ips-check`,
    `add chain ${t} filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }`,
    `add chain ${t} filter-output-pre-dnat { type filter hook output priority -110 ; }`,
    `add chain ${t} filter-forward { type filter hook forward priority 0 ; }`,
    `add chain ${t} filter-input { type filter hook input priority 0 ; }`,
    `add chain ${t} filter-output { type filter hook output priority 0 ; }`,
    `add chain ${t} firewall-check`,
    ...(modern ? [] : [`add chain ${t} mark-for-masquerade`]),
    `add chain ${t} masquerading`,
    `add chain ${t} nat-output { type nat hook output priority -100 ; }`,
    `add chain ${t} nat-postrouting { type nat hook postrouting priority 100 ; }`,
    `add chain ${t} nat-prerouting { type nat hook prerouting priority -100 ; }`,
    `add chain ${t} nodeport-endpoints-check`,
    `add chain ${t} reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }`,
    `add chain ${t} services`,
    `add chain ${t} service-endpoints-check`,
    `add rule ${t} cluster-ips-check ${fam} daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`,
    `add rule ${t} cluster-ips-check ${fam} daddr { ${o.serviceCidr} } drop comment "Drop traffic to unallocated ClusterIPs"`,
    `add rule ${t} filter-prerouting-pre-dnat ct state new jump firewall-check`,
    `add rule ${t} filter-forward ct state new jump service-endpoints-check`,
    `add rule ${t} filter-forward ct state new jump cluster-ips-check`,
    `add rule ${t} filter-input ct state new jump nodeport-endpoints-check`,
    `add rule ${t} filter-input ct state new jump service-endpoints-check`,
    `add rule ${t} filter-output ct state new jump service-endpoints-check`,
    `add rule ${t} filter-output-pre-dnat ct state new jump firewall-check`,
    `add rule ${t} filter-output ct state new jump cluster-ips-check`,
    `add rule ${t} firewall-check ${fam} daddr . meta l4proto . th dport vmap @firewall-ips`,
    ...(modern
      ? [
        `add rule ${t} masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random`,
        `add rule ${t} masquerading ct status dnat ${fam} saddr . ${fam} daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random`,
      ]
      : [
        `add rule ${t} mark-for-masquerade mark set mark or 0x4000`,
        `add rule ${t} masquerading mark and 0x4000 == 0 return`,
        `add rule ${t} masquerading mark set mark xor 0x4000`,
        `add rule ${t} masquerading masquerade fully-random`,
      ]),
    `add rule ${t} nat-output jump services`,
    `add rule ${t} nat-postrouting jump masquerading`,
    `add rule ${t} nat-prerouting jump services`,
    `add rule ${t} nodeport-endpoints-check ${fam} daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports`,
    `add rule ${t} reject-chain reject`,
    ...(modern && o.clusterCidr
      ? [
        `add rule ${t} services ${fam} daddr @cluster-ips ${fam} saddr != ${o.clusterCidr} mark set mark or 0x4000 comment "masquerade clusterIP traffic from outside cluster"`,
      ]
      : []),
    `add rule ${t} services ${fam} daddr . meta l4proto . th dport vmap @service-ips`,
    `add rule ${t} services ${fam} daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports`,
    ...o.nodeIPs.map((ip) => `add element ${t} nodeport-ips { ${normalizeIp(ip)} }`),
    `add rule ${t} service-endpoints-check ${fam} daddr . meta l4proto . th dport vmap @no-endpoint-services`,
  ];
  for (const s of mine) {
    const svc = `service-${nftServiceBase(s)}`;
    const ip = normalizeIp(s.clusterIP);
    if (modern) {
      out.push(`add chain ${t} ${svc}`);
      const e = s.endpoints;
      out.push(
        e.length === 1 && single
          ? `add rule ${t} ${svc} meta l4proto ${s.protocol} dnat to ${hostPort(e[0])}`
          : `add rule ${t} ${svc} meta l4proto ${s.protocol} dnat ${fam} addr . port to numgen random mod ${e.length} map { ${
            e.map((x, i) => `${i} : ${normalizeIp(x.ip)} . ${x.port}`).join(" , ")
          } }`,
      );
      for (const x of e.filter((x) => x.local ?? true)) {
        const a = normalizeIp(x.ip);
        out.push(
          `add element ${t} hairpin-connections { ${a} . ${a} . ${s.protocol} . ${x.port} }`,
        );
      }
      out.push(`add element ${t} cluster-ips { ${ip} }`);
      out.push(
        `add element ${t} service-ips { ${ip} . ${s.protocol} . ${s.port} : goto ${svc} }`,
      );
      continue;
    }
    const eps = s.endpoints.map((e) => ({
      e,
      chain: `endpoint-${nftEndpointBase(s, e)}`,
    }));
    // As kube-proxy's transaction: every chain of the service first, then its rules.
    for (const { chain } of eps) out.push(`add chain ${t} ${chain}`);
    out.push(`add chain ${t} ${svc}`);
    if (o.clusterCidr) {
      out.push(
        `add rule ${t} ${svc} ${fam} daddr ${ip} ${fam} saddr != ${o.clusterCidr} jump mark-for-masquerade`,
      );
    }
    out.push(
      `add rule ${t} ${svc} numgen random mod ${eps.length} vmap { ${
        eps.map((x, i) => `${i} : goto ${x.chain}`).join(" , ")
      } }`,
    );
    for (const { e, chain } of eps) {
      out.push(
        `add rule ${t} ${chain} ${fam} saddr ${normalizeIp(e.ip)} jump mark-for-masquerade`,
      );
      out.push(
        `add rule ${t} ${chain} meta l4proto ${s.protocol} dnat to ${hostPort(e)}`,
      );
    }
    out.push(`add element ${t} cluster-ips { ${ip} }`);
    out.push(
      `add element ${t} service-ips { ${ip} . ${s.protocol} . ${s.port} : goto ${svc} }`,
    );
  }
  return [...out, ""].join("\n");
}

/** kube-proxy's mode. */
export type ProxyMode = "iptables" | "nftables";

const iptablesRestore = lazyTool("/usr/sbin/iptables-restore");
const ip6tablesRestore = lazyTool("/usr/sbin/ip6tables-restore");
const nft = lazyTool("/usr/sbin/nft");

/** Runs `argv` in the named namespace with `stdin`; throws with its stderr on failure. */
async function inNs(
  netns: string,
  argv: string[],
  stdin: string,
): Promise<void> {
  const r = await runCommand(
    ["/usr/sbin/ip", "netns", "exec", netns, ...argv],
    { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
    stdin,
  );
  if (r.code !== 0) {
    throw new Error(`${argv.join(" ")} in ${netns} failed: ${r.stderr}`);
  }
}

/**
 * Installs kube-proxy's rules for `services` in the namespace `netns` (the simulated
 * node), per family in `opts`, as the mode writes them; replaces what an earlier
 * call of either mode installed.
 */
export async function installKubeProxy(
  netns: string,
  mode: ProxyMode,
  services: ServicePort[],
  opts: ProxyOptions[],
): Promise<void> {
  await removeKubeProxy(netns);
  for (const o of opts) {
    if (mode === "iptables") {
      const bin = o.family === 6 ? ip6tablesRestore() : iptablesRestore();
      await inNs(netns, [bin, "--noflush"], iptablesRules(services, o));
    } else {
      await inNs(netns, [nft(), "-f", "-"], nftablesRules(services, o));
    }
  }
}

/** Removes both modes' rules from `netns` (kube-proxy's `--cleanup`, in short: flush). */
export async function removeKubeProxy(netns: string): Promise<void> {
  const ruleset = [
    "table ip kube-proxy {}",
    "delete table ip kube-proxy",
    "table ip6 kube-proxy {}",
    "delete table ip6 kube-proxy",
    // iptables-nft's tables: kube-proxy's chains live there (and nothing else of ours).
    "table ip nat {}",
    "delete table ip nat",
    "table ip filter {}",
    "delete table ip filter",
    "table ip6 nat {}",
    "delete table ip6 nat",
    "table ip6 filter {}",
    "delete table ip6 filter",
    "",
  ].join("\n");
  await inNs(netns, [nft(), "-f", "-"], ruleset);
}
