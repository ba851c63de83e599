/**
 * The CNI STATUS verb through the real plugin against the real agent: 0 while an
 * ADD can be served, 50 once the pool is exhausted, 50 when the agent is gone.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { SimulatedNode } from "./support/node.ts";

const AS_ROOT = Deno.uid() === 0;

Deno.test({
  name: "STATUS returns 0, then 50 once the pool is exhausted, then 50 after the agent stops",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2, maxEnisPerNode: 2 } });
    const status = () => node.cni("STATUS", { config: node.netconf("1.1.0") });

    const ok = await status();
    assertEquals(ok.code, 0, ok.stdout + ok.stderr);
    assertEquals(ok.stdout.trim(), "", "STATUS prints nothing on success");

    for (const name of ["s1", "s2"]) {
      const pod = await node.vpc.pod(name);
      const add = await node.cni("ADD", {
        containerId: `c-${name}`,
        ifName: "eth0",
        netns: pod.path,
        args: `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name}`,
        config: node.netconf("1.1.0"),
      });
      assertEquals(add.code, 0, add.stdout + add.stderr);
    }
    const exhausted = await status();
    assertEquals(exhausted.code, 1);
    assert(exhausted.json, exhausted.stdout + exhausted.stderr);
    assertEquals(exhausted.json.cniVersion, "1.1.0");
    assertEquals(exhausted.json.code, 50);
    assertMatch(String(exhausted.json.msg), /pool is exhausted/);
    assertStringIncludes(String(exhausted.json.msg), "free 0");

    // STATUS before 1.1.0 does not exist.
    const old = await node.cni("STATUS", { config: node.netconf("1.0.0") });
    assertEquals(old.json?.code, 1);

    await node.stopAgent();
    const down = await status();
    assertEquals(down.code, 1);
    assert(down.json, down.stdout + down.stderr);
    assertEquals(down.json.code, 50);
    assertStringIncludes(String(down.json.msg), "not reachable");
    assertStringIncludes(String(down.json.msg), '"/run/enim/enim.sock"');
  },
});
