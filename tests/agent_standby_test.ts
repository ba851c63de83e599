/**
 * The surge handover of the DaemonSet (issue 51, deploy/kubernetes/daemonset.yaml): a new
 * agent started while another one holds the node waits as a standby for its lock; its own
 * probe socket (`--probe-socket`, agent/probe.ts) answers live and ready from the start, so
 * kubelet lets the old pod go; it renews the replacement marker while it waits, so the
 * plugin holds calls for it once the old agent is gone, even one that left no record of a
 * graceful stop (0.1.0's, or one killed); then it takes the node over. The built bundle in
 * a simulated node, `enim probe` as kubelet runs it.
 *
 * @module
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { z } from "zod";
import { unixRequest } from "../api/client.ts";
import { parseAgentRecord } from "../api/wire.ts";
import { poll } from "../lib/async.ts";
import { runEnim } from "./support/enim.ts";
import { spawnAgent } from "./support/agent_proc.ts";
import { SimulatedNode } from "./support/node.ts";

const AS_ROOT = Deno.uid() === 0;

const AnswerSchema = z.object({
  ok: z.boolean(),
  phase: z.enum(["standby", "starting", "serving", "stopping"]),
  reason: z.optional(z.string()),
});
const MarkerSchema = z.object({ since: z.number() });

Deno.test({
  name: "a standby agent answers its own probes live and ready, renews the replacement marker, " +
    "and takes the node over when the serving agent dies: STATUS and an ADD meanwhile succeed",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 4 }, startAgent: false });
    const sb = node.sandbox;
    await node.startAgent(["--probe-socket", "/run/enim/probe-a.sock"]);
    const probe = async (name: string, path: "/healthz" | "/readyz") => {
      const res = await unixRequest(sb.host(name), "GET", path, undefined, 2000);
      return { status: res.status, ...AnswerSchema.parse(JSON.parse(res.body)) };
    };
    assertEquals(await probe("probe-a.sock", "/readyz"), {
      status: 200,
      ok: true,
      phase: "serving",
    });

    // The surge pod's agent: the node's socket already answers (the serving agent), so this
    // returns at once with the second process.
    const b = await spawnAgent(sb, {
      socket: node.socket,
      args: ["--probe-socket", "/run/enim/probe-b.sock"],
      stderrFile: sb.host("agent-b.stderr"),
    });
    try {
      const standby = await poll(
        () =>
          probe("probe-b.sock", "/readyz").then(
            (a) => a.phase === "standby" ? a : null,
            () => null,
          ),
        { timeoutMs: 20_000, intervalMs: 50 },
      );
      assertEquals(standby, { status: 200, ok: true, phase: "standby" }, b.stderr());
      assertEquals(await probe("probe-b.sock", "/healthz"), {
        status: 200,
        ok: true,
        phase: "standby",
      });
      // What kubelet runs (the DaemonSet's probes), the built bundle.
      for (const args of [[], ["--ready"]]) {
        const r = await runEnim(["probe", "--socket", "/run/enim/probe-b.sock", ...args], {
          sandbox: sb,
        });
        assertEquals(r.code, 0, r.stdout + r.stderr);
        assertEquals(AnswerSchema.parse(JSON.parse(r.stdout)).phase, "standby");
      }
      const none = await runEnim(["probe", "--socket", "/run/enim/none.sock"], { sandbox: sb });
      assertEquals(none.code, 1);
      assertStringIncludes(none.stderr, "/run/enim/none.sock");

      // The marker, renewed while it waits.
      const marker = async () =>
        MarkerSchema.parse(JSON.parse(await Deno.readTextFile(sb.host("replacing.json"))));
      const first = await marker();
      const renewed = await poll(
        async () => ((await marker()).since > first.since ? true : null),
        { timeoutMs: 15_000, intervalMs: 200 },
      );
      assert(renewed, "the standby renews the replacement marker");

      // The serving agent dies without a word (as 0.1.0's leaves none): the plugin holds.
      const fresh = await node.vpc.pod("fresh");
      await node.stopAgent("SIGKILL");
      const killedAt = Date.now();
      const adding = node.cni("ADD", node.podCall(fresh));
      const codes: number[] = [];
      let serving = null;
      while (!serving && Date.now() - killedAt < 30_000) {
        const s = await node.cni("STATUS", { config: node.netconf("1.1.0") });
        codes.push(s.code === 0 ? 0 : Number(s.json?.code));
        serving = await probe("probe-b.sock", "/readyz").then(
          (a) => a.phase === "serving" && a.ok ? a : null,
          () => null,
        );
      }
      assert(serving, `the standby never took over:\n${b.stderr()}\n${await node.agentLog()}`);
      const tookOver = Date.now() - killedAt;
      const added = await adding;
      assertEquals(added.code, 0, added.stdout + added.stderr);
      assert(codes.length > 0 && codes.every((c) => c === 0), `STATUS while handed over: ${codes}`);
      console.error(
        `handover: the standby served ${tookOver} ms after the serving agent was killed; ` +
          `${codes.length} STATUS calls meanwhile, all 0; the ADD made meanwhile succeeded`,
      );
      const record = parseAgentRecord(await Deno.readTextFile(sb.host("agent.json")));
      assertEquals(record?.pid, b.pid, "the record is the new agent's");
      assertEquals(
        await Deno.lstat(sb.host("replacing.json")).then(() => true, () => false),
        false,
        "the serving agent removed the marker",
      );
      assertEquals((await unixRequest(node.socket, "GET", "/v1/attachments")).status, 200);
    } finally {
      assertEquals((await b.stop("SIGTERM")).code, 0, b.stderr());
    }
    assertEquals(
      await Deno.lstat(sb.host("probe-b.sock")).then(() => true, () => false),
      false,
      "the probe socket goes with its agent",
    );
  },
});
