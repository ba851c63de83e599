/**
 * NetworkPolicy across an agent restart with the API server up (issue 42, point 2), on
 * the real kernel: the node's side of the enforcement (a Service's traffic between two
 * pods of one node is judged only at their host links' node ends) must hold from the
 * agent's start to its stop. The provider's `list()` is slow (the mock's
 * `listLatencyMs`), as a cloud API can be at start-up, so that reconcile takes seconds
 * while the caches sync at once; a pod of the same node probes two backends through
 * their ClusterIPs (kube-proxy's iptables rules) the whole time, and one backend's Pod
 * is force-deleted while the agent is away: its last rules stay.
 *
 * Why kube-proxy's rules are written by hand here (tests/support/kube_proxy.ts), not run:
 * the Service `ghost` must keep the force-deleted pod's address as its endpoint through the
 * restart, the window this test judges; in a real cluster the controller-manager withdraws
 * it within seconds, and kube-proxy then rejects the probes itself, which would hide what
 * enim lets through. The real kube-proxy's Service paths under NetworkPolicy, the restart
 * among them, run in tests/network_policy_e2e_test.ts.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { KUBE_PROXY_NEEDS } from "./support/kube_proxy.ts";
import { PolicyCluster } from "./support/policy_cluster.ts";
import { passed, type Probe } from "./support/prober.ts";
import { admitOnlyWeb, kubeProxyByHand, probeUntil, servicePort } from "./support/db_policy.ts";

const DEPS = await clientDeps("network_policy_restart_test", [
  ...TRAFFIC_NEEDS,
  ...KUBE_PROXY_NEEDS,
]);

/** How long the provider's `list()` takes once the agent restarts. */
const LIST_LATENCY_MS = 3_000;

Deno.test({
  name:
    "NetworkPolicy across a restart with the API server up and a slow provider: a pod of the same node never reaches a backend through its ClusterIP, nor one whose Pod was force-deleted meanwhile",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const c = await PolicyCluster.start();
    try {
      c.namespace("alpha", { team: "a" });
      const a = await c.node("node-a", { nodeNic: true, mock: { enis: 6 } });
      const db = await c.pod(a, "node-a", "alpha", "db", { app: "db" }, []);
      const ghost = await c.pod(a, "node-a", "alpha", "ghost", { app: "db" }, []);
      const web = await c.pod(a, "node-a", "alpha", "web", { app: "web" }, []);
      const job = await c.pod(a, "node-a", "alpha", "job", { app: "job" }, []);
      const services = [
        servicePort("db", "172.30.0.10", db.v4, "tcp", 5432),
        servicePort("db", "172.30.0.10", db.v4, "udp", 53),
        servicePort("ghost", "172.30.0.11", ghost.v4, "tcp", 5432),
        servicePort("ghost", "172.30.0.11", ghost.v4, "udp", 53),
      ];
      await kubeProxyByHand(a, services);
      await admitOnlyWeb(c);
      const targets: Probe[] = services.map((s) => ({
        proto: s.protocol,
        addr: s.clusterIP,
        port: s.port,
      }));
      await t.step(
        "before the restart: web reaches both backends' ClusterIPs, job neither",
        async () => {
          const ok = await web.prober.probe(targets.filter((x) => x.proto === "tcp"), 2_000);
          assertEquals(ok.map(passed), [true, true], String(ok));
          const denied = await job.prober.probe(targets, 1_000);
          assertEquals(denied, ["timeout", "timeout", "timeout", "timeout"]);
        },
      );
      let rounds = 0;
      await t.step(
        "from the agent's stop through its slow start to its sync, no probe of job gets through",
        async () => {
          let started!: () => void;
          const until = new Promise<void>((r) => started = r).then(() =>
            new Promise((ok) => setTimeout(ok, 1_500))
          );
          const loop = probeUntil(job, targets, until);
          await a.stopAgent();
          // Force-deleted while the agent is away: its sandbox, and its attachment, stay.
          c.remove("pods", "alpha", "ghost");
          await a.editConfig((cfg) => {
            const p = cfg.provider as Record<string, Record<string, unknown>>;
            p.mock.listLatencyMs = LIST_LATENCY_MS;
          });
          const t0 = performance.now();
          await a.startAgent();
          const startMs = performance.now() - t0;
          await c.settle(30_000);
          started();
          const r = await loop;
          rounds = r.rounds;
          assert(startMs >= LIST_LATENCY_MS, `the start took ${Math.round(startMs)} ms`);
          assertEquals(r.through, [], `${r.rounds} rounds of ${targets.length} probes`);
          assert(r.rounds >= 10, `${r.rounds} rounds`);
        },
      );
      await t.step(
        `${rounds} rounds of probes; after it: ghost is kept as it was, db enforced`,
        async () => {
          const s = await a.client.status();
          assertEquals(s.policy?.synced, true);
          const states = Object.fromEntries((s.policy?.pods ?? []).map((p) => [p.pod, p.state]));
          assertEquals(states["alpha/ghost"], "unknown");
          assertEquals(states["alpha/db"], "enforced");
          const denied = await job.prober.probe(targets, 1_000);
          assertEquals(denied, ["timeout", "timeout", "timeout", "timeout"]);
          const ok = await web.prober.probe(targets.filter((x) => x.proto === "tcp"), 2_000);
          assertEquals(ok.map(passed), [true, true], String(ok));
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
