/**
 * Reads and a DEL that has answered but not finished (issue 33 item 7): a DEL answers
 * once its intent is recorded and the pod's namespace held, before its device is home.
 * Holding that rest (the device's move home, paused in `ip`) must not hold `enim status`,
 * CNI STATUS, the attachments or `enim gc --dry-run`: each answers and shows the DEL as
 * unfinished, not as "an earlier release did not finish". Once the rest goes on, the
 * reads show it done.
 *
 * Nor may it cost the next ADD its ENI (issue 41 item 3): on a full node, ADDs that come
 * while such a DEL is finishing wait for it rather than answer 100 "No ENI available".
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { StatusSchema } from "../api/schema.ts";
import { SimulatedNode } from "./support/node.ts";
import { IpFaults } from "./support/ip_faults.ts";

const AS_ROOT = Deno.uid() === 0;

/** The DEL's move of the device back to the node (as tests/fault_matrix_test.ts names it). */
const DEL_MOVE_BACK = String.raw`link\sset\sdev\s\S+\snetns\s\S+\sname\s`;

Deno.test({
  name:
    "a DEL whose device is still on its way home holds no read: status, CNI STATUS, attachments and gc --dry-run answer, showing it unfinished",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({
      mock: { enis: 2 },
      gc: { intervalSeconds: 3600, graceSeconds: 0 },
    });
    const faults = await IpFaults.install(node);
    try {
      const pod = await node.vpc.pod("slowdel");
      const call = node.podCall(pod, { containerId: "c-slowdel" });
      const added = await node.cni("ADD", call);
      assertEquals(added.code, 0, added.stdout);
      const eniId = (await node.client.attachments())[0].eniId;

      await faults.pause("pod", DEL_MOVE_BACK);
      const del = await node.cni("DEL", call);
      assertEquals([del.code, del.stdout.trim()], [0, ""], "the DEL answered");
      await faults.hit(); // its rest is held at the move home from now on

      const [text, json, cniStatus, attachments, dry] = await Promise.all([
        node.enim(["status"]),
        node.enim(["status", "--json"]),
        node.cni("STATUS", { config: node.netconf("1.1.0") }),
        node.client.attachments(),
        node.enim(["gc", "--dry-run"]),
      ]);

      // Answered while the DEL is held: each shows it unfinished.
      assertEquals(attachments.length, 1, "the record is still there");
      assertEquals(attachments[0].state, "deleting");
      assert(attachments[0].delAnsweredAt !== null, "the attachment says its DEL answered");

      assertEquals(json.code, 0, json.stderr);
      const status = StatusSchema.parse(JSON.parse(json.stdout));
      assertEquals(
        status.unfinishedDels.map((d) => [d.containerId, d.eniId]),
        [["c-slowdel", eniId]],
      );

      assertEquals(text.code, 0, text.stderr);
      assertMatch(text.stdout, /DEL FINISHING: default\/slowdel .*its DEL answered \d+s ago/);
      assertMatch(text.stdout, /deleting \(DEL answered \d+s ago, finishing\)/);

      assertEquals([cniStatus.code, cniStatus.stdout.trim()], [0, ""], "STATUS answers 0");

      assertEquals(dry.code, 0, dry.stderr);
      assert(!dry.stdout.includes("an earlier release did not finish"), dry.stdout);
      assertStringIncludes(dry.stdout, "dry run: nothing to reclaim");
      assertStringIncludes(dry.stdout, "1 DEL still finishing");
      assertMatch(dry.stdout, /default\/slowdel\s+c-slowdel\s+eth0\s+\d+s ago/);

      // The rest goes on: the reads then show the DEL done and the ENI free.
      await faults.go();
      const done = await poll(async () => {
        const s = await node.client.status();
        return s.unfinishedDels.length === 0 && s.pool.free === 2 ? s : null;
      }, { timeoutMs: 15_000, intervalMs: 100 });
      assert(done, "the DEL finished once its move went on");
      assertEquals(await node.client.attachments(), []);
    } finally {
      await faults.uninstall();
    }
  },
});

/** The network config of a Kubernetes node's pods (the host link on, as for kubelet's pods). */
const KUBE_CONF = { serviceCidrs: ["172.30.0.0/16"] };

Deno.test({
  name:
    "a full node's ADDs right after a DEL answered early all get an ENI: three at once on three ENIs, the DEL's on its way home, 12 rounds",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({
      nodeNic: true,
      mock: { enis: 3, maxEnisPerNode: 3 },
      gc: { intervalSeconds: 3600, graceSeconds: 0 },
      // Beyond what a loaded test machine takes (the plugin's own 30 s is the ceiling).
      extra: { timeouts: { delWaitSeconds: 20 } },
    });
    const faults = await IpFaults.install(node);
    const conf = node.netconf("1.1.0", KUBE_CONF);
    const ROUNDS = 12;
    try {
      for (let round = 0; round < ROUNDS; round++) {
        const a = await node.vpc.pod(`a${round}`);
        const callA = node.podCall(a, { containerId: `c-a${round}`, config: conf });
        const added = await node.cni("ADD", callA);
        assertEquals(added.code, 0, added.stdout);
        const eniOfA = (await node.client.attachments())[0].eniId;
        const next = await Promise.all(["b", "c", "d"].map((p) => node.vpc.pod(`${p}${round}`)));

        // The DEL answers; the rest (the device's move home, then the ENI's release) is
        // held at the move, as a loaded node's kernel holds it; the runtime removes the
        // pod's namespace, and three ADDs come at once.
        await faults.pause("pod", DEL_MOVE_BACK);
        const del = await node.cni("DEL", callA);
        assertEquals([del.code, del.stdout.trim()], [0, ""], "the DEL answered");
        await faults.hit();
        await node.vpc.deletePod(a);
        const answered: (number | null)[] = [null, null, null];
        const adds = next.map((p, i) =>
          node.cni("ADD", node.podCall(p, { containerId: `c-${p.name}`, config: conf }))
            .then((r) => (answered[i] = r.code, r))
        );
        // Two of them have the free ENIs; then the DEL's rest goes on.
        const two = await poll(
          () => Promise.resolve(answered.filter((c) => c !== null).length >= 2 || null),
          { timeoutMs: 60_000, intervalMs: 50 },
        );
        await faults.go();
        const results = await Promise.all(adds);
        assert(two, `round ${round}: two ADDs answered`);
        for (const r of results) {
          assertEquals(r.code, 0, `round ${round}: every ADD gets an ENI: ${r.stdout}`);
        }
        const atts = await node.client.attachments();
        assertEquals(atts.length, 3, `round ${round}: three pods`);
        assert(
          atts.some((x) => x.eniId === eniOfA),
          `round ${round}: one of them got the DEL's ENI`,
        );

        for (const [i, p] of next.entries()) {
          const r = await node.cni(
            "DEL",
            node.podCall(p, { containerId: `c-${p.name}`, config: conf }),
          );
          assertEquals(r.code, 0, `round ${round}: DEL ${i}: ${r.stdout}`);
          await node.vpc.deletePod(p);
        }
        const free = await poll(async () => {
          const s = await node.client.status();
          return s.unfinishedDels.length === 0 && s.pool.free === 3 ? s : null;
        }, { timeoutMs: 30_000, intervalMs: 100 });
        assert(free, `round ${round}: every ENI back in the pool`);
      }
      // The waits are the ADDs' del_wait phase: at least one ADD of each round waited.
      const metrics = await node.client.metrics();
      const waited = Number(
        metrics.match(/enim_phase_duration_seconds_count\{op="add",phase="del_wait"\} (\d+)/)
          ?.[1] ?? 0,
      );
      assert(waited >= ROUNDS, `${waited} ADDs waited for a DEL in ${ROUNDS} rounds`);
    } finally {
      await faults.uninstall();
    }
  },
});
