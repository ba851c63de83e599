/**
 * What persists in the kernel (nftables tables and their layouts, host links and their
 * names, routing rules, marks) read by both versions (issue 51 item 3): the previous
 * release's agent and plugin (built from its commit, `tests/support/releases.ts`) run a
 * node with pods and a NetworkPolicy in force; this release's takes the node over (the
 * plugin first, as the DaemonSet's init container replaces it, then the agent), and the
 * previous release takes it back (a rollback). All along a denied pod probes the protected
 * one, directly and through its ClusterIP (kube-proxy's iptables rules, written by hand as
 * in tests/network_policy_restart_test.ts): nothing gets through, and after each take-over
 * the allowed pod still reaches it, every attachment is kept, a new pod gets its ENI and
 * its policy, and the node's kernel holds the same tables, rules and links as before.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { KUBE_PROXY_NEEDS } from "./support/kube_proxy.ts";
import { type ClusterPod, PolicyCluster } from "./support/policy_cluster.ts";
import { passed, type Probe } from "./support/prober.ts";
import { admitOnlyWeb, kubeProxyByHand, probeUntil, servicePort } from "./support/db_policy.ts";
import { currentBuild, type EnimBuild, releaseBuild } from "./support/releases.ts";
import { previousRelease } from "../scripts/_releases.ts";
import type { SimulatedNode } from "./support/node.ts";
import { poll } from "../lib/async.ts";

const DEPS = await clientDeps("upgrade_takeover_test", [...TRAFFIC_NEEDS, ...KUBE_PROXY_NEEDS]);
const PREVIOUS = previousRelease().version;

async function inNode(node: SimulatedNode, args: string[]): Promise<string> {
  const out = await new Deno.Command("/usr/sbin/ip", {
    args: ["netns", "exec", node.vpc.node.name, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) throw new Error(`${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  return new TextDecoder().decode(out.stdout);
}

/**
 * What enim keeps in the node's kernel, by name: nftables tables and their chains, the
 * routing rules, the links (names, without counters or indexes that a restart changes).
 */
async function kernelView(node: SimulatedNode) {
  const ruleset = JSON.parse(await inNode(node, ["/usr/sbin/nft", "-j", "list", "ruleset"]))
    .nftables as Record<string, Record<string, unknown>>[];
  const tables = ruleset.filter((o) => o.table).map((o) => `${o.table.family} ${o.table.name}`);
  const chains = ruleset.filter((o) => o.chain).map((o) =>
    `${o.chain.family} ${o.chain.table} ${o.chain.name}`
  );
  const rules = (await inNode(node, ["/usr/sbin/ip", "rule"])) +
    (await inNode(node, ["/usr/sbin/ip", "-6", "rule"]));
  const links = JSON.parse(await inNode(node, ["/usr/sbin/ip", "-j", "link"]))
    .map((l: { ifname: string }) => l.ifname);
  return { tables: tables.sort(), chains: chains.sort(), rules, links: links.sort() };
}

/**
 * `view` without this release's NetworkPolicy fence (`inet enim_fence`, policy/fence.ts):
 * a table the previous release never had, which this release's agent takes away when it
 * stops.
 */
function withoutFence(view: Awaited<ReturnType<typeof kernelView>>) {
  const fence = (x: string) => x === "inet enim_fence" || x.startsWith("inet enim_fence ");
  return {
    ...view,
    tables: view.tables.filter((x) => !fence(x)),
    chains: view.chains.filter((x) => !fence(x)),
  };
}

Deno.test({
  name:
    `${PREVIOUS}'s node taken over by this release's agent and back, pods running and NetworkPolicy enforced throughout`,
  ignore: DEPS.skip !== null,
  async fn(t) {
    const previous = await releaseBuild(PREVIOUS);
    const current = await currentBuild();
    const c = await PolicyCluster.start();
    try {
      c.namespace("alpha", { team: "a" });
      const a = await c.node("node-a", { nodeNic: true, mock: { enis: 8 } }, previous.argv);
      const db = await c.pod(a, "node-a", "alpha", "db", { app: "db" }, []);
      const web = await c.pod(a, "node-a", "alpha", "web", { app: "web" }, []);
      const job = await c.pod(a, "node-a", "alpha", "job", { app: "job" }, []);
      const services = [
        servicePort("db", "172.30.0.10", db.v4, "tcp", 5432),
        servicePort("db", "172.30.0.10", db.v4, "udp", 53),
      ];
      await kubeProxyByHand(a, services);
      await admitOnlyWeb(c);
      const toDb = (addr: string): Probe[] => [
        { proto: "tcp", addr, port: 5432 },
        { proto: "udp", addr, port: 53 },
      ];
      const targets = [...toDb("172.30.0.10"), ...toDb(db.v4), ...toDb(db.v6)];
      const allowed = [toDb("172.30.0.10")[0], toDb(db.v4)[0], toDb(db.v6)[0]];
      const enforced = async (label: string) => {
        const ok = await web.prober.probe(allowed, 2_000);
        assertEquals(ok.map(passed), [true, true, true], `${label}: web → db ${ok}`);
        const denied = await job.prober.probe(targets, 1_000);
        assert(!denied.some(passed), `${label}: job → db ${denied}`);
      };
      await enforced(`under ${PREVIOUS}`);
      const before = await kernelView(a);

      const takeOver = async (to: EnimBuild, pods: ClusterPod[]) => {
        let started!: () => void;
        const until = new Promise<void>((r) => started = r).then(() =>
          new Promise((ok) => setTimeout(ok, 1_500))
        );
        const loop = probeUntil(job, targets, until);
        await a.stopAgent("SIGTERM");
        a.pluginArgv = to.argv; // the init container installs the new plugin first
        a.agentArgv = to.argv;
        await a.startAgent();
        await c.settle(30_000);
        started();
        const r = await loop;
        assertEquals(r.through, [], `${r.rounds} rounds of ${targets.length} probes`);
        assert(r.rounds >= 5, `${r.rounds} rounds`);
        const version = JSON.parse((await a.enim(["version", "--json"])).stdout).version;
        assertEquals(version, to.version);
        const s = await a.client.status();
        assertEquals(s.version, to.version);
        assertEquals(s.policy?.synced, true);
        const states = Object.fromEntries((s.policy?.pods ?? []).map((p) => [p.pod, p.state]));
        for (const p of pods) assertEquals(states[p.id], "enforced", p.id);
        const held = (await a.client.attachments()).map((x) => x.pod).sort();
        assertEquals(held, pods.map((p) => p.id).sort());
        await enforced(`under ${to.version}`);
        console.error(`${to.version} took over: ${r.rounds} rounds of ${targets.length} probes`);
        return r.rounds;
      };

      let late: ClusterPod | undefined;
      await t.step(`this release (${current.version}) takes over ${PREVIOUS}'s node`, async () => {
        await takeOver(current, [db, web, job]);
        // The same, and this release's fence, written at its first table check.
        const fenced = await poll(async () => {
          const v = await kernelView(a);
          return v.tables.includes("inet enim_fence") ? v : null;
        }, { timeoutMs: 20_000, intervalMs: 200 });
        assert(fenced, "this release's agent never wrote its fence");
        assertEquals(withoutFence(fenced), before, "the kernel as the previous release left it");
        late = await c.pod(a, "node-a", "alpha", "late", { app: "db" }, []);
        await c.settle();
        const denied = await job.prober.probe(toDb(late.v4), 1_000);
        assert(!denied.some(passed), `job → late ${denied}`);
      });
      await t.step(`${PREVIOUS} takes the node back (a rollback)`, async () => {
        assert(late);
        const afterNew = await kernelView(a);
        await takeOver(previous, [db, web, job, late]);
        // This release's agent took its fence away as it stopped: nothing is left armed
        // that the previous release's table never stamps for.
        assertEquals(
          await kernelView(a),
          withoutFence(afterNew),
          "the kernel as this release left it",
        );
        const denied = await job.prober.probe(toDb(late.v4), 1_000);
        assert(!denied.some(passed), `job → late ${denied}`);
        // The pod goes as kubelet has it go: its DEL, then its object (the ENI waits for
        // the API to stop showing the pod before it is reused).
        await c.del(late);
        c.remove("pods", "alpha", "late");
        await c.settle();
        const held = await poll(async () => {
          const pods = (await a.client.attachments()).map((x) => x.pod).sort();
          return pods.includes(late!.id) ? null : pods;
        }, { timeoutMs: 20_000, intervalMs: 200 });
        assertEquals(held, [db.id, job.id, web.id].sort());
      });
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      await c.close();
    }
  },
});
