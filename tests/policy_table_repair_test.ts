/**
 * The node's policy table taken away (issue 48, point 2), on the real kernel: a pod `job`
 * of node-a probes `db`, on the same node, through db's ClusterIP (kube-proxy's DNAT; the
 * flow is judged only at the host links' node ends, in the node's `inet enim_policy`),
 * over and over, while db's policy admits only `web`. Then, with the agent running:
 *
 * 1. the node's policy table is deleted (`nft delete table inet enim_policy`);
 * 2. the node's whole ruleset is flushed (`nft flush ruleset`, the first line of the
 *    default `/etc/nftables.conf`): kube-proxy's rules, enim's host-link table and its
 *    policy table all go, and kube-proxy writes its rules again (the real one resyncs by
 *    itself; written by hand again on the test API server).
 *
 * Each case measures the window in which job's probes got through (from the deletion to
 * the last probe through; printed), checks that the agent found the table missing and
 * loaded it again (its metric, its log line, its status), and that no probe got through
 * after that: job's for a while longer, while web still reaches db. The first case has
 * no window at all: the fence (`policy/fence.ts`, table `inet enim_fence`) drops what no
 * policy table judged, and its counter shows it did; the flush takes the fence too.
 *
 * On the real control plane (kube-apiserver, the controller-manager, the real kube-proxy)
 * when Go is here to build it, else the test API server and kube-proxy's rules by hand.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { KUBE_PROXY_NEEDS, type ServicePort } from "./support/kube_proxy.ts";
import { type ClusterPod, PolicyCluster, SERVICE_CIDRS } from "./support/policy_cluster.ts";
import { RealApi, realApiWanted } from "./support/k8s/policy_api.ts";
import { kubeProxyOn } from "./support/policy_kube_proxy.ts";
import { passed, type Probe } from "./support/prober.ts";
import { admitOnlyWeb } from "./support/db_policy.ts";
import type { SimulatedNode } from "./support/node.ts";

const DEPS = await clientDeps("policy_table_repair_test", [...TRAFFIC_NEEDS, ...KUBE_PROXY_NEEDS]);

const API = realApiWanted();
const NFT = "/usr/sbin/nft";
const POLICY = "enim_policy";
const CLUSTER_IP = "172.30.0.10";
/** How long job keeps probing once the repair is seen (nothing may get through). */
const AFTER_MS = 4_000;

/** The sum of the agent's `enim_table_repairs_total` series with `table` and `place`. */
async function repairs(n: SimulatedNode, table: string, place: string): Promise<number> {
  const text = await n.client.metrics();
  return text.split("\n")
    .filter((l) =>
      l.startsWith("enim_table_repairs_total{") && l.includes(`table="${table}"`) &&
      l.includes(`place="${place}"`)
    )
    .reduce((sum, l) => sum + Number(l.split(" ").at(-1)), 0);
}

/** Probes from `from` until `stop()` says so; each probe that got through, with when. */
async function probeLoop(from: ClusterPod, target: Probe, t0: number, stop: () => boolean) {
  const through: { atMs: number; result: string }[] = [];
  let rounds = 0;
  while (!stop()) {
    const at = performance.now() - t0;
    const [r] = await from.prober.probe([target], 300);
    rounds++;
    if (passed(r)) through.push({ atMs: Math.round(at), result: r });
  }
  return { through, rounds };
}

Deno.test({
  name:
    "the node's policy table deleted, or the node's whole ruleset flushed and kube-proxy's rules back: the agent loads its tables again; probes policy denies through a same-node ClusterIP pass only in a bounded window, none after it",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const c = await PolicyCluster.start(
      API.real
        ? await RealApi.start({ serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6] })
        : undefined,
    );
    let proxies: Awaited<ReturnType<typeof kubeProxyOn>> | null = null;
    try {
      c.namespace("alpha", { team: "a" });
      const a = await c.node("node-a", { nodeNic: true, mock: { enis: 5 } });
      const db = await c.pod(a, "node-a", "alpha", "db", { app: "db" }, [
        { name: "sql", containerPort: 5432 },
      ]);
      const web = await c.pod(a, "node-a", "alpha", "web", { app: "web" }, []);
      const job = await c.pod(a, "node-a", "alpha", "job", { app: "job" }, []);
      const services: ServicePort[] = [{
        namespace: "alpha",
        name: "db",
        portName: "pg",
        protocol: "tcp",
        clusterIP: CLUSTER_IP,
        port: 5432,
        endpoints: [{ ip: db.v4, port: 5432 }],
      }];
      proxies = await kubeProxyOn(c, [[a, "node-a"]], "iptables", services);
      console.error(`policy_table_repair_test: ${proxies.what}`);
      await admitOnlyWeb(c);
      const target: Probe = { proto: "tcp", addr: CLUSTER_IP, port: 5432 };
      const reach = async (p: ClusterPod, want: boolean) => {
        const ok = await poll(async () => {
          const [r] = await p.prober.probe([target], want ? 2_000 : 1_000);
          return passed(r) === want || null;
        }, { timeoutMs: 20_000, intervalMs: 100 });
        assert(ok, `${p.id} -> ${CLUSTER_IP}:5432 ${want ? "never reached" : "reached"}`);
      };
      await reach(web, true);
      await reach(job, false);

      /**
       * Runs `fault` while job probes; waits (bounded) for the repair of each table in
       * `tables` and for `back()`; then AFTER_MS more of probes. Returns the window.
       */
      const judge = async (
        name: string,
        fault: string[],
        tables: [string, string][],
        back: () => Promise<void>,
      ) => {
        const before = await Promise.all(tables.map(([tb, pl]) => repairs(a, tb, pl)));
        let repairedAt = Infinity, stopAt = Infinity;
        const t0 = performance.now();
        const loop = probeLoop(job, target, t0, () => performance.now() > stopAt);
        const out = await a.vpc.exec(a.vpc.node, [NFT, ...fault]);
        assertEquals(out.code, 0, out.stderr);
        // kube-proxy's rules come back as soon as they may (by hand: at once, before the
        // agent's check can have run), so the window is enim's alone.
        const backed = back();
        const seen = await poll(async () => {
          const now = await Promise.all(tables.map(([tb, pl]) => repairs(a, tb, pl)));
          return now.every((n, i) => n > before[i]) || null;
        }, { timeoutMs: 30_000, intervalMs: 100 });
        await backed;
        if (!seen) {
          stopAt = 0;
          const r = await loop;
          throw new Error(
            `${name}: no repair counted in the metrics within 30 s; ${r.through.length} of ${r.rounds} probes of job got through meanwhile, the last ${
              r.through.at(-1)?.atMs ?? 0
            } ms after the fault`,
          );
        }
        // Loaded again: the status says enforced (its own check of every table first).
        const enforced = await poll(async () => {
          const s = await a.client.status();
          return s.policy?.pods.every((p) => p.state === "enforced") || null;
        }, { timeoutMs: 30_000, intervalMs: 100 });
        assert(enforced, `${name}: the status never said enforced again`);
        repairedAt = performance.now() - t0;
        stopAt = performance.now() + AFTER_MS;
        const r = await loop;
        await reach(web, true);
        const windowMs = r.through.length ? Math.max(...r.through.map((x) => x.atMs)) : 0;
        console.error(
          `policy_table_repair_test: ${name}: ${r.rounds} probes, ${r.through.length} through, the last ${windowMs} ms after the fault; repaired and seen ${
            Math.round(repairedAt)
          } ms after it`,
        );
        const after = r.through.filter((x) => x.atMs >= repairedAt);
        assertEquals(after, [], `${name}: probes through after the repair`);
        assert(r.rounds >= 10, `${r.rounds} rounds`);
        const log = await a.agentLog();
        assert(
          log.includes("NetworkPolicy: a policy table is missing; loading it again"),
          "the repair is logged",
        );
        return r;
      };

      /** The fence's count of first packets it dropped (null: no fence). */
      const fenceDrops = async (): Promise<number | null> => {
        const out = await a.vpc.exec(a.vpc.node, [
          NFT,
          "list",
          "counter",
          "inet",
          "enim_fence",
          "drop_unjudged",
        ]);
        if (out.code !== 0) return null;
        return Number(/packets (\d+)/.exec(out.stdout)?.[1] ?? NaN);
      };

      await t.step(
        "the node's policy table deleted while its agent is frozen (no repair can come): the fence alone holds, none through",
        async () => {
          const up = await poll(async () => (await fenceDrops()) !== null || null, {
            timeoutMs: 20_000,
            intervalMs: 100,
          });
          assert(up, "the agent never wrote its fence (inet enim_fence)");
          const pid = a.agentPid!;
          const dropsBefore = (await fenceDrops())!;
          Deno.kill(pid, "SIGSTOP");
          let r: Awaited<ReturnType<typeof probeLoop>>;
          try {
            const out = await a.vpc.exec(a.vpc.node, [NFT, "delete", "table", "inet", POLICY]);
            assertEquals(out.code, 0, out.stderr);
            const t0 = performance.now();
            // Within the fence's timeout (10 s at the defaults) from its last write.
            r = await probeLoop(job, target, t0, () => performance.now() - t0 > 3_000);
          } finally {
            Deno.kill(pid, "SIGCONT");
          }
          const dropped = (await fenceDrops())! - dropsBefore;
          console.error(
            `policy_table_repair_test: agent frozen, table deleted: ${r.rounds} probes, ${r.through.length} through; the fence dropped ${dropped} first packets`,
          );
          assertEquals(r.through, [], "probes through the fence");
          assert(r.rounds >= 5, `${r.rounds} rounds`);
          assert(dropped > 0, "the fence dropped nothing");
          // Thawed, the agent finds its table missing and loads it again.
          const back = await poll(async () => {
            const s = await a.client.status();
            return s.policy?.pods.every((p) => p.state === "enforced") || null;
          }, { timeoutMs: 30_000, intervalMs: 100 });
          assert(back, "the status never said enforced again");
          await reach(web, true);
          await reach(job, false);
        },
      );

      await t.step("the node's policy table deleted: the fence holds, none through", async () => {
        // The fence is written at the agent's first table check after its take-over.
        const up = await poll(async () => (await fenceDrops()) !== null || null, {
          timeoutMs: 20_000,
          intervalMs: 100,
        });
        assert(up, "the agent never wrote its fence (inet enim_fence)");
        const dropsBefore = (await fenceDrops())!;
        const r = await judge(
          "table deleted",
          ["delete", "table", "inet", "enim_policy"],
          [["policy", "node"]],
          () => Promise.resolve(),
        );
        console.error(
          `policy_table_repair_test: table deleted: the fence dropped ${
            (await fenceDrops())! - dropsBefore
          } first packets`,
        );
        assertEquals(r.through, [], "probes through while the node's policy table was gone");
      });

      await t.step(
        "the node's whole ruleset flushed, then kube-proxy's rules back",
        async () => {
          await judge(
            "ruleset flushed",
            ["flush", "ruleset"],
            [["policy", "node"], ["host_link", "node"]],
            () => proxies!.programmed(a),
          );
        },
      );
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      await proxies?.stop();
      await c.close();
    }
  },
});
