/**
 * kube-proxy's IPVS mode is found and refused while NetworkPolicy is on (issue 42 point
 * 4), on the real kernel with the real agent (the shipped bundle, the production
 * permission set) reading the test API server. These machines' kernel has neither IPVS
 * nor dummy links, so a bridge named `kube-ipvs0` in the node's namespace (with a
 * ClusterIP, as kube-proxy binds them) stands in for kube-proxy's dummy, and a file in
 * `/proc/net/ip_vs`'s format (`networkPolicy.ipvsProcFile`) for the kernel's list of
 * virtual services. While either is there an ADD fails with CNI code 111 and leaves
 * nothing (its ENI back in the pool); the agent's log, `enim status` and
 * `enim_policy_ipvs_refusing` say why; once it is gone ADDs are served again; and an
 * agent that starts with it refuses from its first ADD.
 *
 * @module
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { PolicyCluster } from "./support/policy_cluster.ts";
import type { SimulatedNode } from "./support/node.ts";
import { poll } from "../lib/async.ts";
import { sampleOf } from "./support/metrics.ts";

const DEPS = await clientDeps("ipvs_refusal_test", TRAFFIC_NEEDS);

const IP = "/usr/sbin/ip";
const HEADER = "IP Virtual Server version 1.2.1 (size=4096)\n" +
  "Prot LocalAddress:Port Scheduler Flags\n" +
  "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n";
/** One virtual service: 172.30.0.10:53/udp to a backend. */
const ONE_SERVICE = HEADER + "UDP  AC1E000A:0035 rr\n" +
  "  -> 0A630002:0035      Masq    1      0          0\n";
const REFUSED = "NetworkPolicy cannot be enforced on this node: kube-proxy runs in IPVS mode";

/** Runs `ip` in the node's namespace. */
async function nodeIp(node: SimulatedNode, args: string[]): Promise<void> {
  const out = await node.vpc.exec(node.vpc.node, [IP, ...args]);
  assertEquals(out.code, 0, out.stderr);
}

/** The value of an unlabelled gauge in `GET /metrics`. */
async function gauge(node: SimulatedNode, name: string): Promise<number | null> {
  return sampleOf(await node.client.metrics(), name);
}

/** Waits (bounded) until the agent's status says it refuses, or not. */
async function refusing(node: SimulatedNode, want: boolean): Promise<void> {
  let last: unknown;
  const ok = await poll(async () => {
    const s = (await node.client.status()).ipvs;
    last = s;
    return s?.refusing === want || null;
  }, { timeoutMs: 10_000, intervalMs: 50 });
  assert(ok, `ipvs.refusing did not become ${want}: ${JSON.stringify(last)}`);
}

Deno.test({
  name:
    "with NetworkPolicy on, kube-proxy's IPVS mode (a kube-ipvs0 link, or IPVS services) makes every ADD fail with 111 and leave nothing, said by the log, enim status and a metric, until it is gone; an agent that starts with it refuses at once",
  ignore: DEPS.skip !== null,
  async fn(t) {
    await using c = await PolicyCluster.start();
    c.namespace("shop", {});
    const node = await c.node("n1", {
      nodeNic: true,
      extra: { networkPolicy: { ipvsCheckSeconds: 0.2, ipvsProcFile: "/run/enim/ip_vs" } },
    });
    const procFile = node.sandbox.host("ip_vs");
    let n = 0;
    /** An ADD of a new pod (its Pod object written first, as kubelet's): the plugin's outcome. */
    const tryAdd = async () => {
      const name = `p${++n}`;
      c.put("pods", c.podObject("shop", name, { app: name }, "n1", []));
      const ns = await node.vpc.pod(`shop-${name}`);
      return await node.cni("ADD", {
        containerId: `c-shop-${name}`,
        ifName: "eth0",
        netns: ns.path,
        args: `K8S_POD_NAMESPACE=shop;K8S_POD_NAME=${name};IgnoreUnknown=1`,
        config: c.netconf(node),
      });
    };
    const free = async () => (await node.client.status()).pool.free;
    /** An ADD that must be refused: 111, its message, nothing kept. */
    const refused = async (why: string) => {
      const before = await free();
      const out = await tryAdd();
      assertEquals(out.code, 1, out.stdout + out.stderr);
      assertEquals(out.json?.code, 111, out.stdout);
      assertStringIncludes(String(out.json?.msg), REFUSED);
      assertStringIncludes(String(out.json?.msg), why);
      assertEquals(await free(), before, "the ENI went back");
    };
    try {
      await t.step("no IPVS: an ADD is served, nothing refuses", async () => {
        await c.settle();
        const out = await tryAdd();
        assertEquals(out.code, 0, out.stdout + out.stderr);
        const s = (await node.client.status()).ipvs!;
        assertEquals([s.refusing, s.link, s.services, s.refusedAdds], [false, false, 0, 0]);
        assertEquals(await gauge(node, "enim_policy_ipvs_refusing"), 0);
      });

      await t.step(
        "a kube-ipvs0 link (a bridge standing in for the dummy) refuses ADDs",
        async () => {
          await nodeIp(node, ["link", "add", "kube-ipvs0", "type", "bridge"]);
          await nodeIp(node, ["addr", "add", "172.30.0.10/32", "dev", "kube-ipvs0"]);
          await refusing(node, true);
          await refused('link "kube-ipvs0"');
          const s = (await node.client.status()).ipvs!;
          assertEquals([s.link, s.refusedAdds], [true, 1]);
          assertEquals(await gauge(node, "enim_policy_ipvs_refusing"), 1);
          const cli = await node.enim(["status"]);
          assertEquals(cli.code, 0, cli.stderr);
          assertStringIncludes(
            cli.stdout,
            "NETWORKPOLICY REFUSES NEW PODS: kube-proxy's IPVS mode",
          );
          assertStringIncludes(
            await node.agentLog(),
            "NetworkPolicy cannot be enforced on this node",
          );
        },
      );

      await t.step("kube-ipvs0 gone: ADDs are served again", async () => {
        await nodeIp(node, ["link", "del", "kube-ipvs0"]);
        await refusing(node, false);
        const out = await tryAdd();
        assertEquals(out.code, 0, out.stdout + out.stderr);
        assertEquals(await gauge(node, "enim_policy_ipvs_refusing"), 0);
        assertStringIncludes(await node.agentLog(), "IPVS mode is gone from this node");
      });

      await t.step(
        "IPVS services in /proc/net/ip_vs (read in the node's namespace) refuse ADDs, their header alone does not",
        async () => {
          await Deno.writeTextFile(procFile, ONE_SERVICE);
          await refusing(node, true);
          await refused("1 IPVS service in /run/enim/ip_vs");
          await Deno.writeTextFile(procFile, HEADER);
          await refusing(node, false);
          const out = await tryAdd();
          assertEquals(out.code, 0, out.stdout + out.stderr);
        },
      );

      await t.step(
        "an agent that starts with kube-ipvs0 there refuses from its first ADD",
        async () => {
          await node.stopAgent();
          await nodeIp(node, ["link", "add", "kube-ipvs0", "type", "bridge"]);
          await node.startAgent();
          assertEquals((await node.client.status()).ipvs?.refusing, true, "at once, no wait");
          await refused('link "kube-ipvs0"');
          await nodeIp(node, ["link", "del", "kube-ipvs0"]);
        },
      );
    } catch (err) {
      console.error(await node.agentLog());
      throw err;
    }
  },
});
