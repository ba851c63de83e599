/**
 * A reused address's old connections across an agent's restart (issue 48, point 3), on the
 * real kernel: pod B on node-b admits y/a (on node-a); y/a sends UDP to B from address X,
 * port 40000, so B's namespace tracks that flow. Then node-b's agent is away (restarted;
 * in the second case SIGKILLed while it takes over, and started again): y/a is deleted
 * and DELed, and a new pod y/c on node-a gets its ENI, so X. B's policy does not admit
 * y/c; y/c sends UDP to B on y/a's very 5-tuple. Once node-b's agent has taken over,
 * none of it may arrive: the tracked connection, admitted as y/a's, must be gone.
 *
 * The agents are the shipped bundle on the test API server (tests/support/policy_cluster.ts).
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { POD_PORTS, PolicyCluster } from "./support/policy_cluster.ts";
import type { AddResult } from "./support/node.ts";
import { sendUdp, type Sink, UdpSinks } from "./support/udp_probe.ts";

const DEPS = await clientDeps("policy_restart_conntrack_test", TRAFFIC_NEEDS);

const SINK_PORT = 5354;
const SPORT = 40000;
const COUNT = 10;

const addrOf = (r: AddResult, fam: 4 | 6) =>
  r.ips.map((i) => i.address.split("/")[0]).find((a) => a.includes(":") === (fam === 6))!;

/** Waits (bounded) until `sink` has `n` datagrams tagged `tag`; returns how many it has. */
async function arrived(sink: Sink, tag: string, n: number, ms = 5_000): Promise<number> {
  await poll(() => Promise.resolve(sink.tagged(tag).length >= n || null), {
    timeoutMs: ms,
    intervalMs: 50,
  }).catch(() => null);
  return sink.tagged(tag).length;
}

for (const how of ["restarted", "SIGKILLed while it takes over, then started again"] as const) {
  Deno.test({
    name:
      `a reused address's tracked connection does not survive node-b's agent ${how}: y/a's address goes to y/c, and y/c's UDP on y/a's 5-tuple does not reach the pod that admitted y/a`,
    ignore: DEPS.skip !== null,
    async fn() {
      const c = await PolicyCluster.start();
      const sinks = new UdpSinks();
      try {
        c.namespace("x", { team: "x" });
        c.namespace("y", { team: "y" });
        // One ENI on node-a: y/c can only get y/a's. No reuse wait.
        const a = await c.node("node-a", {
          nodeNic: true,
          mock: { enis: 1 },
          extra: { networkPolicy: { reuseWaitSeconds: 0 } },
        });
        const b = await c.node("node-b", {
          joinVpc: a.vpc,
          nodeNic: true,
          subnets: { ipv4: "10.97.0.0/24", ipv6: "fd00:97::/64" },
          mock: { enis: 2, macPrefix: "02:e1:0b", idPrefix: "eni-mockb-" },
        });
        const ya = await c.pod(a, "node-a", "y", "a", { app: "a" }, []);
        const xb = await c.pod(b, "node-b", "x", "b", { app: "b" }, []);
        c.put("networkpolicies", {
          metadata: { namespace: "x", name: "b" },
          spec: {
            podSelector: { matchLabels: { app: "b" } },
            policyTypes: ["Ingress"],
            ingress: [{
              from: [{
                namespaceSelector: { matchLabels: { team: "y" } },
                podSelector: { matchLabels: { app: "a" } },
              }],
            }],
          },
        });
        await c.settle();
        // It answers: y/a's flow is established in x/b's conntrack (what a chain accepts first).
        const sink = await sinks.start(xb.ns, SINK_PORT, 300, true);
        const burst = (tag: string) => ({
          bind: ya.v4,
          to: xb.v4,
          port: SINK_PORT,
          count: COUNT,
          tag,
          sport: SPORT,
        });
        // y/a's flow: admitted, tracked in x/b's namespace.
        await sendUdp(ya.ns, [burst("a1")]);
        assertEquals(await arrived(sink, "a1", COUNT), COUNT, "y/a reaches x/b");

        await b.stopAgent();
        // While node-b's agent is away: y/a deleted and DELed; y/c gets its ENI.
        await sendUdp(ya.ns, [burst("a2")]);
        assertEquals(await arrived(sink, "a2", COUNT), COUNT, "y/a still reaches x/b");
        c.remove("pods", "y", "a");
        await c.del(ya);
        c.put("pods", c.podObject("y", "c", { app: "c" }, "node-a", []));
        const ycNs = await a.vpc.pod("y-c");
        await c.servers.start(ycNs, "y/c", POD_PORTS);
        const res = await a.add(ycNs, {
          containerId: "c-y-c",
          args: await c.cniArgs("y", "c"),
          config: c.netconf(a),
        });
        assertEquals(addrOf(res, 4), ya.v4, "y/c got y/a's address");
        c.put(
          "pods",
          c.podObject("y", "c", { app: "c" }, "node-a", [], {
            v4: addrOf(res, 4),
            v6: addrOf(res, 6),
          }),
        );
        if (how !== "restarted") {
          // Killed once its take-over has begun (its first render, or its connections'
          // deletion, under way or not yet).
          await b.startAgent();
          const began = await poll(async () => (await b.client.status()).policy?.synced || null, {
            timeoutMs: 20_000,
            intervalMs: 5,
          });
          assert(began, "node-b's agent took over");
          await b.stopAgent("SIGKILL");
        }
        await b.startAgent();
        await c.settle(30_000);
        // y/c on y/a's 5-tuple: x/b's policy does not admit y/c.
        await sendUdp(ycNs, [{ ...burst("c"), bind: addrOf(res, 4) }]);
        const n = await arrived(sink, "c", 1, 2_000);
        assertEquals(n, 0, `${n} of ${COUNT} datagrams of y/c on y/a's 5-tuple reached x/b`);
        const log = await b.agentLog();
        assert(
          log.includes("deleted the tracked connections of addresses whose pod changed"),
          "the take-over deleted them",
        );
      } catch (err) {
        for (const n of c.nodes) console.error(await n.agentLog());
        throw err;
      } finally {
        await sinks[Symbol.asyncDispose]();
        await c.close();
      }
    },
  });
}
