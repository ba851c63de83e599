/**
 * A pod cannot speak as another over its host link (issue 42 point 3), on the real
 * kernel, whatever the node's reverse-path filter: a node with its own NIC on a VPC that
 * checks every port's source, the real kube-proxy (tests/support/k8s/service_proxy.ts), two
 * dual-stack enim pods `a` and `b` (the real agent and plugin), and UDP sinks that record
 * each datagram's source: one on the node (a node-side listener at the node's address),
 * one in `b` behind a ClusterIP (kube-proxy's DNAT to `b`), one on a VPC machine `r` in
 * another subnet (the ENI path).
 *
 * Pod `a` holds `b`'s addresses and an unassigned VPC address on its loopback (what a pod
 * with `NET_RAW` can send anyway) and sends 20 datagrams from each, per family, to the
 * node's listener and to `b`'s ClusterIP, then 20 from its own address; with the node's
 * `rp_filter` (`all` and `a`'s node end) at 0, 1 and 2 in turn. None of the spoofed
 * datagrams may arrive; every one from `a`'s own address must. On the ENI path the
 * simulated VPC's per-port source check (a cloud's) drops the spoofed ones.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { type AddResult, SimulatedNode } from "./support/node.ts";
import type { NetnsHandle } from "./support/vpc.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { KUBE_PROXY_NEEDS, type ServicePort } from "./support/kube_proxy.ts";
import { type ServiceProxy, startServiceProxy } from "./support/k8s/service_proxy.ts";
import { clientDeps } from "./support/clients.ts";
import { type Burst, sendUdp, type Sink, UdpSinks } from "./support/udp_probe.ts";
import { poll } from "../lib/async.ts";

const DEPS = await clientDeps("host_link_spoof_test", [...TRAFFIC_NEEDS, ...KUBE_PROXY_NEEDS]);

const IP = "/usr/sbin/ip";
const NFT = "/usr/sbin/nft";
const SERVICE_CIDRS = { ipv4: "172.30.0.0/16", ipv6: "fd00:30::/108" };
const CLUSTER_IP = { 4: "172.30.0.20", 6: "fd00:30::20" } as const;
/** An address of the node's VPC subnet that nothing holds. */
const VPC_FREE = { 4: "10.99.0.201", 6: "fd00:99::c9" } as const;
/** The subnet of the VPC machine `r` (another node's pods, say). */
const OTHER = { ipv4: "10.98.0.0/24", ipv6: "fd00:98::/64" };
const NODE_PORT = 7070;
const POD_PORT = 5353;
const COUNT = 20;

const addrOf = (r: AddResult, fam: 4 | 6) =>
  r.ips.map((i) => i.address.split("/")[0]).find((a) => a.includes(":") === (fam === 6))!;

/** `b`'s UDP port 53 at its ClusterIP, per family, as kube-proxy's rules. */
function dnsOf(b: { 4: string; 6: string }): ServicePort[] {
  return ([4, 6] as const).map((fam) => ({
    namespace: "test",
    name: "svc-b",
    portName: "dns",
    protocol: "udp",
    clusterIP: CLUSTER_IP[fam],
    port: 53,
    endpoints: [{ ip: b[fam], port: POD_PORT }],
  }));
}

/** Adds addresses to the loopback of `ns` (IPv6 without DAD). */
async function holdOnLoopback(node: SimulatedNode, ns: NetnsHandle, addrs: string[]) {
  for (const a of addrs) {
    const v6 = a.includes(":");
    const out = await node.vpc.exec(ns, [
      IP,
      "addr",
      "add",
      `${a}/${v6 ? 128 : 32}`,
      "dev",
      "lo",
      ...(v6 ? ["nodad"] : []),
    ]);
    assertEquals(out.code, 0, out.stderr);
  }
}

/** Waits (bounded) until `sink` has `n` datagrams tagged `tag`; returns how many it has. */
async function arrived(sink: Sink, tag: string, n: number): Promise<number> {
  await poll(() => Promise.resolve(sink.tagged(tag).length >= n || null), {
    timeoutMs: 10_000,
    intervalMs: 50,
  })
    .catch(() => null);
  return sink.tagged(tag).length;
}

Deno.test({
  name:
    "a pod's node end takes only the pod's own addresses: datagrams from another local pod's address or a VPC address (IPv4 and IPv6) reach neither a node listener nor a ClusterIP, with the node's rp_filter at 0, 1 and 2, and the pod's own arrive",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const node = await SimulatedNode.start({
      nodeNic: true,
      extraSubnets: [OTHER.ipv4, OTHER.ipv6],
      mock: {
        enis: 4,
        subnets: { ipv4: { cidr: "10.99.0.0/24" }, ipv6: { cidr: "fd00:99::/64" } },
      },
    });
    const sinks = new UdpSinks();
    let proxy: ServiceProxy | null = null;
    try {
      proxy = await startServiceProxy({ serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6] });
      const { vpc } = node;
      const conf = node.netconf("1.1.0", {
        serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6],
      });
      const a = await vpc.pod("a");
      const b = await vpc.pod("b");
      const ra = await node.add(a, { config: conf });
      const rb = await node.add(b, { config: conf });
      const A = { 4: addrOf(ra, 4), 6: addrOf(ra, 6) };
      const B = { 4: addrOf(rb, 4), 6: addrOf(rb, 6) };
      const N = { 4: node.nic!.ipv4!, 6: node.nic!.ipv6! };
      const nodeEnd = ra.interfaces[1].name;
      await proxy.install(node, "iptables", dnsOf(B), [
        { family: 4, serviceCidr: SERVICE_CIDRS.ipv4, nodeIPs: [N[4]] },
        { family: 6, serviceCidr: SERVICE_CIDRS.ipv6, nodeIPs: [N[6]] },
      ]);
      const atNode = await sinks.start(vpc.node, NODE_PORT);
      const atB = await sinks.start(b, POD_PORT);
      await holdOnLoopback(node, a, [B[4], B[6], VPC_FREE[4], VPC_FREE[6]]);

      /** One round: the spoofed bursts, then a's own; none of the spoofed may arrive. */
      const round = async (round: string) => {
        const spoofed: Burst[] = [];
        const own: Burst[] = [];
        for (const fam of [4, 6] as const) {
          const dests = [["node", N[fam], NODE_PORT], ["b", CLUSTER_IP[fam], 53]] as const;
          for (const [sink, to, port] of dests) {
            for (const [who, from] of [["pod-b", B[fam]], ["vpc", VPC_FREE[fam]]] as const) {
              const tag = `${round}-${sink}-${who}-${fam}`;
              spoofed.push({ bind: from, to, port, count: COUNT, tag });
            }
            own.push({ bind: A[fam], to, port, count: COUNT, tag: `${round}-${sink}-own-${fam}` });
          }
        }
        // The spoofed first: once the pod's own have all arrived (the same path, sent
        // after them), whatever of the spoofed could arrive has.
        await sendUdp(a, [...spoofed, ...own]);
        for (const fam of [4, 6] as const) {
          for (const [sink, s] of [["node", atNode], ["b", atB]] as const) {
            const tag = `${round}-${sink}-own-${fam}`;
            assertEquals(await arrived(s, tag, COUNT), COUNT, `${tag}: a's own address`);
            for (const peer of s.tagged(tag)) assertEquals(peer.peer, A[fam]);
          }
        }
        const through = spoofed.flatMap((x) => {
          const s = x.tag.split("-")[1] === "node" ? atNode : atB;
          const n = s.tagged(x.tag).length;
          return n > 0 ? [`${x.tag} (from ${x.bind} to ${x.to}): ${n} of ${COUNT}`] : [];
        });
        assertEquals(through, [], "spoofed datagrams arrived");
      };

      for (const rp of ["0", "1", "2"]) {
        await t.step(`rp_filter ${rp} (all and a's node end)`, async () => {
          await vpc.sysctl(vpc.node, {
            "net/ipv4/conf/all/rp_filter": rp,
            [`net/ipv4/conf/${nodeEnd}/rp_filter`]: rp,
          });
          await round(`rp${rp}`);
        });
      }

      await t.step(
        "rp_filter 0, the node's table gone (a firewall's flush) and the agent restarted: reconcile puts the check back",
        async () => {
          await vpc.sysctl(vpc.node, {
            "net/ipv4/conf/all/rp_filter": "0",
            [`net/ipv4/conf/${nodeEnd}/rp_filter`]: "0",
          });
          await node.stopAgent();
          const del = await vpc.exec(vpc.node, [NFT, "delete", "table", "inet", "enim"]);
          assertEquals(del.code, 0, del.stderr);
          await node.startAgent();
          await round("restart");
        },
      );

      await t.step(
        "the ENI path: the VPC's per-port source check drops what a sends from b's or a free address",
        async () => {
          const r = await vpc.host("r", 50, OTHER);
          const atR = await sinks.start(r.ns, POD_PORT);
          const before = await vpc.sourceCheckDrops();
          const R = { 4: r.ipv4!, 6: r.ipv6! };
          const bursts: Burst[] = [];
          for (const fam of [4, 6] as const) {
            for (const [who, from] of [["pod-b", B[fam]], ["vpc", VPC_FREE[fam]]] as const) {
              bursts.push({
                bind: from,
                to: R[fam],
                port: POD_PORT,
                count: COUNT,
                tag: `eni-${who}-${fam}`,
              });
            }
          }
          for (const fam of [4, 6] as const) {
            bursts.push({
              bind: A[fam],
              to: R[fam],
              port: POD_PORT,
              count: COUNT,
              tag: `eni-own-${fam}`,
            });
          }
          await sendUdp(a, bursts);
          for (const fam of [4, 6] as const) {
            assertEquals(await arrived(atR, `eni-own-${fam}`, COUNT), COUNT, `IPv${fam} own`);
          }
          const through = atR.arrivals.filter((x) => !x.payload.startsWith("eni-own-"));
          assertEquals(through, [], "spoofed datagrams crossed the VPC");
          const dropped = await vpc.sourceCheckDrops() - before;
          assert(dropped >= 4 * COUNT, `the VPC's source check dropped ${dropped}`);
        },
      );
    } catch (err) {
      console.error(await node.agentLog());
      throw err;
    } finally {
      await proxy?.close();
      await sinks[Symbol.asyncDispose]();
      await node.close();
    }
  },
});
