/**
 * Whose a reused address is, end to end on the real kernel (issue 42, point 1): a pod
 * that a policy admits is deleted as the API shows it (`deletionTimestamp` set, still
 * Running, its `status.podIPs` kept), the runtime DELs it, and a new pod gets its ENI,
 * so its address. The new pod must not reach what the old one could: not on the node
 * that gave the address out (local truth: enim is its IPAM), directly or through a
 * ClusterIP, at once or a second later; nor on another node, which knows only the API
 * (the freeing node hands the ENI out again only once the API stops showing the old
 * pod with it, bounded: `networkPolicy.reuseWaitSeconds`).
 *
 * The agents are the shipped bundle, reading the test API server
 * (tests/support/kube_apiserver.ts) through tests/support/policy_cluster.ts; kube-proxy's
 * rules are written as kube-proxy writes them (iptables mode). Why not the real ones: the
 * old pod must stay as the API shows it after its DEL (Terminating, Running, its
 * `status.podIPs` kept) for as long as each step needs, which the test API server's
 * direct writes give; and the real kube-proxy reads its Services from an API server, so on
 * the test API server it would test that imitation, not kube-proxy.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { installKubeProxy, KUBE_PROXY_NEEDS, type ServicePort } from "./support/kube_proxy.ts";
import {
  type ClusterPod,
  POD_PORTS,
  PolicyCluster,
  SERVICE_CIDRS,
} from "./support/policy_cluster.ts";
import { passed, type Probe, type Prober } from "./support/prober.ts";
import type { SimulatedNode } from "./support/node.ts";
import type { AddResult } from "./support/node.ts";

const DEPS = await clientDeps("policy_identity_e2e_test", [...TRAFFIC_NEEDS, ...KUBE_PROXY_NEEDS]);

/** x/a's ClusterIP (TCP 8080 → x/a's 8080). */
const CLUSTER_IP = "172.30.0.20";

/** x/a admits y's `app: b` pods, and nothing else. */
const POLICY = {
  podSelector: { matchLabels: { app: "a" } },
  policyTypes: ["Ingress"],
  ingress: [{
    from: [{
      namespaceSelector: { matchLabels: { team: "y" } },
      podSelector: { matchLabels: { app: "b" } },
    }],
  }],
};

/** Node B's default profile: its own subnets (node A's is the VPC's, 10.99.0.0/24). */
const NODE_B_SUBNETS = { ipv4: "10.97.0.0/24", ipv6: "fd00:97::/64" };

/** The probes of x/a: TCP 8080 and 5432 and UDP 53 at its address, TCP 8080 at its ClusterIP. */
const probesOf = (a: ClusterPod): Probe[] => [
  { proto: "tcp", addr: a.v4, port: 8080 },
  { proto: "tcp", addr: a.v4, port: 5432 },
  { proto: "udp", addr: a.v4, port: 53 },
  { proto: "tcp", addr: CLUSTER_IP, port: 8080 },
];

const text = (probes: Probe[], results: string[]) =>
  probes.map((p, i) => `${p.proto} ${p.addr}:${p.port} ${results[i]}`);

/** Probes `probes` from `prober`; what got through (none is what a denial means). */
async function through(prober: Prober, probes: Probe[], timeoutMs = 1_000): Promise<string[]> {
  const r = await prober.probe(probes, timeoutMs);
  return text(probes, r).filter((_, i) => passed(r[i]));
}

/** Probes until every probe gets through (a loaded machine may lose a first packet). */
async function allThrough(prober: Prober, probes: Probe[]): Promise<void> {
  let last: string[] = [];
  const ok = await poll(async () => {
    const r = await prober.probe(probes, 2_000);
    last = text(probes, r);
    return r.every(passed) || null;
  }, { timeoutMs: 20_000, intervalMs: 100 });
  assert(ok, `not everything got through: ${last.join("; ")}`);
}

/** x/a's Service on `node`'s kube-proxy. */
async function service(node: SimulatedNode, a: ClusterPod): Promise<void> {
  const svc: ServicePort = {
    namespace: "x",
    name: "a",
    portName: "http",
    protocol: "tcp",
    clusterIP: CLUSTER_IP,
    port: 8080,
    endpoints: [{ ip: a.v4, port: 8080 }],
  };
  await installKubeProxy(node.vpc.node.name, "iptables", [svc], [{
    family: 4,
    serviceCidr: SERVICE_CIDRS.ipv4,
    nodeIPs: [node.nic!.ipv4!],
  }]);
}

/** The pod deleted as the API shows it: `deletionTimestamp` set, its status kept. */
function terminating(c: PolicyCluster, p: ClusterPod): void {
  const o = c.podObject(p.namespace, p.name, p.labels, p.nodeName, p.ports, { v4: p.v4, v6: p.v6 });
  o.metadata.deletionTimestamp = new Date(Date.now() + 30_000).toISOString();
  o.metadata.deletionGracePeriodSeconds = 30;
  c.put("pods", o);
}

/** A new pod's object (Pending, no address yet), its namespace and answer server. */
async function newPod(
  c: PolicyCluster,
  node: SimulatedNode,
  nodeName: string,
  ns: string,
  name: string,
) {
  c.put("pods", c.podObject(ns, name, { app: name }, nodeName, []));
  const netns = await node.vpc.pod(`${ns}-${name}`);
  await c.servers.start(netns, `${ns}/${name}`, POD_PORTS);
  const call = {
    containerId: `c-${ns}-${name}`,
    args: await c.cniArgs(ns, name),
    config: c.netconf(node),
  };
  return { netns, call };
}

/** The result's address of a family. */
const addrOf = (r: AddResult, fam: 4 | 6) =>
  r.ips.map((i) => i.address.split("/")[0]).find((a) => a.includes(":") === (fam === 6))!;

Deno.test({
  name:
    "A reused address is not the old pod's on its node: y/b, admitted by x/a, deleted as the API shows it (Terminating, Running, its podIPs kept) and DELed; z/e gets its ENI and its address, and reaches x/a neither directly nor through its ClusterIP, at once nor a second later",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const c = await PolicyCluster.start();
    try {
      c.namespace("x", { team: "x" });
      c.namespace("y", { team: "y" });
      c.namespace("z", { team: "z" });
      // Two ENIs: x/a's and y/b's; the next pod can only get y/b's. No reuse wait: the
      // API still shows y/b with the address when z/e gets it.
      const a = await c.node("node-a", {
        nodeNic: true,
        mock: { enis: 2 },
        extra: { networkPolicy: { reuseWaitSeconds: 0 } },
      });
      const xa = await c.pod(a, "node-a", "x", "a", { app: "a" }, [{
        name: "http",
        containerPort: 8080,
      }]);
      const yb = await c.pod(a, "node-a", "y", "b", { app: "b" }, []);
      await service(a, xa);
      c.put("networkpolicies", { metadata: { namespace: "x", name: "a" }, spec: POLICY });
      await c.settle();
      const probes = probesOf(xa);
      await t.step("y/b reaches x/a directly and through its ClusterIP", async () => {
        await allThrough(yb.prober, probes);
      });

      let ze!: { prober: Prober; v4: string };
      await t.step(
        "deleted in the API but still shown Running with its address, y/b is DELed; z/e gets its ENI, and at once reaches x/a by no path",
        async () => {
          terminating(c, yb);
          await c.settle();
          await c.del(yb);
          const { netns, call } = await newPod(c, a, "node-a", "z", "e");
          const res = await a.add(netns, call);
          const prober = await c.prober(netns.name);
          ze = { prober, v4: addrOf(res, 4) };
          assertEquals(ze.v4, yb.v4, "z/e got y/b's address");
          assertEquals(await through(prober, probes), []);
          // kubelet writes z/e's status; y/b's object still shows the address too.
          c.put(
            "pods",
            c.podObject("z", "e", { app: "e" }, "node-a", [], { v4: ze.v4, v6: addrOf(res, 6) }),
          );
        },
      );
      await t.step("a second later, with both in the API, still by no path", async () => {
        await new Promise((ok) => setTimeout(ok, 1_000));
        await c.settle();
        assertEquals(await through(ze.prober, probes), []);
      });
      await t.step("y/b's final status changes nothing", async () => {
        const o = c.podObject("y", "b", yb.labels, "node-a", [], { v4: yb.v4, v6: yb.v6 });
        o.status.phase = "Failed";
        c.put("pods", o);
        c.remove("pods", "y", "b");
        await c.settle();
        assertEquals(await through(ze.prober, probes), []);
      });
      await t.step(
        "a policy that admits z/e lets it in by both paths (the paths work)",
        async () => {
          c.put("networkpolicies", {
            metadata: { namespace: "x", name: "e" },
            spec: {
              podSelector: { matchLabels: { app: "a" } },
              ingress: [{
                from: [{
                  namespaceSelector: { matchLabels: { team: "z" } },
                  podSelector: { matchLabels: { app: "e" } },
                }],
              }],
            },
          });
          await c.settle();
          await allThrough(ze.prober, probes);
        },
      );
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      await c.close();
    }
  },
});

Deno.test({
  name:
    "A reused address is not the old pod's on another node: node B frees y/d's ENI (y/d Terminating in the API, its podIPs kept) but hands it to z/f only once the API shows y/d finished; z/f then reaches x/a on node A neither directly nor through its ClusterIP, at once nor a second later",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const c = await PolicyCluster.start();
    try {
      c.namespace("x", { team: "x" });
      c.namespace("y", { team: "y" });
      c.namespace("z", { team: "z" });
      const a = await c.node("node-a", { nodeNic: true, mock: { enis: 2 } });
      const b = await c.node("node-b", {
        joinVpc: a.vpc,
        nodeNic: true,
        subnets: NODE_B_SUBNETS,
        mock: { enis: 2, macPrefix: "02:e1:0b", idPrefix: "eni-mockb-" },
      });
      const xa = await c.pod(a, "node-a", "x", "a", { app: "a" }, [{
        name: "http",
        containerPort: 8080,
      }]);
      // Node B is full: y/d (admitted by x/a) and a filler.
      const yd = await c.pod(b, "node-b", "y", "d", { app: "b" }, []);
      await c.pod(b, "node-b", "y", "filler", { app: "filler" }, []);
      for (const n of [a, b]) await service(n, xa);
      c.put("networkpolicies", { metadata: { namespace: "x", name: "a" }, spec: POLICY });
      await c.settle();
      const probes = probesOf(xa);
      await t.step(
        "y/d on node B reaches x/a on node A directly and through its ClusterIP",
        async () => {
          await allThrough(yd.prober, probes);
        },
      );

      let ze!: { prober: Prober; v4: string };
      await t.step(
        "y/d deleted in the API (still shown Running with its address) and DELed: z/f's ADD, which can only get its ENI, waits while the API shows y/d with it",
        async () => {
          terminating(c, yd);
          await c.settle();
          await c.del(yd);
          const { netns, call } = await newPod(c, b, "node-b", "z", "f");
          let answered: AddResult | null = null;
          const adding = b.add(netns, call).then((r) => answered = r);
          // Not a time limit: whatever the load, it must not answer before y/d is gone.
          await new Promise((ok) => setTimeout(ok, 1_500));
          assertEquals(answered, null, "z/f's ADD waits for y/d's address");
          const ydEni = (await b.client.enis()).find((e) => e.ipv4?.address === yd.v4);
          assert(ydEni && ydEni.owner !== null, "y/d's ENI is not back in the pool yet");
          // kubelet writes y/d's final status: the ENI goes back and z/f gets it.
          const o = c.podObject("y", "d", yd.labels, "node-b", [], { v4: yd.v4, v6: yd.v6 });
          o.status.phase = "Failed";
          o.metadata.deletionTimestamp = new Date().toISOString();
          o.metadata.deletionGracePeriodSeconds = 30;
          c.put("pods", o);
          const res = await adding;
          const prober = await c.prober(netns.name);
          ze = { prober, v4: addrOf(res, 4) };
          assertEquals(ze.v4, yd.v4, "z/f got y/d's address");
          assertEquals(await through(prober, probes), []);
          c.put(
            "pods",
            c.podObject("z", "f", { app: "f" }, "node-b", [], { v4: ze.v4, v6: addrOf(res, 6) }),
          );
        },
      );
      await t.step("a second later still by no path; then y/d's object goes", async () => {
        await new Promise((ok) => setTimeout(ok, 1_000));
        await c.settle();
        assertEquals(await through(ze.prober, probes), []);
        c.remove("pods", "y", "d");
        await c.settle();
        assertEquals(await through(ze.prober, probes), []);
      });
      await t.step(
        "a policy that admits z/f lets it in by both paths (the paths work)",
        async () => {
          c.put("networkpolicies", {
            metadata: { namespace: "x", name: "f" },
            spec: {
              podSelector: { matchLabels: { app: "a" } },
              ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: "z" } } }] }],
            },
          });
          await c.settle();
          await allThrough(ze.prober, probes);
        },
      );
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      await c.close();
    }
  },
});
