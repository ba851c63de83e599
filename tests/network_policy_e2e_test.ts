/**
 * Kubernetes NetworkPolicy for enim pods, end to end on the real kernel (issue 35): a
 * simulated node whose agent (the shipped bundle, the production permission set) reads
 * the test API server (tests/support/kube_apiserver.ts, built from the published API);
 * three namespaces of three pods each, created as kubelet creates them; the reachability
 * matrix over TCP and UDP between the nine pods for each policy case, against the matrix
 * the case writes by hand (the API's meaning, not enim's compiler); then changes while
 * the pods keep running.
 *
 * @module
 */
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS, who } from "./support/traffic.ts";
import { KUBE_PROXY_NEEDS, type ProxyMode, type ServicePort } from "./support/kube_proxy.ts";
import { type ClusterPod, PolicyCluster, SERVICE_CIDRS } from "./support/policy_cluster.ts";
import { passed, type Probe, type Prober } from "./support/prober.ts";
import { assertMatrix, cellText, matrixCells, probeBySource } from "./support/policy_matrix.ts";
import type { SimulatedNode } from "./support/node.ts";
import { PodPolicyViewSchema } from "../api/schema.ts";
import { RealApi, realApiWanted } from "./support/k8s/policy_api.ts";
import { kubeProxyOn } from "./support/policy_kube_proxy.ts";
import {
  APPS,
  CASES,
  DB,
  type End,
  type Expect,
  NAMESPACES,
  NEWER_SERVER,
  WEB,
} from "./support/policy_cases.ts";

const DEPS = await clientDeps("network_policy_e2e_test", [...TRAFFIC_NEEDS, ...KUBE_PROXY_NEEDS]);

/**
 * The API server of these tests: the real control plane (kube-apiserver, etcd, the
 * controller-manager; the agents authenticated as the shipped RBAC's ServiceAccount) when
 * Go is here to build it, else the test API server.
 */
const API = realApiWanted();
console.error(
  `network_policy_e2e_test: on ${
    API.real ? "the real kube-apiserver" : "the test API server"
  } (${API.why})`,
);

/** A cluster on {@linkcode API}. */
async function startCluster(): Promise<PolicyCluster> {
  return await PolicyCluster.start(
    API.real
      ? await RealApi.start({ serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6] })
      : undefined,
  );
}

/** The pods by id. */
type Pods = Record<string, ClusterPod>;

const ends = (c: PolicyCluster): End[] =>
  [...c.pods.values()].map((p) => ({
    id: p.id,
    ns: p.namespace,
    app: p.name,
    tier: p.labels.tier,
    v4: p.v4,
    v6: p.v6,
  }));

/**
 * The whole matrix (every pod to every pod, itself included, on every port of the pods,
 * IPv4 and with `ipv6` IPv6) against `expect` (tests/support/policy_matrix.ts), each
 * source's probes all at once; an answer that got through came from the right pod, which
 * saw the client's own address. Returns how many cells were probed.
 */
async function checkMatrix(c: PolicyCluster, expect: Expect, ipv6 = false): Promise<number> {
  const cells = matrixCells(ends(c), ipv6 ? [4, 6] : [4]);
  const { first } = await assertMatrix(
    cells,
    expect,
    (cells, timeoutMs) => probeBySource(cells, timeoutMs, (s) => c.pods.get(s.id)!.prober),
  );
  for (const { cell, result } of first) {
    if (!result.startsWith("open ")) continue;
    const own = cell.fam === 4 ? cell.s.v4 : cell.s.v6;
    assertEquals(who(result.slice(5)), `${cell.d.id} ${own}`, cellText(cell));
  }
  return cells.length;
}

/** The policies in place now (namespace, name). */
let current: [string, string][] = [];

/** Replaces the policies in place with `policies` and waits until the agents enforce them. */
async function setPolicies(c: PolicyCluster, policies: [string, string, unknown][]) {
  for (const [ns, name] of current) c.remove("networkpolicies", ns, name);
  current = [];
  for (const [namespace, name, spec] of policies) {
    c.put("networkpolicies", { metadata: { namespace, name }, spec });
    current.push([namespace, name]);
  }
  await c.settle();
}

const podsOf = (c: PolicyCluster): Pods => Object.fromEntries(c.pods);

/** CRC32c (Castagnoli, reflected), SCTP's checksum. */
function crc32c(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const b of bytes) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

/** An SCTP INIT packet (common header and INIT chunk) to `port`, its checksum set. */
function sctpInit(port: number): Uint8Array {
  const b = new Uint8Array(32);
  const v = new DataView(b.buffer);
  v.setUint16(0, 40000 + Math.floor(Math.random() * 20000));
  v.setUint16(2, port);
  // verification tag 0, checksum 0 for now; the INIT chunk:
  v.setUint8(12, 1);
  v.setUint16(14, 20);
  v.setUint32(16, 0x12345678); // initiate tag
  v.setUint32(20, 65536); // a_rwnd
  v.setUint16(24, 10); // outbound streams
  v.setUint16(26, 10); // inbound streams
  v.setUint32(28, 1); // initial TSN
  v.setUint32(8, crc32c(b), true);
  return b;
}

/**
 * Sends SCTP INITs from `from` to `addr` on each of `ports` (raw IP protocol 132 with
 * socat: this kernel has no SCTP sockets, its netfilter still parses SCTP).
 */
async function sendSctp(c: PolicyCluster, from: ClusterPod, addr: string, ports: number[]) {
  for (const port of ports) {
    const child = new Deno.Command("/usr/sbin/ip", {
      args: ["netns", "exec", from.ns.name, "/usr/bin/socat", "-u", "-", `IP4-SENDTO:${addr}:132`],
      stdin: "piped",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const w = child.stdin.getWriter();
    await w.write(sctpInit(port));
    await w.close();
    const out = await child.output();
    assertEquals(out.code, 0, new TextDecoder().decode(out.stderr));
  }
  void c;
}

/** Counts, in `to`'s namespace, the SCTP packets to each port its policy let in. */
async function sctpCounters(to: ClusterPod, ports: number[]): Promise<() => Promise<number[]>> {
  const table = [
    "table inet probe_sctp {",
    ...ports.map((p) => `\tcounter to_${p} { }`),
    "\tchain input {",
    "\t\ttype filter hook input priority 10; policy accept;",
    ...ports.map((p) => `\t\tsctp dport ${p} counter name to_${p}`),
    "\t}",
    "}",
  ].join("\n");
  const load = await to.node.vpc.exec(to.ns, [
    "/bin/sh",
    "-c",
    'printf %s "$1" | /usr/sbin/nft -f -',
    "sh",
    table,
  ]);
  assertEquals(load.code, 0, load.stderr);
  return async () => {
    const r = await to.node.vpc.exec(to.ns, [
      "/usr/sbin/nft",
      "-j",
      "list",
      "counters",
      "table",
      "inet",
      "probe_sctp",
    ]);
    const text = JSON.stringify(JSON.parse(r.stdout));
    return ports.map((p) =>
      Number(new RegExp(`"name":"to_${p}"[^}]*"packets":(\\d+)`).exec(text)?.[1] ?? NaN)
    );
  };
}

/**
 * Label changes (a pod's, a namespace's), a pod's new address and a policy's deletion,
 * while an allowed flow runs all along and must never be dropped.
 */
async function changesWhileTrafficRuns(t: Deno.TestContext, c: PolicyCluster, a: SimulatedNode) {
  const P = podsOf(c);
  const db = P["alpha/db"];
  await setPolicies(c, [["alpha", "db", {
    podSelector: DB,
    ingress: [{
      from: [{ podSelector: WEB }, { namespaceSelector: { matchLabels: { access: "db" } } }],
      ports: [{ port: 5432 }],
    }],
  }]]);
  const reach = async (from: ClusterPod) =>
    passed((await from.prober.probe([{ proto: "tcp", addr: db.v4, port: 5432 }], 2_000))[0]);
  let stop = false;
  let rounds = 0;
  const failures: string[] = [];
  const traffic = (async () => {
    while (!stop) {
      const [r] = await P["alpha/web"].prober.probe(
        [{ proto: "tcp", addr: db.v4, port: 5432 }],
        2_000,
      );
      rounds++;
      if (!r.startsWith("open alpha/db")) failures.push(r);
      await new Promise((ok) => setTimeout(ok, 20));
    }
  })();
  try {
    await t.step("a pod's label change lets it in, and its change back keeps it out", async () => {
      assertEquals(await reach(P["alpha/job"]), false);
      c.relabel(P["alpha/job"], { app: "web" });
      await c.settle();
      assertEquals(await reach(P["alpha/job"]), true);
      c.relabel(P["alpha/job"], { app: "job" });
      await c.settle();
      assertEquals(await reach(P["alpha/job"]), false);
    });
    await t.step("a namespace's label change lets its pods in", async () => {
      assertEquals(await reach(P["gamma/db"]), false);
      c.namespace("gamma", { ...NAMESPACES.gamma, access: "db" });
      await c.settle();
      assertEquals(await reach(P["gamma/db"]), true);
      assertEquals(await reach(P["beta/db"]), false);
    });
    await t.step(
      "a pod's new address replaces its old one in the sets that select it",
      async () => {
        const old = P["gamma/web"];
        const fresh = await c.sandbox(a, "node-a", "gamma", "web", old.labels, old.ports, "-2");
        await c.del(old);
        await c.settle();
        assert(fresh.v4 !== old.v4, "the new sandbox has a new ENI");
        assertEquals(await reach(fresh), true);
        const r = await a.enim(["policy", "alpha/db", "--json"]);
        assertEquals(r.code, 0, r.stderr);
        const view = PodPolicyViewSchema.parse(JSON.parse(r.stdout));
        const members = view.ingress.rules.flatMap((x) => x.members);
        assert(members.includes(fresh.v4), `${fresh.v4} in ${members}`);
        assert(!members.includes(old.v4), `${old.v4} no longer in ${members}`);
        const text = await a.enim(["policy", "alpha/db"]);
        assertEquals(text.code, 0, text.stderr);
        assert(text.stdout.includes("ingress: isolated"), text.stdout);
        assert(text.stdout.includes("TCP 5432"), text.stdout);
      },
    );
    await t.step("deleting the policy lets everyone in again", async () => {
      assertEquals(await reach(P["beta/web"]), false);
      await setPolicies(c, []);
      assertEquals(await reach(P["beta/web"]), true);
    });
  } finally {
    stop = true;
    await traffic;
  }
  await t.step(`the allowed flow ran ${rounds} times through every change, never dropped`, () => {
    assertEquals(failures, []);
    assert(rounds >= 5, `${rounds} rounds`);
  });
}

/** The cluster of the test: node A with the nine pods. */
async function cluster(): Promise<{ c: PolicyCluster; a: SimulatedNode }> {
  const c = await startCluster();
  try {
    for (const [ns, labels] of Object.entries(NAMESPACES)) c.namespace(ns, labels);
    const a = await c.node("node-a", { nodeNic: true, mock: { enis: 12 } });
    for (const ns of Object.keys(NAMESPACES)) {
      for (const [app, def] of Object.entries(APPS)) {
        await c.pod(a, "node-a", ns, app, def.labels, def.ports(ns));
      }
    }
    await c.settle();
    return { c, a };
  } catch (err) {
    await c.close();
    throw err;
  }
}

Deno.test({
  name:
    "NetworkPolicy: the reachability matrix of nine enim pods over TCP and UDP is what each policy case says",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const { c, a } = await cluster();
    try {
      current = [];
      let probes = 0;
      for (const k of CASES) {
        const ignore = API.real && k.newerServer === true;
        await t.step({
          name: ignore ? `${k.name} (${NEWER_SERVER})` : k.name,
          ignore,
          fn: async () => {
            await setPolicies(
              c,
              typeof k.policies === "function" ? k.policies(podsOf(c)) : k.policies,
            );
            probes += await checkMatrix(c, k.expect, k.ipv6);
          },
        });
      }
      await t.step(`${CASES.length} cases, ${probes} probes in all`, () => {
        assert(CASES.length >= 30);
      });
      const P = podsOf(c);
      await t.step("SCTP: a port item of protocol SCTP admits SCTP to that port only", async () => {
        const counts = await sctpCounters(P["alpha/db"], [7777, 7778]);
        await setPolicies(c, []);
        await sendSctp(c, P["alpha/web"], P["alpha/db"].v4, [7777, 7778]);
        assertEquals(await counts(), [1, 1], "without a policy both get in");
        await setPolicies(c, [["alpha", "db", {
          podSelector: DB,
          ingress: [{ ports: [{ protocol: "SCTP", port: 7777 }] }],
        }]]);
        await sendSctp(c, P["alpha/web"], P["alpha/db"].v4, [7777, 7778]);
        assertEquals(await counts(), [2, 1], "7777 gets in, 7778 is dropped");
        await setPolicies(c, [["alpha", "db", {
          podSelector: DB,
          ingress: [{ ports: [{ protocol: "TCP", port: 7777 }] }],
        }]]);
        await sendSctp(c, P["alpha/web"], P["alpha/db"].v4, [7777]);
        assertEquals(await counts(), [2, 1], "a TCP port admits no SCTP");
      });
      await t.step({
        name:
          "a policy with a protocol enim does not know (FOO) fails closed: its pod admits nothing through it, and status, metrics and log say so",
        ignore: API.real,
        fn: async () => {
          await setPolicies(c, [["alpha", "future", {
            podSelector: DB,
            // Read, the second rule would admit web.
            ingress: [{ ports: [{ protocol: "FOO", port: 5432 }] }, {
              from: [{ podSelector: WEB }],
            }],
          }]]);
          const [toDb, toWeb] = await P["alpha/web"].prober.probe([
            { proto: "tcp", addr: P["alpha/db"].v4, port: 5432 },
            { proto: "tcp", addr: P["alpha/job"].v4, port: 8080 },
          ], 1_000);
          assertEquals(toDb, "timeout", "db admits nothing through the unreadable policy");
          assert(
            toWeb.startsWith("open alpha/job"),
            `a pod it does not select is reached: ${toWeb}`,
          );
          const [udp] = await P["beta/job"].prober.probe([
            { proto: "udp", addr: P["alpha/db"].v4, port: 53 },
          ], 1_000);
          assertEquals(udp, "timeout", "nor over UDP, from another namespace");
          const status = await a.enim(["status"]);
          assertEquals(status.code, 0, status.stderr);
          assertMatch(
            status.stdout,
            /UNREADABLE NetworkPolicy alpha\/future: spec\.ingress\.0\.ports\.0\.protocol: .*"FOO".*; failing closed: pods app=db in alpha isolated for ingress, nothing admitted by it\n/,
          );
          assertMatch(
            await a.client.metrics(),
            /enim_policy_unreadable\{policy="alpha\/future"\} 1/,
          );
          const rv = c.server.get("networkpolicies", "alpha/future")!.metadata.resourceVersion;
          const warned = (await a.agentLog()).split("\n").filter((l) =>
            l.includes("NetworkPolicy: a policy cannot be read") &&
            l.includes(`"resourceVersion":"${rv}"`)
          );
          assertEquals(warned.length, 1, `one warning for this version: ${warned.join("\n")}`);
          await setPolicies(c, []);
          assert(
            !(await a.client.metrics()).includes("enim_policy_unreadable{"),
            "deleted: no longer shown",
          );
        },
      });
      await t.step(
        "the pod's own node is always allowed both ways, even under deny-all",
        async () => {
          await setPolicies(c, [["alpha", "deny", {
            podSelector: {},
            policyTypes: ["Ingress", "Egress"],
          }]]);
          const nodeAddr = a.nic!.ipv4!;
          await c.servers.start(a.vpc.node, "node-a", [{ proto: "tcp", port: 18080 }, {
            proto: "udp",
            port: 18053,
          }]);
          const node = await c.prober(a.vpc.node.name);
          const alpha = [...c.pods.values()].filter((p) => p.namespace === "alpha");
          const toPods = await node.probe(
            alpha.flatMap((p) => [
              { proto: "tcp" as const, addr: p.v4, port: 8080 },
              { proto: "udp" as const, addr: p.v4, port: 53 },
            ]),
            3_000,
          );
          assertEquals(toPods.filter((r) => !passed(r)), [], "the node reaches every alpha pod");
          for (const p of alpha) {
            const r = await p.prober.probe([
              { proto: "tcp", addr: nodeAddr, port: 18080 },
              { proto: "udp", addr: nodeAddr, port: 18053 },
            ], 3_000);
            assertEquals(r.map((x) => x.startsWith("open node-a")), [true, true], p.id);
          }
          // And the deny holds for everything else.
          const other = await P["beta/web"].prober.probe([
            { proto: "tcp", addr: P["alpha/web"].v4, port: 8080 },
          ], 1_000);
          assertEquals(other, ["timeout"]);
        },
      );
      await changesWhileTrafficRuns(t, c, a);
    } catch (err) {
      console.error(await a.agentLog());
      throw err;
    } finally {
      await c.close();
    }
  },
});

/** Node B's default profile: its own subnets (node A's is the VPC's, 10.99.0.0/24). */
const NODE_B_SUBNETS = { ipv4: "10.97.0.0/24", ipv6: "fd00:97::/64" };

/** Probes once, and once more with a longer time when the first differs from `want`. */
async function expectReach(from: ClusterPod, addr: string, port: number, want: boolean) {
  const probe = { proto: "tcp" as const, addr, port };
  let [r] = await from.prober.probe([probe], want ? 2_000 : 1_000);
  if (passed(r) !== want) [r] = await from.prober.probe([probe], 3_000);
  assertEquals(passed(r), want, `${from.id} -> ${addr}:${port}: ${r}`);
  return r;
}

Deno.test({
  name:
    "NetworkPolicy through Services: a backend admitting only web is reached through its ClusterIP by web pods of its node and of another node, by no other pod; a client's egress policy that excludes a backend keeps it from that backend's Service",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const c = await startCluster();
    try {
      c.namespace("alpha", { team: "a" });
      c.namespace("beta", { team: "b" });
      const a = await c.node("node-a", { nodeNic: true, mock: { enis: 6 } });
      const b = await c.node("node-b", {
        joinVpc: a.vpc,
        nodeNic: true,
        subnets: NODE_B_SUBNETS,
        mock: { enis: 4, macPrefix: "02:e1:0b", idPrefix: "eni-mockb-" },
      });
      const db = APPS.db;
      const backend = await c.pod(a, "node-a", "alpha", "db", db.labels, db.ports("alpha"));
      const other = await c.pod(a, "node-a", "beta", "db", db.labels, db.ports("beta"));
      const web = await c.pod(a, "node-a", "alpha", "web", APPS.web.labels, []);
      const job = await c.pod(a, "node-a", "alpha", "job", APPS.job.labels, []);
      const webB = await c.pod(b, "node-b", "alpha", "web-b", APPS.web.labels, []);
      const jobB = await c.pod(b, "node-b", "alpha", "job-b", APPS.job.labels, []);
      const services: ServicePort[] = [
        svc("db", "alpha", "172.30.0.10", backend.v4),
        svc("db", "beta", "172.30.0.11", other.v4),
      ];
      for (const mode of ["iptables", "nftables"] as ProxyMode[]) {
        const proxies = await kubeProxyOn(c, [[a, "node-a"], [b, "node-b"]], mode, services);
        try {
          await t.step(
            `${mode}: without a policy every client reaches both Services (${proxies.what})`,
            async () => {
              for (const p of [web, job, webB, jobB]) {
                assertEquals(
                  who((await expectReach(p, "172.30.0.10", 5432, true)).slice(5)),
                  `alpha/db ${p.v4}`,
                );
                await expectReach(p, "172.30.0.11", 5432, true);
              }
            },
          );
          await setPolicies(c, [["alpha", "db", {
            podSelector: DB,
            ingress: [{ from: [{ podSelector: WEB }], ports: [{ port: 5432 }] }],
          }]]);
          await t.step(
            `${mode}: a backend admitting only web: web reaches it through its ClusterIP from its own node and from another, seen with its own address; job does not`,
            async () => {
              for (const p of [web, webB]) {
                assertEquals(
                  who((await expectReach(p, "172.30.0.10", 5432, true)).slice(5)),
                  `alpha/db ${p.v4}`,
                  p.id,
                );
                await expectReach(p, backend.v4, 5432, true);
              }
              for (const p of [job, jobB]) {
                await expectReach(p, "172.30.0.10", 5432, false);
                await expectReach(p, backend.v4, 5432, false);
                await expectReach(p, "172.30.0.11", 5432, true);
              }
            },
          );
          await setPolicies(c, [["alpha", "web", {
            podSelector: { matchExpressions: [{ key: "app", operator: "In", values: ["web"] }] },
            policyTypes: ["Egress"],
            egress: [{ to: [{ ipBlock: { cidr: "0.0.0.0/0", except: [`${backend.v4}/32`] } }] }],
          }]]);
          await t.step(
            `${mode}: a client's egress policy that excludes a backend keeps it from that backend's Service, on both nodes, and not from another`,
            async () => {
              for (const p of [web, webB]) {
                await expectReach(p, "172.30.0.10", 5432, false);
                await expectReach(p, backend.v4, 5432, false);
                await expectReach(p, "172.30.0.11", 5432, true);
              }
              await expectReach(job, "172.30.0.10", 5432, true);
            },
          );
          await setPolicies(c, []);
        } finally {
          await proxies.stop();
        }
      }
      await t.step("the VPC's source check dropped nothing of a pod", async () => {
        assertEquals(await a.vpc.sourceCheckDrops(), 0);
      });
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      current = [];
      await c.close();
    }
  },
});

/** A ClusterIP Service of one TCP port 5432 → the backend's 5432. */
function svc(name: string, namespace: string, clusterIP: string, ip: string): ServicePort {
  return {
    namespace,
    name,
    portName: "pg",
    protocol: "tcp",
    clusterIP,
    port: 5432,
    endpoints: [{ ip, port: 5432 }],
  };
}

/**
 * Probes `targets` from each prober over and over until `stop` resolves; returns every
 * answer that got through (an open connection or a reset: a packet reached the pod).
 */
async function probeLoop(
  probers: Prober[],
  targets: Probe[],
  stop: Promise<unknown>,
): Promise<{ through: string[]; rounds: number }> {
  let done = false;
  stop.finally(() => done = true);
  const through: string[] = [];
  let rounds = 0;
  await Promise.all(probers.map(async (p) => {
    while (!done) {
      const r = await p.probe(targets, 300);
      rounds++;
      r.forEach((x, i) => {
        if (passed(x)) through.push(`${p.netns} -> ${targets[i].addr}:${targets[i].port} ${x}`);
      });
    }
  }));
  return { through, rounds };
}

Deno.test({
  name:
    "NetworkPolicy from the first packet: a pod whose policy denies all ingress is reached by no packet before, during or after its ADD; an agent restarted while the API server is down keeps the deny, and answers a new pod's ADD with 11 until it has synced",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const c = await startCluster();
    try {
      c.namespace("secure", { team: "s" });
      c.namespace("open", { team: "o" });
      const a = await c.node("node-a", {
        nodeNic: true,
        mock: { enis: 5 },
        extra: { networkPolicy: { syncWaitSeconds: 2 } },
      });
      const client = await c.pod(a, "node-a", "open", "client", { app: "client" }, []);
      const outside = await a.vpc.host("outside", 60);
      const outsider = await c.prober(outside.ns.name);
      c.put("networkpolicies", {
        metadata: { namespace: "secure", name: "deny" },
        spec: { podSelector: {}, policyTypes: ["Ingress"] },
      });
      await c.settle();
      // The victim's address is one of the free ENIs'; probe them all.
      const free = (await a.client.enis()).filter((e) => e.owner === null && e.ipv4);
      const targets: Probe[] = free.flatMap((e) => [
        { proto: "tcp" as const, addr: e.ipv4!.address, port: 8080 },
        { proto: "udp" as const, addr: e.ipv4!.address, port: 53 },
      ]);
      let victim!: ClusterPod;
      await t.step("no packet reaches the pod before, during or after its ADD", async () => {
        let added!: () => void;
        const after = new Promise<void>((r) => added = r).then(() =>
          new Promise((ok) => setTimeout(ok, 1_500))
        );
        const loop = probeLoop([client.prober, outsider], targets, after);
        await new Promise((ok) => setTimeout(ok, 500));
        victim = await c.pod(a, "node-a", "secure", "victim", { app: "victim" }, [{
          name: "http",
          containerPort: 8080,
        }]);
        added();
        const { through, rounds } = await loop;
        assert(targets.some((x) => x.addr === victim.v4), "the victim got one of the probed ENIs");
        assertEquals(through, [], `${rounds} rounds of probes`);
        assert(rounds >= 4, `${rounds} rounds`);
      });
      await t.step("an agent restarted while the API server is down keeps the deny", async () => {
        await a.stopAgent();
        await c.api.down();
        await a.startAgent();
        const { through, rounds } = await probeLoop(
          [client.prober, outsider],
          [{ proto: "tcp", addr: victim.v4, port: 8080 }, {
            proto: "udp",
            addr: victim.v4,
            port: 53,
          }],
          new Promise((ok) => setTimeout(ok, 1_500)),
        );
        assertEquals(through, [], `${rounds} rounds of probes`);
        const s = await a.client.status();
        assertEquals(s.policy?.synced, false);
        assertEquals(s.policy?.pods.map((p) => [p.pod, p.state]), [
          ["open/client", "waiting"],
          ["secure/victim", "waiting"],
        ]);
      });
      await t.step("a new pod's ADD while the agent has never synced answers 11", async () => {
        c.put("pods", c.podObject("secure", "late", { app: "late" }, "node-a", []));
        const ns = await a.vpc.pod("secure-late");
        const call = {
          containerId: "c-secure-late",
          args: "K8S_POD_NAMESPACE=secure;K8S_POD_NAME=late;IgnoreUnknown=1",
          config: c.netconf(a),
        };
        const r = await a.cni("ADD", a.podCall(ns, call));
        assertEquals(r.json?.code, 11, r.stdout);
        assertEquals(
          r.json?.msg,
          "NetworkPolicy: the agent has not synced with the Kubernetes API server yet; the runtime retries",
        );
        c.api.up();
        await c.settle(60_000);
        const again = await a.cni("ADD", a.podCall(ns, call));
        assertEquals(again.code, 0, again.stdout);
      });
      await t.step("once synced the deny still holds; without it the pod is reached", async () => {
        await expectReach(client, victim.v4, 8080, false);
        c.remove("networkpolicies", "secure", "deny");
        await c.settle();
        await expectReach(client, victim.v4, 8080, true);
      });
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      await c.close();
    }
  },
});
