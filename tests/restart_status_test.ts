/**
 * CNI STATUS, ADD and DEL while the agent is being replaced (issue 51 item 2), with the
 * built bundle in a simulated node: an agent stopped gracefully (SIGTERM, as kubelet stops
 * the DaemonSet's old pod in a rollout) leaves its record beside the socket, and for
 * `RESTART_GRACE_SECONDS` the plugin answers STATUS success and holds ADD and DEL for the
 * next agent; an agent that does not come back is gone after the grace (STATUS 50), and one
 * that was killed is gone at once.
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { parseAgentRecord, RESTART_GRACE_SECONDS } from "../api/wire.ts";
import { VERSION } from "../lib/version.ts";
import { SimulatedNode } from "./support/node.ts";

const AS_ROOT = Deno.uid() === 0;

async function record(node: SimulatedNode) {
  const text = await Deno.readTextFile(node.sandbox.host("agent.json")).catch(() => "");
  return parseAgentRecord(text);
}

Deno.test({
  name:
    "an agent stopped gracefully then restarted: STATUS never 50, and an ADD and a DEL sent while it is away wait for the new agent and succeed",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 4 } });
    const status = () => node.cni("STATUS", { config: node.netconf("1.1.0") });
    const serving = await record(node);

    const old = await node.vpc.pod("old");
    await node.add(old);
    await node.stopAgent("SIGTERM");
    const stopped = await record(node);

    const away = await status();
    assertEquals([away.code, away.stdout.trim()], [0, ""], away.stdout + away.stderr);
    assertEquals([serving?.version, serving?.stoppedAt], [VERSION, undefined]);
    assert(stopped?.stoppedAt !== undefined, "a graceful stop is recorded");
    const log = await Deno.readTextFile(node.sandbox.host("cni.log"));
    assertStringIncludes(log, "is being replaced");

    // An ADD and a DEL sent while no agent serves: both wait for the next one.
    const fresh = await node.vpc.pod("fresh");
    const adding = node.cni("ADD", node.podCall(fresh));
    const deleting = node.cni("DEL", node.podCall(old));
    // The plugin processes are waiting (their log lines come when they answer).
    const waited: number[] = [];
    for (let i = 0; i < 3; i++) {
      const s = await status();
      waited.push(s.code);
    }
    assertEquals(waited, [0, 0, 0], "STATUS stays 0 while the agent is away");
    const before = Date.now();
    await node.startAgent();
    const [added, deleted] = await Promise.all([adding, deleting]);
    assertEquals(added.code, 0, added.stdout + added.stderr);
    assertEquals(deleted.code, 0, deleted.stdout + deleted.stderr);
    console.error(
      `ADD and DEL answered ${Date.now() - before} ms after the new agent was started`,
    );
    const attachments = await node.client.attachments();
    assertEquals(attachments.map((a) => a.pod), ["default/fresh"]);
    const back = await status();
    assertEquals(back.code, 0, back.stdout);
    assertEquals((await record(node))?.stoppedAt, undefined, "the new agent's record");
  },
});

Deno.test({
  name:
    "an agent gone for good: STATUS 0 within the grace after its graceful stop, 50 after it (measured); a killed agent: 50 at once",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const status = () => node.cni("STATUS", { config: node.netconf("1.1.0") });
    await node.stopAgent("SIGTERM");
    const stoppedAt = (await record(node))!.stoppedAt!;
    const codes: number[] = [];
    let firstDown = 0;
    // One STATUS a second, as kubelet's runtime-status check does (every 5 s), until 50.
    for (;;) {
      const s = await status();
      const code = s.code === 0 ? 0 : Number(s.json?.code);
      codes.push(code);
      if (code !== 0) {
        firstDown = Date.now();
        break;
      }
      assert(codes.length < 2 * RESTART_GRACE_SECONDS, "STATUS never turned 50");
      await new Promise((r) => setTimeout(r, 1000));
    }
    assertEquals(codes.at(-1), 50);
    assert(codes.slice(0, -1).every((c) => c === 0));
    const seconds = (firstDown - stoppedAt) / 1000;
    console.error(
      `STATUS 0 for ${codes.length - 1} calls, 50 from ${seconds.toFixed(1)} s after the stop`,
    );
    assert(seconds >= RESTART_GRACE_SECONDS, `50 after ${seconds} s`);

    // A killed agent leaves no graceful stop: gone at once.
    await node.startAgent();
    await node.stopAgent("SIGKILL");
    const killed = await status();
    assertEquals(killed.json?.code, 50, killed.stdout);
  },
});
