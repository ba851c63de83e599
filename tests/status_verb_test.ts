/**
 * The CNI STATUS verb through the real plugin against the real agent: 0 while the agent
 * is up and reconciled, a full pool included (issue 33 item 1: containerd ≥ 2.0.1 runs
 * STATUS on every CRI Status, and a failure there makes kubelet mark the node NotReady
 * and evict every pod on it), 50 once the agent is gone (killed here; an agent stopped
 * gracefully is being replaced: tests/restart_status_test.ts). A full pool is said by
 * `enim status`, its `--json` and `enim_pool_exhausted` instead.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { StatusSchema } from "../api/schema.ts";
import { ROOT } from "../scripts/_paths.ts";
import { SimulatedNode } from "./support/node.ts";
import { pluginDir, tempDir } from "./support/clients.ts";
import { getStatusNetworkList } from "./support/libcni/status.ts";

const AS_ROOT = Deno.uid() === 0;

Deno.test({
  name:
    "STATUS answers 0 with every ENI owned (the plugin, and libcni's GetStatusNetworkList over the shipped conflist as containerd 2.x runs it), says the pool is exhausted elsewhere, and 50 once the agent is killed",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 2, maxEnisPerNode: 2 } });
    const status = () => node.cni("STATUS", { config: node.netconf("1.1.0") });
    const dir = await tempDir("enim-status");
    try {
      await pluginDir(`${dir}/plugins`, []);
      const conflist = await Deno.readTextFile(`${ROOT}/deploy/10-enim.conflist`);
      const asContainerd = () =>
        getStatusNetworkList(node, conflist, [`${dir}/plugins`], {
          ENIM_LOG_FILE: node.sandbox.inner("cni.log"),
        });

      const ok = await status();
      assertEquals([ok.code, ok.stdout.trim()], [0, ""], ok.stderr);

      // Every ENI owned: one by a pod, one held for a sticky pod after its DEL.
      const web = await node.vpc.pod("web");
      await node.add(web);
      const db = await node.vpc.pod("db");
      const sticky = node.netconf("1.1.0", {
        runtimeConfig: { "io.kubernetes.cri.pod-annotations": { "enim.dev/sticky": "true" } },
      });
      await node.add(db, { config: sticky });
      await node.del(db, { config: sticky });
      const full = await node.client.status();
      assertEquals(
        [full.pool.free, full.pool.owned, full.pool.held, full.pool.attachable],
        [0, 2, 1, 0],
      );
      assertEquals(full.canAllocate, false);

      await t.step("the plugin's STATUS: 0, nothing printed", async () => {
        const r = await status();
        assertEquals([r.code, r.stdout.trim()], [0, ""], r.stdout + r.stderr);
      });

      await t.step("libcni's GetStatusNetworkList over deploy/10-enim.conflist: 0", async () => {
        const r = await asContainerd();
        assertEquals(r, { ok: true, ran: ["enim"] });
      });

      await t.step(
        "enim status, its --json and the metrics say the pool is exhausted",
        async () => {
          const text = await node.enim(["status"]);
          assertEquals(text.code, 0, text.stderr);
          assertMatch(text.stdout, /^provider mock, agent \S+, ready, CANNOT ALLOCATE$/m);
          assertMatch(
            text.stdout,
            /^POOL EXHAUSTED: no free ENI and no room to attach another \(free 0, owned 2, recycling 0, held 1, attachable 0\)/m,
          );
          assertStringIncludes(text.stdout, "the node's network stays ready (CNI STATUS 0)");
          assertEquals(full.pool.exhausted, true);
          const json = await node.enim(["status", "--json"]);
          assertEquals(StatusSchema.parse(JSON.parse(json.stdout)).pool.exhausted, true);
          const metrics = await node.client.metrics();
          assertMatch(metrics, /^enim_pool_exhausted\{profile="default"\} 1$/m);
          assertMatch(metrics, /^enim_ready 1$/m);
        },
      );

      await t.step("an ADD then finds no ENI: 100, as before", async () => {
        const late = await node.vpc.pod("late");
        const r = await node.cni("ADD", node.podCall(late));
        assertEquals([r.code, r.json?.code], [1, 100], r.stdout);
      });

      await t.step("STATUS before 1.1.0 does not exist: 1", async () => {
        const old = await node.cni("STATUS", { config: node.netconf("1.0.0") });
        assertEquals(old.json?.code, 1);
      });

      // Killed, not stopped gracefully: gone, not being replaced (tests/restart_status_test.ts).
      await node.stopAgent("SIGKILL");
      await t.step("the agent killed: 50 naming the socket, both ways", async () => {
        const down = await status();
        assertEquals(down.code, 1);
        assert(down.json, down.stdout + down.stderr);
        assertEquals(down.json.code, 50);
        assertStringIncludes(String(down.json.msg), "not reachable");
        assertStringIncludes(String(down.json.msg), '"/run/enim/enim.sock"');
        const r = await asContainerd();
        assert(!r.ok);
        assertEquals([r.plugin, r.code], ["enim", 50]);
      });
    } finally {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
