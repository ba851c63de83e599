/**
 * A pod keeps its own identity on every path (issue 34), on the real kernel: two
 * simulated nodes on one VPC, each with its own agent on the mock provider (their own
 * MACs and subnets), the real kube-proxy on the client's node (tests/support/k8s/service_proxy.ts:
 * its rules written by hand without Go or with `ENIM_KUBE_PROXY=rules`),
 * strict reverse-path filtering in the nodes and the pods, and a VPC that checks every
 * port's source and enforces every port's security groups as a cloud does.
 *
 * - A Service whose endpoint is an enim pod on the other node: the backend sees the
 *   client pod's own address (IPv4, IPv6, TCP, UDP, iptables and nftables modes).
 * - Two paths, one 5-tuple: from one source port, a flow to a ClusterIP and a direct
 *   flow to the same backend, in either order: both get their answers.
 * - Security groups: a `db` pod that admits only `g-web` on TCP 5432 is reached by a
 *   `web` pod through a ClusterIP from the other node, not by an `api` pod; with the old
 *   design (the node masquerades the pod's Service traffic out of its own NIC) the same
 *   call arrives as the node (`g-node`) and is refused.
 * - CHECK names a pod-side rule that went missing.
 *
 * @module
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { type AddResult, SimulatedNode } from "./support/node.ts";
import type { NetnsHandle, SimulatedVpc } from "./support/vpc.ts";
import { ask, lastError, Servers, TRAFFIC_NEEDS, who } from "./support/traffic.ts";
import { KUBE_PROXY_NEEDS, type ProxyMode, type ServicePort } from "./support/kube_proxy.ts";
import { startServiceProxy } from "./support/k8s/service_proxy.ts";
import { clientDeps } from "./support/clients.ts";
import { nodeTableRuleset } from "../netns/host_link.ts";
import { groupMark } from "../netns/sim.ts";
import { poll } from "../lib/async.ts";

const DEPS = await clientDeps("pod_identity_test", [...TRAFFIC_NEEDS, ...KUBE_PROXY_NEEDS]);

const IP = "/usr/sbin/ip";
const NFT = "/usr/sbin/nft";
const SERVICE_CIDRS = { ipv4: "172.30.0.0/16", ipv6: "fd00:30::/108" };
const CIDRS = [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6];
const STRICT = { "net/ipv4/conf/all/rp_filter": "1", "net/ipv4/conf/default/rp_filter": "1" };
/** A machine of the VPC in a subnet of its own (outside both nodes). */
const OTHER_SUBNETS = { ipv4: "10.98.0.0/24", ipv6: "fd00:98::/64" };
/** Node B's default profile: its own subnets (node A's is the VPC's, 10.99.0.0/24). */
const NODE_B_SUBNETS = { ipv4: "10.97.0.0/24", ipv6: "fd00:97::/64" };
/** The simulated cloud's only enforced group: `g-db` admits `g-web` on TCP 5432. */
const GROUP_RULES = [{ group: "g-db", from: "g-web", protocol: "tcp", port: 5432 }];

/** Node A (the client's, the VPC's maker) and node B, which joined its VPC. */
interface Cluster extends AsyncDisposable {
  a: SimulatedNode;
  b: SimulatedNode;
  vpc: SimulatedVpc;
}

/**
 * Two nodes on one VPC, each with its NIC (`g-node`), strict rp_filter, and the same
 * security group rules; node B's mock has its own MACs, ids and subnets, so the two
 * simulated clouds never hand out the same MAC or address.
 */
async function cluster(): Promise<Cluster> {
  const a = await SimulatedNode.start({
    nodeNic: { groups: ["g-node"] },
    extraSubnets: [OTHER_SUBNETS.ipv4, OTHER_SUBNETS.ipv6],
    profiles: {
      web: {
        subnets: { ipv4: "10.95.0.0/24", ipv6: "fd00:95::/64" },
        enis: 2,
        securityGroupIds: ["g-web"],
      },
      api: {
        subnets: { ipv4: "10.94.0.0/24", ipv6: "fd00:94::/64" },
        enis: 2,
        securityGroupIds: ["g-api"],
        allowedSecurityGroupIds: ["g-web"],
      },
    },
    mock: { enis: 4, securityGroupRules: GROUP_RULES },
    // No table check: the old-design step loads an old node table over enim's, which the
    // check would find changed and load again.
    extra: { hostLink: { tableCheckSeconds: 0 } },
  });
  let b: SimulatedNode;
  try {
    b = await SimulatedNode.start({
      joinVpc: a.vpc,
      nodeNic: { groups: ["g-node"] },
      subnets: NODE_B_SUBNETS,
      profiles: {
        db: {
          subnets: { ipv4: "10.93.0.0/24", ipv6: "fd00:93::/64" },
          enis: 2,
          securityGroupIds: ["g-db"],
        },
      },
      mock: {
        enis: 4,
        macPrefix: "02:e1:0b",
        idPrefix: "eni-mockb-",
        securityGroupRules: GROUP_RULES,
      },
    });
  } catch (err) {
    await a.close();
    throw err;
  }
  const close = async () => {
    // The joined node first: the VPC namespace goes with node A.
    try {
      await b.close();
    } finally {
      await a.close();
    }
  };
  try {
    await a.vpc.sysctl(a.vpc.node, STRICT);
    await b.vpc.sysctl(b.vpc.node, STRICT);
  } catch (err) {
    await close();
    throw err;
  }
  return { a, b, vpc: a.vpc, [Symbol.asyncDispose]: close };
}

/** The network config of a Kubernetes node's pods. */
function kubeConf(node: SimulatedNode) {
  return node.netconf("1.1.0", { serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6] });
}

/** A pod namespace of `node` with strict rp_filter, ADDed (in `profile`, with inline `groups`). */
async function kubePod(
  node: SimulatedNode,
  name: string,
  o: { profile?: string; groups?: string[] } = {},
): Promise<{ ns: NetnsHandle; res: AddResult; v4: string; v6: string }> {
  const ns = await node.vpc.pod(name);
  await node.vpc.sysctl(ns, STRICT);
  const extra = [
    ...(o.profile ? [`ENIM_PROFILE=${o.profile}`] : []),
    ...(o.groups ? [`ENIM_SECURITY_GROUP_IDS=${o.groups.join(",")}`] : []),
  ];
  const res = await node.add(ns, {
    config: kubeConf(node),
    args: [`K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1`, ...extra].join(";"),
  });
  const addr = (fam: 4 | 6) =>
    res.ips.map((i) => i.address.split("/")[0]).find((x) => x.includes(":") === (fam === 6))!;
  return { ns, res, v4: addr(4), v6: addr(6) };
}

/** kube-proxy's options for node A, per family. */
function proxyOpts(a: SimulatedNode) {
  return [
    { family: 4 as const, serviceCidr: SERVICE_CIDRS.ipv4, nodeIPs: [a.nic!.ipv4!] },
    { family: 6 as const, serviceCidr: SERVICE_CIDRS.ipv6, nodeIPs: [a.nic!.ipv6!] },
  ];
}

/** One Service port per family: `name`/`portName` at `clusterIP` → the backend's `target`. */
function service(
  name: string,
  n: number,
  portName: string,
  protocol: "tcp" | "udp",
  port: number,
  backend: { v4: string; v6: string },
  target: number,
): ServicePort[] {
  return ([[`172.30.0.${n}`, backend.v4], [`fd00:30::${n}`, backend.v6]] as const).map((
    [clusterIP, ip],
  ) => ({
    namespace: "test",
    name,
    portName,
    protocol,
    clusterIP,
    port,
    endpoints: [{ ip, port: target }],
  }));
}

/** TCP port 80 → 8080 ("http") and UDP port 53 → 5353 ("dns") of a backend. */
function webAndDns(name: string, n: number, backend: { v4: string; v6: string }) {
  return [
    ...service(name, n, "http", "tcp", 80, backend, 8080),
    ...service(name, n, "dns", "udp", 53, backend, 5353),
  ];
}

const clusterIp = (n: number, fam: 4 | 6) => fam === 4 ? `172.30.0.${n}` : `fd00:30::${n}`;

/** The listeners of a backend of {@linkcode webAndDns}. */
const WEB_AND_DNS = [{ proto: "tcp" as const, port: 8080 }, { proto: "udp" as const, port: 5353 }];

Deno.test({
  name:
    "an enim pod's Service call to an enim pod on another node reaches it with the client pod's own address, over TCP and UDP, IPv4 and IPv6, under kube-proxy's iptables and nftables rules",
  ignore: DEPS.skip !== null,
  async fn(t) {
    await using c = await cluster();
    await using proxy = await startServiceProxy({ serviceCidrs: CIDRS });
    await using servers = new Servers();
    try {
      const client = await kubePod(c.a, "a");
      const backend = await kubePod(c.b, "c");
      await servers.start(backend.ns, "c", WEB_AND_DNS);
      const svcs = webAndDns("svc-c", 20, backend);
      for (const mode of ["iptables", "nftables"] as ProxyMode[]) {
        await proxy.install(c.a, mode, svcs, proxyOpts(c.a));
        for (const fam of [4, 6] as const) {
          const own = fam === 4 ? client.v4 : client.v6;
          for (const [proto, port] of [["tcp", 80], ["udp", 53]] as const) {
            await t.step(`${mode}: IPv${fam} ${proto} to ${clusterIp(20, fam)}`, async () => {
              assertEquals(
                who(await ask(client.ns, proto, clusterIp(20, fam), port)),
                `c ${own}`,
                lastError,
              );
            });
          }
        }
      }
      await t.step("the VPC dropped nothing: no source check, no security group", async () => {
        assertEquals(await c.vpc.sourceCheckDrops(), 0);
        assertEquals(await c.vpc.securityGroupDrops(), 0);
      });
    } catch (err) {
      console.error(await c.a.agentLog(), await c.b.agentLog());
      throw err;
    }
  },
});

/** One trial's outcome: what each flow's client read. */
interface Trial {
  sourcePort: number;
  first: string;
  second: string;
}

/** Where the backend of a two-paths case is. */
type Place = "local" | "remote";

/** How many times each order of each case runs (the kernel's state involved lives on). */
const TRIALS = 5;

/**
 * Issue 34's "two paths, one 5-tuple": for each case, a pod's flow to a ClusterIP and its
 * direct flow to the same backend from one source port (a fresh port per trial), in
 * either order, {@linkcode TRIALS} times; both must get their answers. `local`: an enim
 * pod on the client's node; `remote`: an enim pod on node B.
 */
async function twoPaths(t: Deno.TestContext, cases: [Place, "tcp" | "udp"][]): Promise<void> {
  await using c = await cluster();
  await using proxy = await startServiceProxy({ serviceCidrs: CIDRS });
  await using servers = new Servers();
  try {
    const client = await kubePod(c.a, "a");
    const local = await kubePod(c.a, "b");
    const remote = await kubePod(c.b, "c");
    await servers.start(local.ns, "b", WEB_AND_DNS);
    await servers.start(remote.ns, "c", WEB_AND_DNS);
    await proxy.install(c.a, "iptables", [
      ...webAndDns("svc-b", 20, local),
      ...webAndDns("svc-c", 21, remote),
    ], proxyOpts(c.a));
    const backends = {
      local: { label: "on the client's node", n: 20, name: "b", pod: local },
      remote: { label: "on another node", n: 21, name: "c", pod: remote },
    };
    let nextPort = 20000 + Math.floor(Math.random() * 20000);
    for (const [where, proto] of cases) {
      const { label, n, name, pod } = backends[where];
      const [port, target] = proto === "tcp" ? [80, 8080] : [53, 5353];
      for (const fam of [4, 6] as const) {
        const own = fam === 4 ? client.v4 : client.v6;
        const direct = fam === 4 ? pod.v4 : pod.v6;
        const flows = {
          service: (sourcePort: number) =>
            ask(client.ns, proto, clusterIp(n, fam), port, { sourcePort }),
          direct: (sourcePort: number) => ask(client.ns, proto, direct, target, { sourcePort }),
        };
        for (const order of [["service", "direct"], ["direct", "service"]] as const) {
          await t.step(
            `backend ${label}, IPv${fam} ${proto}: ${order[0]} then ${order[1]}, ${TRIALS} times`,
            async () => {
              const trials: Trial[] = [];
              for (let i = 0; i < TRIALS; i++) {
                const sourcePort = nextPort++;
                const first = who(await flows[order[0]](sourcePort));
                const second = who(await flows[order[1]](sourcePort));
                trials.push({ sourcePort, first, second });
              }
              const want = `${name} ${own}`;
              const bad = trials.filter((x) => x.first !== want || x.second !== want);
              assertEquals(
                bad,
                [],
                `${bad.length} of ${TRIALS} trials lost an answer (want "${want}" twice): ${
                  JSON.stringify(bad)
                }`,
              );
            },
          );
        }
      }
    }
    await t.step("the VPC dropped nothing", async () => {
      assertEquals(await c.vpc.sourceCheckDrops(), 0);
      assertEquals(await c.vpc.securityGroupDrops(), 0);
    });
  } catch (err) {
    console.error(await c.a.agentLog(), await c.b.agentLog());
    throw err;
  }
}

Deno.test({
  name:
    "a pod's Service flow and its direct flow to the same backend, from one source port, both get their answers in either order: TCP and UDP to a backend on another node, TCP to one on the pod's node",
  ignore: DEPS.skip !== null,
  fn: (t) => twoPaths(t, [["remote", "tcp"], ["remote", "udp"], ["local", "tcp"]]),
});

/**
 * The case that needs the pod's Service ports: the node hands the Service flow straight to
 * the backend's node end, so without them the backend pod would receive both flows with
 * one 5-tuple — one through its host link, one through its ENI — hold them as one
 * conntrack entry and answer the second flow the first flow's way (seen: 5 of 5 trials
 * lost, each order, IPv4 and IPv6). What a pod opens through its pod end leaves from a
 * port of `SERVICE_PORTS` (netns/host_link.ts), outside the ephemeral range.
 */
Deno.test({
  name:
    "a pod's Service flow and its direct flow over UDP to an enim pod on the pod's node, from one source port, both get their answers in either order",
  ignore: DEPS.skip !== null,
  fn: (t) => twoPaths(t, [["local", "udp"]]),
});

/** The addresses of `group`'s members in the VPC's security group table (IPv4 and IPv6). */
async function membersOf(vpc: SimulatedVpc, group: string): Promise<string[]> {
  const out: string[] = [];
  for (const set of ["member4", "member6"]) {
    const r = await vpc.exec(vpc.vpc, [
      NFT,
      "-j",
      "list",
      "set",
      "bridge",
      "vpc_security_groups",
      set,
    ]);
    assertEquals(r.code, 0, r.stderr);
    const text = JSON.stringify(JSON.parse(r.stdout));
    for (const m of text.matchAll(/"concat":\["([^"]+)",(\d+)\]/g)) {
      if (Number(m[2]) === groupMark(group)) out.push(m[1]);
    }
  }
  return out;
}

Deno.test({
  name:
    "the VPC's security groups see a pod's own identity: db admits web's Service call from another node and refuses api's; with the node's old masquerade the same call arrives as the node and is refused",
  ignore: DEPS.skip !== null,
  async fn(t) {
    await using c = await cluster();
    await using proxy = await startServiceProxy({ serviceCidrs: CIDRS });
    await using servers = new Servers();
    try {
      const { vpc } = c;
      const web = await kubePod(c.a, "web", { profile: "web" });
      const api = await kubePod(c.a, "api", { profile: "api" });
      const db = await kubePod(c.b, "db", { profile: "db" });
      // A VPC machine in an open group: the control that the old design does reach a backend.
      const r = await vpc.host("r", 50, OTHER_SUBNETS, { groups: ["g-mockdefault"] });
      await servers.start(db.ns, "db", [{ proto: "tcp", port: 5432 }]);
      await servers.start(r.ns, "r", [{ proto: "tcp", port: 8080 }]);
      await proxy.install(c.a, "nftables", [
        ...service("svc-db", 30, "pg", "tcp", 5432, db, 5432),
        ...service("svc-r", 31, "http", "tcp", 80, { v4: r.ipv4!, v6: r.ipv6! }, 8080),
      ], proxyOpts(c.a));
      await t.step("each ENI's port carries its profile's group", async () => {
        // Every ENI of a profile (the pod's and the idle one) has the profile's groups.
        for (const [pod, group] of [[web, "g-web"], [db, "g-db"], [api, "g-api"]] as const) {
          const members = await membersOf(vpc, group);
          assertEquals(members.length, 4, `${group}: two ENIs, two families each`);
          assert(members.includes(pod.v4) && members.includes(pod.v6), group);
        }
        assertEquals((await membersOf(vpc, "g-node")).length, 4, "both nodes' NICs, two families");
      });
      await t.step("web reaches db through its ClusterIP and directly, IPv4 and IPv6", async () => {
        for (const fam of [4, 6] as const) {
          const own = fam === 4 ? web.v4 : web.v6;
          assertEquals(
            who(await ask(web.ns, "tcp", clusterIp(30, fam), 5432)),
            `db ${own}`,
            lastError,
          );
          const direct = fam === 4 ? db.v4 : db.v6;
          assertEquals(who(await ask(web.ns, "tcp", direct, 5432)), `db ${own}`, lastError);
        }
        assertEquals(await vpc.securityGroupDrops(), 0);
      });
      await t.step("api is refused by db's group, through the ClusterIP and directly", async () => {
        assertEquals(await ask(api.ns, "tcp", clusterIp(30, 4), 5432), "");
        const afterService = await vpc.securityGroupDrops();
        assert(afterService > 0, "db's group dropped api's Service call");
        assertEquals(await ask(api.ns, "tcp", db.v6, 5432), "");
        assert(await vpc.securityGroupDrops() > afterService, "and its direct call");
      });
      await t.step(
        "a pod with g-web inline is admitted; its ENI gets g-api back after DEL",
        async () => {
          const inline = await kubePod(c.a, "inline", { profile: "api", groups: ["g-web"] });
          assert((await membersOf(vpc, "g-web")).includes(inline.v4));
          assertEquals(
            who(await ask(inline.ns, "tcp", clusterIp(30, 4), 5432)),
            `db ${inline.v4}`,
            lastError,
          );
          await c.a.del(inline.ns, {
            config: kubeConf(c.a),
            args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=inline;IgnoreUnknown=1",
          });
          // The agent answers DEL before it frees the ENI: wait for the cloud's groups.
          assertEquals(
            await poll(
              async () =>
                (!(await membersOf(vpc, "g-web")).includes(inline.v4) &&
                  (await membersOf(vpc, "g-api")).includes(inline.v4)) || null,
              { timeoutMs: 5000, intervalMs: 50 },
            ),
            true,
          );
        },
      );
      assertEquals(await vpc.sourceCheckDrops(), 0, "nothing of a pod left a node's NIC");
      await t.step(
        "with the old design (the node masquerades web's Service traffic out of its NIC), db refuses web",
        async () => {
          const nodeEnd = web.res.interfaces[1].name;
          const node = c.a.vpc.node;
          // The node table of an enim before issue 34 for web's node end, and web's node rules gone.
          const load = await c.a.vpc.exec(node, [
            "/bin/sh",
            "-c",
            `printf %s "$1" | ${NFT} -f -`,
            "sh",
            nodeTableRuleset([nodeEnd]),
          ]);
          assertEquals(load.code, 0, load.stderr);
          for (const fam of ["-4", "-6"]) {
            for (const pref of ["1500", "1501"]) {
              const del = await c.a.vpc.exec(node, [
                IP,
                fam,
                "rule",
                "del",
                "pref",
                pref,
                "iif",
                nodeEnd,
              ]);
              assertEquals(del.code, 0, `${fam} pref ${pref}: ${del.stderr}`);
            }
          }
          const before = await vpc.securityGroupDrops();
          // The control: an open backend answers, and sees the node's address.
          assertEquals(
            who(await ask(web.ns, "tcp", clusterIp(31, 4), 80)),
            `r ${c.a.nic!.ipv4}`,
            lastError,
          );
          assertEquals(await ask(web.ns, "tcp", clusterIp(30, 4), 5432), "");
          assert(await vpc.securityGroupDrops() > before, "db's group dropped the node's call");
          // The NIC sent only its own address: the source check still dropped nothing.
          assertEquals(await vpc.sourceCheckDrops(), 0);
        },
      );
    } catch (err) {
      console.error(await c.a.agentLog(), await c.b.agentLog());
      throw err;
    }
  },
});

Deno.test({
  name:
    "CHECK fails with 106 naming the pod's missing return rule, pref 0 to the pod's address lookup 2000, IPv4 and IPv6",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await SimulatedNode.start({ nodeNic: true, mock: { enis: 2 } });
    const pod = await kubePod(node, "chk");
    const call = node.podCall(pod.ns, {
      args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=chk;IgnoreUnknown=1",
      config: { ...kubeConf(node), prevResult: pod.res },
    });
    const ok = await node.cni("CHECK", call);
    assertEquals(ok.code, 0, ok.stdout);
    const exec = (argv: string[]) => node.vpc.exec(pod.ns, [IP, ...argv]);
    const ret = (fam: "-4" | "-6", op: string, addr: string) =>
      exec([fam, "rule", op, "pref", "0", "to", addr, "fwmark", "0x2000/0x2000", "lookup", "2000"]);
    const del4 = await ret("-4", "del", pod.v4);
    assertEquals(del4.code, 0, del4.stderr);
    const bad4 = await node.cni("CHECK", call);
    assertEquals(bad4.code, 1);
    assertEquals(bad4.json?.code, 106, bad4.stdout);
    assertStringIncludes(String(bad4.json?.msg), `pref 0 to ${pod.v4} lookup 2000`);
    // The rule back as enim writes it (return mark 0x2000), then the IPv6 one gone.
    const add4 = await ret("-4", "add", pod.v4);
    assertEquals(add4.code, 0, add4.stderr);
    assertEquals((await node.cni("CHECK", call)).code, 0);
    const del6 = await ret("-6", "del", pod.v6);
    assertEquals(del6.code, 0, del6.stderr);
    const bad6 = await node.cni("CHECK", call);
    assertEquals(bad6.json?.code, 106, bad6.stdout);
    assertStringIncludes(String(bad6.json?.msg), `pref 0 to ${pod.v6} lookup 2000`);
    await node.del(pod.ns, {
      config: kubeConf(node),
      args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=chk;IgnoreUnknown=1",
    });
  },
});
