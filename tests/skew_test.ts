/**
 * A plugin and an agent of different versions (issue 51 item 4): every CNI verb (VERSION,
 * ADD, CHECK, STATUS, GC, DEL) with this tree's plugin against the previous release's
 * agent and the previous release's plugin against this tree's agent — the previous release
 * built from history (`releases.json`, `tests/support/releases.ts`), each side running its
 * own bundle with its own permission set in one simulated node. In a rollout the
 * DaemonSet's init container replaces the plugin before the new agent starts (plugin N,
 * agent N−1); a rollback does the reverse. Outside the supported skew (one minor version
 * either way) the agent refuses the call with code 112 naming both versions.
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { SimulatedNode } from "./support/node.ts";
import { currentBuild, type EnimBuild, releaseBuild } from "./support/releases.ts";
import { previousRelease } from "../scripts/_releases.ts";
import { bodyText, encodeRequest, unixRoundTrip } from "../lib/http1.ts";
import {
  AGENT_VERSION_HEADER,
  CNI_CALL_PATH,
  EXIT_HEADER,
  PLUGIN_VERSION_HEADER,
  skewProblem,
} from "../api/wire.ts";
import { VERSION } from "../lib/version.ts";

const AS_ROOT = Deno.uid() === 0;
const PREVIOUS = previousRelease().version;

/** Every verb, plugin of `plugin` against agent of `agent`, on one simulated node. */
async function everyVerb(t: Deno.TestContext, plugin: EnimBuild, agent: EnimBuild) {
  await using node = await SimulatedNode.start({
    mock: { enis: 4 },
    gc: { graceSeconds: 0 },
    startAgent: false,
  });
  node.agentArgv = agent.argv;
  node.pluginArgv = plugin.argv;
  await node.startAgent();
  const version = await node.enim(["version", "--json"]);
  assertEquals(JSON.parse(version.stdout).version, agent.version, "the agent's build");

  await t.step("VERSION", async () => {
    const r = await node.cni("VERSION", { config: node.netconf("1.1.0") });
    assertEquals(r.code, 0, r.stdout + r.stderr);
    assert((r.json?.supportedVersions as string[]).includes("1.1.0"));
  });
  await t.step("STATUS", async () => {
    const r = await node.cni("STATUS", { config: node.netconf("1.1.0") });
    assertEquals([r.code, r.stdout.trim()], [0, ""], r.stdout + r.stderr);
  });
  const a = await node.vpc.pod("a");
  const b = await node.vpc.pod("b");
  let prevResult: unknown;
  await t.step("ADD", async () => {
    const res = await node.add(a);
    prevResult = res;
    assert(res.ips.length > 0);
    assert(await node.vpc.ping(a, node.vpc.gateways.ipv4!), "the pod reaches its gateway");
    await node.add(b);
  });
  await t.step("CHECK", async () => {
    const r = await node.cni(
      "CHECK",
      node.podCall(a, { config: node.netconf("1.1.0", { prevResult }) }),
    );
    assertEquals(r.code, 0, r.stdout + r.stderr);
  });
  await t.step("GC", async () => {
    const r = await node.cni("GC", {
      config: node.netconf("1.1.0", {
        "cni.dev/valid-attachments": [{ containerID: "c-a", ifname: "eth0" }],
      }),
    });
    assertEquals(r.code, 0, r.stdout + r.stderr);
    assertEquals((await node.client.attachments()).map((x) => x.pod), ["default/a"]);
  });
  await t.step("DEL", async () => {
    await node.del(a);
    await node.del(b);
    assertEquals(await node.client.attachments(), []);
  });
}

Deno.test({
  name: `every verb with this plugin (${VERSION}) against the previous release's agent`,
  ignore: !AS_ROOT,
  async fn(t) {
    await everyVerb(t, await currentBuild(), await releaseBuild(PREVIOUS));
  },
});

Deno.test({
  name: `every verb with the previous release's plugin against this agent (${VERSION})`,
  ignore: !AS_ROOT,
  async fn(t) {
    await everyVerb(t, await releaseBuild(PREVIOUS), await currentBuild());
  },
});

Deno.test("the supported skew is one minor version either way, within one major version", () => {
  assertEquals(skewProblem("0.1.0", "0.2.0"), undefined);
  assertEquals(skewProblem("0.3.5", "0.2.0"), undefined);
  assertEquals(skewProblem("1.4.0", "1.4.9"), undefined);
  for (
    const [p, a] of [["0.1.0", "0.3.0"], ["0.4.0", "0.2.0"], ["1.0.0", "0.9.0"], ["x", "0.2.0"]]
  ) {
    const why = skewProblem(p, a);
    assert(why, `${p} with ${a}`);
    assertStringIncludes(why, `plugin "${p}" and agent "${a}"`);
  }
});

Deno.test({
  name: "the agent refuses a call from a plugin outside the skew with 112 naming both versions",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const pod = await node.vpc.pod("p");
    const call = node.podCall(pod);
    const env = {
      CNI_COMMAND: "ADD",
      CNI_CONTAINERID: call.containerId!,
      CNI_NETNS: call.netns!,
      CNI_IFNAME: "eth0",
      CNI_ARGS: call.args!,
      CNI_PATH: "/opt/cni/bin",
    };
    const body = new TextEncoder().encode(
      JSON.stringify({ env, stdin: JSON.stringify(node.netconf("1.0.0")) }),
    );
    for (const plugin of ["0.4.0", "1.2.0"]) {
      const res = await unixRoundTrip(
        node.socket,
        encodeRequest("POST", CNI_CALL_PATH, body, { [PLUGIN_VERSION_HEADER]: plugin }),
        10_000,
      );
      assertEquals(res.status, 200);
      assertEquals(res.headers.get(EXIT_HEADER), "1");
      assertEquals(res.headers.get(AGENT_VERSION_HEADER), VERSION);
      const err = JSON.parse(bodyText(res));
      assertEquals([err.cniVersion, err.code], ["1.0.0", 112]);
      assertStringIncludes(err.msg, `plugin "${plugin}" and agent "${VERSION}"`);
    }
    assertEquals(await node.client.attachments(), [], "nothing was done");
  },
});
