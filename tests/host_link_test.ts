/**
 * The host link in a simulated Kubernetes node (issue 27), on the real kernel: a node
 * with its own NIC on a VPC that checks every port's source MAC and addresses,
 * the real kube-proxy (iptables and nftables modes; tests/support/k8s/service_proxy.ts: its
 * rules written by hand without Go or with `ENIM_KUBE_PROXY=rules`), strict reverse-path
 * filtering in the node and in the pods, and dual-stack pods on enim ENIs.
 *
 * Backends of the Services: (a) `r`, a machine in another subnet of the VPC (a pod of
 * another node), (b) pod `b`, an enim pod on this node, (c) a server on the node itself
 * (hostNetwork), UDP bound to the wildcard address. Client: pod `a`. Each server answers
 * with its name and the address it saw, so a test tells who answered and what source
 * reached it. Also: the node's TCP to a pod (a kubelet probe), `portmap` chained after
 * enim with a client elsewhere in the VPC, NodeLocal DNS at 169.254.20.10 and on kube-dns's
 * ClusterIP, CHECK, DEL, the link turned off, bad configs, and a kill in the middle of an
 * ADD.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { type AddResult, SimulatedNode } from "./support/node.ts";
import type { NetnsHandle, SimulatedVpc } from "./support/vpc.ts";
import { ask, lastError, Servers, TRAFFIC_NEEDS, who } from "./support/traffic.ts";
import { KUBE_PROXY_NEEDS, type ProxyMode, type ServicePort } from "./support/kube_proxy.ts";
import { type ServiceProxy, startServiceProxy } from "./support/k8s/service_proxy.ts";
import { clientDeps, runInNode } from "./support/clients.ts";
import { IpFaults } from "./support/ip_faults.ts";
import { nodeEnds, strayNodeEndArgs } from "./support/host_link_fixtures.ts";
import { poll } from "../lib/async.ts";
import { nodeIfNameFor } from "../manager/host_link.ts";
import { aptNeeds } from "../scripts/_deps.ts";

const DEPS = await clientDeps("host_link_test", [
  ...TRAFFIC_NEEDS,
  ...KUBE_PROXY_NEEDS,
  ...aptNeeds("containernetworking-plugins"),
]);

const IP = "/usr/sbin/ip";
const SERVICE_CIDRS = { ipv4: "172.30.0.0/16", ipv6: "fd00:30::/108" };
const CIDRS = [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6];
const NODELOCAL_DNS = "169.254.20.10";
/** kube-dns's ClusterIP. */
const KUBE_DNS = "172.30.0.10";
const STRICT = { "net/ipv4/conf/all/rp_filter": "1", "net/ipv4/conf/default/rp_filter": "1" };

/** The network config of a Kubernetes node's pods. */
function kubeConf(node: SimulatedNode, extra: Record<string, unknown> = {}) {
  return node.netconf("1.1.0", {
    serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6],
    hostStackCidrs: [`${NODELOCAL_DNS}/32`],
    ...extra,
  });
}

/** A node on a dual-stack VPC with its NIC, strict rp_filter, and a second subnet. */
async function kubeNode(enis = 4): Promise<SimulatedNode> {
  const node = await SimulatedNode.start({
    nodeNic: true,
    extraSubnets: ["10.98.0.0/24", "fd00:98::/64"],
    mock: {
      enis,
      subnets: { ipv4: { cidr: "10.99.0.0/24" }, ipv6: { cidr: "fd00:99::/64" } },
    },
    // No table check: the negative control deletes enim's node table and must see the pod's
    // Service traffic dropped before the GC pass it runs loads the table again.
    extra: { hostLink: { tableCheckSeconds: 0 } },
  });
  try {
    await node.vpc.sysctl(node.vpc.node, STRICT);
  } catch (err) {
    await node.close();
    throw err;
  }
  return node;
}

/** A pod namespace with strict rp_filter (as RHEL-family hosts give their pods). */
async function strictPod(vpc: SimulatedVpc, name: string): Promise<NetnsHandle> {
  const pod = await vpc.pod(name);
  await vpc.sysctl(pod, STRICT);
  return pod;
}

const addrOf = (r: AddResult, fam: 4 | 6) =>
  r.ips.map((i) => i.address.split("/")[0]).find((a) => a.includes(":") === (fam === 6))!;

/**
 * The scene of the Service tests: a VPC machine `r` in another subnet, two enim pods `a`
 * and `b` on the node (strict rp_filter) with their ADD results, and each one's addresses
 * and the node's.
 */
async function twoPods(node: SimulatedNode) {
  const { vpc } = node;
  const nic = node.nic!;
  const r = await vpc.host("r", 50, { ipv4: "10.98.0.0/24", ipv6: "fd00:98::/64" });
  const a = await strictPod(vpc, "a");
  const b = await strictPod(vpc, "b");
  const ra = await node.add(a, { config: kubeConf(node) });
  const rb = await node.add(b, { config: kubeConf(node) });
  const A = { v4: addrOf(ra, 4), v6: addrOf(ra, 6) };
  const B = { v4: addrOf(rb, 4), v6: addrOf(rb, 6) };
  const N = { v4: nic.ipv4!, v6: nic.ipv6! };
  return { vpc, r, a, b, ra, rb, A, B, N };
}

/** One Service (TCP port 80 "http", UDP port 53 "dns") per family and backend. */
function services(backends: Record<string, { v4: string; v6: string }>): ServicePort[] {
  const out: ServicePort[] = [];
  let n = 20;
  for (const [name, b] of Object.entries(backends)) {
    for (const [fam, ip] of [[4, b.v4], [6, b.v6]] as const) {
      const clusterIP = fam === 4 ? `172.30.0.${n}` : `fd00:30::${n}`;
      out.push({
        namespace: "test",
        name: `svc-${name}`,
        portName: "http",
        protocol: "tcp",
        clusterIP,
        port: 80,
        endpoints: [{ ip, port: 8080 }],
      }, {
        namespace: "test",
        name: `svc-${name}`,
        portName: "dns",
        protocol: "udp",
        clusterIP,
        port: 53,
        endpoints: [{ ip, port: 5353 }],
      });
    }
    n++;
  }
  return out;
}

/** Starts the test's servers: TCP 8080 and UDP 5353, both families, named after their host. */
async function serve(servers: Servers, hosts: [NetnsHandle, string][]): Promise<void> {
  await Promise.all(
    hosts.map(([ns, name]) =>
      servers.start(ns, name, [{ proto: "tcp", port: 8080 }, { proto: "udp", port: 5353 }])
    ),
  );
}

Deno.test({
  name:
    "an enim pod reaches ClusterIPs backed by a VPC pod in another subnet, an enim pod on the node and a node process, over TCP and UDP, IPv4 and IPv6, under kube-proxy's iptables and nftables rules",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const node = await kubeNode();
    await using servers = new Servers();
    let proxy: ServiceProxy | null = null;
    try {
      proxy = await startServiceProxy({ serviceCidrs: CIDRS });
      const { vpc, r, a, b, ra, A, B, N } = await twoPods(node);
      const R = { v4: r.ipv4!, v6: r.ipv6! };
      await serve(servers, [[r.ns, "r"], [b, "b"], [vpc.node, "node"]]);
      const svcs = services({ remote: R, pod: B, node: N });
      const opts = [
        { family: 4 as const, serviceCidr: SERVICE_CIDRS.ipv4, nodeIPs: [N.v4] },
        { family: 6 as const, serviceCidr: SERVICE_CIDRS.ipv6, nodeIPs: [N.v6] },
      ];
      // Who answers each Service, and which address it sees: every backend sees the
      // pod's own (what goes beyond the node leaves by the pod's ENI, never masqueraded).
      const expect = (fam: 4 | 6) => {
        const k = fam === 4 ? "v4" : "v6";
        return { remote: `r ${A[k]}`, pod: `b ${A[k]}`, node: `node ${A[k]}` };
      };
      for (const mode of ["iptables", "nftables"] as ProxyMode[]) {
        await proxy.install(node, mode, svcs, opts);
        for (const fam of [4, 6] as const) {
          const want = expect(fam);
          for (const [i, backend] of (["remote", "pod", "node"] as const).entries()) {
            const clusterIP = fam === 4 ? `172.30.0.${20 + i}` : `fd00:30::${20 + i}`;
            for (const [proto, port] of [["tcp", 80], ["udp", 53]] as const) {
              await t.step(`${mode}: IPv${fam} ${proto} to ${clusterIP} (${backend})`, async () => {
                assertEquals(who(await ask(a, proto, clusterIP, port)), want[backend], lastError);
              });
            }
          }
        }
      }
      await t.step("the node opens TCP to the pod (a kubelet probe), IPv4 and IPv6", async () => {
        await servers.start(a, "a", [{ proto: "tcp", port: 9090 }]);
        assertEquals(who(await ask(vpc.node, "tcp", A.v4, 9090)), `a ${N.v4}`);
        assertEquals(who(await ask(vpc.node, "tcp", A.v6, 9090)), `a ${N.v6}`);
      });
      await t.step(
        "a UDP server on the node bound to the wildcard answers from the address asked",
        async () => {
          assertEquals(who(await ask(a, "udp", N.v4, 5353)), `node ${A.v4}`);
          assertEquals(who(await ask(a, "udp", N.v6, 5353)), `node ${A.v6}`);
        },
      );
      await t.step("NodeLocal DNS at 169.254.20.10 on the node answers the pod", async () => {
        // NodeLocal DNSCache's own interface (a dummy there; a bridge here, where dummies fail).
        for (
          const cmd of [
            ["link", "add", "nodelocaldns", "type", "bridge"],
            ["link", "set", "dev", "nodelocaldns", "up"],
            ["addr", "add", `${NODELOCAL_DNS}/32`, "dev", "nodelocaldns"],
          ]
        ) {
          const out = await vpc.exec(vpc.node, [IP, ...cmd]);
          assertEquals(out.code, 0, out.stderr);
        }
        await servers.start(vpc.node, "nodelocal", [{
          proto: "udp",
          port: 53,
          bind: NODELOCAL_DNS,
        }]);
        assertEquals(who(await ask(a, "udp", NODELOCAL_DNS, 53)), `nodelocal ${A.v4}`);
      });
      await t.step(
        "NodeLocal DNS on kube-dns's ClusterIP (its NOTRACK rules ahead of kube-proxy's), iptables and nftables modes: the node's cache answers the pod, which kube-dns's backend answered before",
        async () => {
          // What node-local-dns does on a node whose pods ask kube-dns's ClusterIP (from its
          // published setup): that address on its interface, and raw-table NOTRACK rules
          // (before conntrack, so kube-proxy's DNAT never sees the query) with filter ACCEPTs.
          const kubeDns: ServicePort = {
            namespace: "kube-system",
            name: "kube-dns",
            portName: "dns",
            protocol: "udp",
            clusterIP: KUBE_DNS,
            port: 53,
            endpoints: [{ ip: R.v4, port: 5353 }],
          };
          // Each rule: its table, chain, direction (the query in, the answer out) and verdict.
          const rules = (op: "-A" | "-D") =>
            ([
              ["raw", "PREROUTING", "in", "NOTRACK"],
              ["raw", "OUTPUT", "out", "NOTRACK"],
              ["filter", "INPUT", "in", "ACCEPT"],
              ["filter", "OUTPUT", "out", "ACCEPT"],
            ] as const).map(([table, chain, dir, verdict]) => [
              "-t",
              table,
              op,
              chain,
              dir === "in" ? "-d" : "-s",
              KUBE_DNS,
              "-p",
              "udp",
              dir === "in" ? "--dport" : "--sport",
              "53",
              "-j",
              verdict,
            ]);
          const run = async (argv: string[]) => {
            const out = await vpc.exec(vpc.node, argv);
            assertEquals(out.code, 0, `${argv.join(" ")}: ${out.stderr}`);
          };
          for (const mode of ["iptables", "nftables"] as ProxyMode[]) {
            await proxy!.install(node, mode, [...svcs, kubeDns], opts);
            assertEquals(who(await ask(a, "udp", KUBE_DNS, 53)), `r ${A.v4}`, lastError);
            await run([IP, "addr", "add", `${KUBE_DNS}/32`, "dev", "nodelocaldns"]);
            for (const r of rules("-A")) await run(["/usr/sbin/iptables", "-w", ...r]);
            const cache = new Servers();
            await cache.start(vpc.node, "nodelocal", [{ proto: "udp", port: 53, bind: KUBE_DNS }]);
            try {
              assertEquals(who(await ask(a, "udp", KUBE_DNS, 53)), `nodelocal ${A.v4}`, lastError);
            } finally {
              await cache[Symbol.asyncDispose]();
              for (const r of rules("-D")) await run(["/usr/sbin/iptables", "-w", ...r]);
              await run([IP, "addr", "del", `${KUBE_DNS}/32`, "dev", "nodelocaldns"]);
            }
          }
        },
      );
      await t.step("portmap chained after enim maps a hostPort a VPC client reaches", async () => {
        // A client in another subnet: portmap masquerades one of the pod's own subnet
        // (its hairpin rule), this one reaches the pod with its own address.
        const c = await vpc.host("c", 60, { ipv4: "10.98.0.0/24", ipv6: "fd00:98::/64" });
        const conf = {
          cniVersion: "1.0.0",
          name: "enim-test",
          type: "portmap",
          runtimeConfig: {
            portMappings: [
              { hostPort: 7000, containerPort: 9090, protocol: "tcp" },
            ],
          },
          prevResult: { ...ra, cniVersion: "1.0.0" },
        };
        const env = {
          CNI_CONTAINERID: "c-a",
          CNI_NETNS: a.path,
          CNI_IFNAME: "eth0",
          CNI_PATH: "/usr/lib/cni",
        };
        const add = await runInNode(node, ["/usr/lib/cni/portmap"], {
          ...env,
          CNI_COMMAND: "ADD",
        }, JSON.stringify(conf));
        assertEquals(add.code, 0, add.stdout + add.stderr);
        try {
          // The client's own address reaches the pod, and the answer comes back to it.
          assertEquals(who(await ask(c.ns, "tcp", N.v4, 7000)), `a ${c.ipv4}`, lastError);
          assertEquals(who(await ask(c.ns, "tcp", N.v6, 7000)), `a ${c.ipv6}`, lastError);
        } finally {
          const del = await runInNode(node, ["/usr/lib/cni/portmap"], {
            ...env,
            CNI_COMMAND: "DEL",
          }, JSON.stringify(conf));
          assertEquals(del.code, 0, del.stdout + del.stderr);
        }
      });
      await t.step(
        "nothing of a pod left the node's NIC: the VPC's source check dropped nothing, and the node masquerades nothing of a pod",
        async () => {
          assertEquals(await vpc.sourceCheckDrops(), 0);
          // kube-proxy masquerades only what it marked itself (hairpin, NodePorts); enim's
          // own table on the node masquerades nothing.
          const enim = await vpc.exec(vpc.node, ["/usr/sbin/nft", "list", "table", "inet", "enim"]);
          assert(!enim.stdout.includes("masquerade"), enim.stdout);
        },
      );
      await t.step(
        "without enim's node table the VPC drops the pod's Service traffic",
        async () => {
          // The negative control: with the node's mark gone the node routes the pod's Service
          // traffic out of its own NIC with the pod's address, and the source check drops it.
          await vpc.exec(vpc.node, ["/usr/sbin/nft", "delete", "table", "inet", "enim"]);
          assertEquals(await ask(a, "tcp", "172.30.0.20", 80), "");
          assert(await vpc.sourceCheckDrops() > 0);
          // The agent's GC pass loads the table again.
          const gc = await node.enim(["gc"]);
          assertEquals(gc.code, 0, gc.stdout + gc.stderr);
          assertEquals(who(await ask(a, "tcp", "172.30.0.20", 80)), `r ${A.v4}`);
        },
      );
      await t.step(
        "without the pod's connection marks, an enim backend's answer leaves by its ENI and is lost",
        async () => {
          // Pod b's answers to a's Service connection must go back through the node (whose
          // conntrack reverses the DNAT); its ENI would carry them to a, which drops them.
          const out = await vpc.exec(b, ["/usr/sbin/nft", "delete", "table", "inet", "enim"]);
          assertEquals(out.code, 0, out.stderr);
          assertEquals(await ask(a, "tcp", "172.30.0.21", 80), "");
        },
      );
      await t.step(
        "CHECK passes, and names a node route to the pod that went missing",
        async () => {
          const call = { ...node.podCall(a, { config: { ...kubeConf(node), prevResult: ra } }) };
          const ok = await node.cni("CHECK", call);
          assertEquals(ok.code, 0, ok.stdout);
          const nodeEnd = ra.interfaces[1].name;
          await vpc.exec(vpc.node, [IP, "route", "del", `${A.v4}/32`, "dev", nodeEnd]);
          const bad = await node.cni("CHECK", call);
          assertEquals(bad.code, 1);
          assertStringIncludes(bad.stdout, `${A.v4}/32`);
          assertStringIncludes(bad.stdout, nodeEnd);
        },
      );
      await t.step("DEL removes the link: no node end, no pod end", async () => {
        await node.del(a, { config: kubeConf(node) });
        await node.del(b, { config: kubeConf(node) });
        // The agent removes a DEL's link right after answering it.
        assertEquals(
          await poll(async () => (await nodeEnds(vpc)).length === 0 || null, {
            timeoutMs: 3000,
            intervalMs: 20,
          }),
          true,
        );
        const links = await vpc.exec(a, [IP, "-o", "link", "show"]);
        assert(!links.stdout.includes("host0"), links.stdout);
      });
    } catch (err) {
      console.error(await node.agentLog());
      throw err;
    } finally {
      await proxy?.close();
      await servers[Symbol.asyncDispose]();
      await node.close();
    }
  },
});

Deno.test({
  name:
    "sbr chained after enim: the pod keeps its probes, its Services (remote and on the node) and its hostPort",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const node = await kubeNode();
    await using servers = new Servers();
    let proxy: ServiceProxy | null = null;
    try {
      proxy = await startServiceProxy({ serviceCidrs: CIDRS });
      const { vpc, r, a, b, ra, A, B, N } = await twoPods(node);
      const c = await vpc.host("c", 60, { ipv4: "10.98.0.0/24", ipv6: "fd00:98::/64" });
      // sbr (source-based routing) after enim, as a conflist would chain it: it moves the
      // ENI's routes to a table of their own and adds "from <pod address> lookup" rules.
      const sbrEnv = {
        CNI_CONTAINERID: "c-a",
        CNI_NETNS: a.path,
        CNI_IFNAME: "eth0",
        CNI_PATH: "/usr/lib/cni",
      };
      const sbrConf = {
        cniVersion: "1.0.0",
        name: "enim-test",
        type: "sbr",
        prevResult: { ...ra, cniVersion: "1.0.0" },
      };
      const add = await runInNode(node, ["/usr/lib/cni/sbr"], {
        ...sbrEnv,
        CNI_COMMAND: "ADD",
      }, JSON.stringify(sbrConf));
      assertEquals(add.code, 0, add.stdout + add.stderr);
      const rules = await vpc.exec(a, [IP, "rule", "show"]);
      await serve(servers, [[r.ns, "r"], [b, "b"]]);
      await servers.start(a, "a", [{ proto: "tcp", port: 9090 }]);
      await proxy.install(node, "nftables", services({ remote: r4(r), pod: B }), [
        { family: 4, serviceCidr: SERVICE_CIDRS.ipv4, nodeIPs: [N.v4] },
        { family: 6, serviceCidr: SERVICE_CIDRS.ipv6, nodeIPs: [N.v6] },
      ]);
      await t.step("the node's probe reaches the pod, IPv4 and IPv6", async () => {
        assertEquals(who(await ask(vpc.node, "tcp", A.v4, 9090)), `a ${N.v4}`, rules.stdout);
        assertEquals(who(await ask(vpc.node, "tcp", A.v6, 9090)), `a ${N.v6}`, rules.stdout);
      });
      await t.step("a ClusterIP backed by a VPC machine sees the pod's own address", async () => {
        assertEquals(who(await ask(a, "tcp", "172.30.0.20", 80)), `r ${A.v4}`, rules.stdout);
        assertEquals(who(await ask(a, "udp", "172.30.0.20", 53)), `r ${A.v4}`, rules.stdout);
        assertEquals(who(await ask(a, "tcp", "fd00:30::20", 80)), `r ${A.v6}`, rules.stdout);
      });
      await t.step("a ClusterIP backed by an enim pod on the node", async () => {
        assertEquals(who(await ask(a, "tcp", "172.30.0.21", 80)), `b ${A.v4}`, rules.stdout);
        assertEquals(who(await ask(a, "tcp", "fd00:30::21", 80)), `b ${A.v6}`, rules.stdout);
      });
      await t.step("a hostPort (portmap) a VPC client reaches", async () => {
        const conf = {
          cniVersion: "1.0.0",
          name: "enim-test",
          type: "portmap",
          runtimeConfig: {
            portMappings: [{ hostPort: 7000, containerPort: 9090, protocol: "tcp" }],
          },
          prevResult: { ...ra, cniVersion: "1.0.0" },
        };
        const pm = await runInNode(node, ["/usr/lib/cni/portmap"], {
          ...sbrEnv,
          CNI_COMMAND: "ADD",
        }, JSON.stringify(conf));
        assertEquals(pm.code, 0, pm.stdout + pm.stderr);
        assertEquals(who(await ask(c.ns, "tcp", N.v4, 7000)), `a ${c.ipv4}`, lastError);
        assertEquals(who(await ask(c.ns, "tcp", N.v6, 7000)), `a ${c.ipv6}`, lastError);
      });
    } catch (err) {
      console.error(await node.agentLog());
      throw err;
    } finally {
      await proxy?.close();
      await servers[Symbol.asyncDispose]();
      await node.close();
    }
  },
});

/** A VPC machine's addresses as `services` takes them. */
function r4(h: { ipv4?: string; ipv6?: string }): { v4: string; v6: string } {
  return { v4: h.ipv4!, v6: h.ipv6! };
}

Deno.test({
  name:
    "a pod namespace ADDed again (another container) gets enim's rules once, for its address, over an earlier container's rules for another, and its traffic works",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await kubeNode(3);
    await using servers = new Servers();
    const pod = await strictPod(node.vpc, "again");
    const first = await node.add(pod, { containerId: "c-first", config: kubeConf(node) });
    await node.del(pod, { containerId: "c-first", config: kubeConf(node) });
    // The rules an earlier container of this namespace left for another address (its ENI
    // then another one): the return rule names that address.
    for (
      const [fam, addr, stale] of [["-4", addrOf(first, 4), "10.99.0.99"], [
        "-6",
        addrOf(first, 6),
        "fd00:99::99",
      ]]
    ) {
      const ret = (op: string, to: string) =>
        node.vpc.exec(pod, [
          IP,
          fam,
          "rule",
          op,
          "pref",
          "0",
          "to",
          to,
          "fwmark",
          "0x2000/0x2000",
          "lookup",
          "2000",
        ]);
      assertEquals((await ret("del", addr)).code, 0);
      assertEquals((await ret("add", stale)).code, 0);
    }
    const again = await node.add(pod, { containerId: "c-again", config: kubeConf(node) });
    const b4 = addrOf(again, 4);
    const rules = async (fam: "-4" | "-6") =>
      (await node.vpc.exec(pod, [IP, fam, "rule", "show", "pref", "0"])).stdout.trim().split("\n")
        .map((l) => l.replace(/^0:\s+/, ""));
    const cases = [["-4", b4, "10.99.0.99"], ["-6", addrOf(again, 6), "fd00:99::99"]] as const;
    for (const [fam, addr, old] of cases) {
      const got = await rules(fam);
      assertEquals(got, [
        `from all to ${addr} fwmark 0x2000/0x2000 lookup 2000`,
        "from all fwmark 0x1000/0x1000 iif lo lookup 2000",
        "from all lookup local",
        "from all lookup main suppress_prefixlength 0",
      ], got.join("\n"));
      assert(!got.some((l) => l.includes(old)), got.join("\n"));
    }
    await servers.start(pod, "again", [{ proto: "tcp", port: 9090 }]);
    const nic = node.nic!;
    assertEquals(who(await ask(node.vpc.node, "tcp", b4, 9090)), `again ${nic.ipv4}`);
    await node.del(pod, { containerId: "c-again", config: kubeConf(node) });
  },
});

Deno.test({
  name: "with hostLink enabled false the pod gets exactly enim's ENI and nothing else",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await kubeNode(2);
    const pod = await node.vpc.pod("off");
    const res = await node.add(pod, {
      config: kubeConf(node, { hostLink: { enabled: false } }),
    });
    assertEquals(res.interfaces.length, 1);
    assertEquals(res.interfaces[0].name, "eth0");
    assertEquals(res.routes.map((r) => r.dst), ["0.0.0.0/0", "::/0"]);
    const links = await node.vpc.exec(pod, [IP, "-o", "link", "show"]);
    assertEquals(links.stdout.split("\n").filter((l) => l.trim()).length, 2, links.stdout);
    assertEquals(await nodeEnds(node.vpc), []);
    await node.del(pod, { config: kubeConf(node, { hostLink: { enabled: false } }) });
  },
});

Deno.test({
  name:
    "bad host link configs: no serviceCidrs still gives the ENI and says Services will not route; an overlapping one fails with 7 and leaks nothing",
  ignore: DEPS.skip !== null,
  async fn(t) {
    await using node = await kubeNode(2);
    await t.step(
      "no serviceCidrs: the ENI, a warning in the agent's log and in enim status",
      async () => {
        const pod = await node.vpc.pod("nosvc");
        const res = await node.add(pod, { config: node.netconf("1.1.0", {}) });
        assertEquals(res.interfaces.length, 3);
        assert(await node.vpc.ping(pod, res.ips[0].gateway!), "the pod pings its gateway");
        assertStringIncludes(await node.agentLog(), "Services will not route");
        const status = await node.enim(["status"]);
        assertStringIncludes(status.stdout, 'NO SERVICES: network "enim-test"');
        await node.del(pod, { config: node.netconf("1.1.0", {}) });
      },
    );
    for (
      const [name, extra, field] of [
        ["a service CIDR overlapping the ENI's subnet", {
          serviceCidrs: ["10.99.0.0/16"],
        }, "serviceCidrs[0]"],
        ["an IPv6 host-stack CIDR overlapping it", {
          serviceCidrs: [SERVICE_CIDRS.ipv4],
          hostStackCidrs: ["fd00:99::/48"],
        }, "hostStackCidrs[0]"],
      ] as const
    ) {
      await t.step(name, async () => {
        const pod = await node.vpc.pod(`bad-${field.slice(0, 4).toLowerCase()}`);
        const before = (await node.client.status()).pool;
        const out = await node.cni(
          "ADD",
          node.podCall(pod, { config: node.netconf("1.1.0", extra) }),
        );
        assertEquals(out.code, 1);
        assertEquals(out.json?.code, 7, out.stdout);
        assertStringIncludes(String(out.json?.msg), field);
        assertEquals((await node.client.status()).pool, before);
        assertEquals((await node.client.attachments()).length, 0);
        assertEquals(await nodeEnds(node.vpc), []);
        const links = await node.vpc.exec(pod, [IP, "-o", "link", "show"]);
        assertEquals(links.stdout.split("\n").filter((l) => l.trim()).length, 1, links.stdout);
      });
    }
  },
});

Deno.test({
  name:
    "a host link policy that fails in the pod fails the ADD with 105 and its reason, and leaves nothing: device home, no link, no record",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await kubeNode(2);
    const faults = await IpFaults.install(node);
    const pod = await node.vpc.pod("policy");
    const before = (await node.client.status()).pool;
    // The policy's rules, in the pod's one process that runs before its ip batch: both the
    // first try and the one after clearing an earlier ADD's rules fail.
    await faults.fail("pod", "rule\\sadd\\spref\\s0\\sto\\s", 2);
    const out = await node.cni("ADD", node.podCall(pod, { config: kubeConf(node) }));
    assert(await faults.fired(), "the rule's ip ran in the pod");
    await faults.uninstall();
    assertEquals(out.code, 1);
    assertEquals(out.json?.code, 105, out.stdout);
    assertStringIncludes(String(out.json?.msg), "Cannot set the host link's policy");
    assertStringIncludes(String(out.json?.msg), "Cannot add the IPv4 rules pref 0 to");
    assertEquals((await node.client.status()).pool, before);
    assertEquals((await node.client.attachments()).length, 0);
    assertEquals(await nodeEnds(node.vpc), []);
    const links = await node.vpc.exec(pod, [IP, "-o", "link", "show"]);
    assertEquals(links.stdout.trim().split("\n").length, 1, links.stdout);
    // The same pod's next ADD, with nothing injected, works.
    const res = await node.add(pod, { config: kubeConf(node) });
    assertEquals(res.interfaces.length, 3);
    await node.del(pod, { config: kubeConf(node) });
  },
});

Deno.test({
  name:
    "an agent killed in the middle of an ADD, after the link was made, leaves no link once it is back; GC removes a stray node end",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await kubeNode(2);
    const faults = await IpFaults.install(node);
    const pod = await node.vpc.pod("killed");
    // The pod-side batch configures the link: the node side made it already.
    await faults.pause("pod", "neigh\\sreplace\\s169\\.254\\.1\\.1");
    const adding = node.cni("ADD", node.podCall(pod, { config: kubeConf(node) }));
    await faults.hit();
    assertEquals((await nodeEnds(node.vpc)).length, 1);
    await node.stopAgent("SIGKILL");
    await faults.go();
    const out = await adding;
    assert(out.code !== 0, "the ADD did not succeed");
    await faults.uninstall();
    await node.startAgent();
    assertEquals(await nodeEnds(node.vpc), []);
    assertEquals((await node.client.attachments()).length, 0);
    const links = await node.vpc.exec(pod, [IP, "-o", "link", "show"]);
    assertMatch(links.stdout.trim(), /^1: lo/);
    assertEquals(links.stdout.trim().split("\n").length, 1, links.stdout);
    // A node end nobody records (another agent's leftovers, say): GC removes it.
    await node.vpc.exec(node.vpc.node, [IP, ...strayNodeEndArgs("enimhdeadbeef01", "enimhstray0")]);
    const gc = await node.enim(["gc"]);
    assertEquals(gc.code, 0, gc.stdout + gc.stderr);
    assertEquals(await nodeEnds(node.vpc), []);
  },
});

Deno.test({
  name:
    "an ADD replaces what an earlier node end of its name left on the node (its IPv4 and IPv6 rules, the link too), and the pod works",
  ignore: DEPS.skip !== null,
  async fn(t) {
    // One ENI: each ADD of the container gets the same address, so what an earlier node
    // end of its name left is exactly what the ADD adds (an agent killed after the rules).
    await using node = await kubeNode(1);
    await using servers = new Servers();
    const { vpc } = node;
    const N = { v4: node.nic!.ipv4!, v6: node.nic!.ipv6! };
    const containerId = "c-leftover";
    const name = nodeIfNameFor("enimh", { containerId, ifName: "eth0" });
    const rules = async (fam: "-4" | "-6") =>
      (await vpc.exec(vpc.node, [IP, fam, "rule", "show", "iif", name])).stdout.trim()
        .split("\n").filter((l) => l.trim()).map((l) => l.trim().replace(/\s+/g, " "));
    const pod = await strictPod(vpc, "left");
    const call = () => node.podCall(pod, { containerId, config: kubeConf(node) });
    const first = await node.add(pod, { containerId, config: kubeConf(node) });
    const want = { "-4": await rules("-4"), "-6": await rules("-6") };
    assertEquals([want["-4"].length, want["-6"].length], [2, 2], JSON.stringify(want));
    const del = await node.cni("DEL", call());
    assertEquals(del.code, 0, del.stdout + del.stderr);
    // The DEL answers before the device's move home, which removes the link and its rules.
    const gone = async () =>
      (await nodeEnds(vpc)).length === 0 && (await rules("-4")).length === 0 &&
        (await rules("-6")).length === 0 || null;
    assert(
      await poll(gone, { timeoutMs: 5_000, intervalMs: 20 }),
      "DEL removed the link and rules",
    );
    for (const leftover of ["rules", "link and rules"]) {
      await t.step(`${leftover} of the name`, async () => {
        for (const fam of ["-4", "-6"] as const) {
          for (const line of want[fam]) {
            const [pref, ...rest] = line.split(" ");
            const out = await vpc.exec(vpc.node, [
              IP,
              fam,
              "rule",
              "add",
              "pref",
              pref.replace(":", ""),
              ...rest,
            ]);
            assertEquals(out.code, 0, out.stderr);
          }
        }
        if (leftover !== "rules") {
          await vpc.exec(vpc.node, [IP, ...strayNodeEndArgs(name, "enimhstray1")]);
          assertEquals(await nodeEnds(vpc), [name]);
        }
        const r = await node.add(pod, { containerId, config: kubeConf(node) });
        assertEquals(r.ips, first.ips, "the same address as the first ADD");
        assertEquals(await nodeEnds(vpc), [name]);
        assertEquals(await rules("-4"), want["-4"]);
        assertEquals(await rules("-6"), want["-6"]);
        const A = { v4: addrOf(r, 4), v6: addrOf(r, 6) };
        await servers.start(pod, "p", [{ proto: "tcp", port: 9090 + leftover.length }]);
        assertEquals(who(await ask(vpc.node, "tcp", A.v4, 9090 + leftover.length)), `p ${N.v4}`);
        assertEquals(who(await ask(vpc.node, "tcp", A.v6, 9090 + leftover.length)), `p ${N.v6}`);
        const again = await node.cni("DEL", call());
        assertEquals(again.code, 0, again.stdout + again.stderr);
        assert(
          await poll(gone, { timeoutMs: 5_000, intervalMs: 20 }),
          "DEL removed the link and rules",
        );
      });
    }
  },
});
