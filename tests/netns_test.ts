/**
 * The namespace a request names is proven before anything moves (issues 13.6,
 * 17.1, 17.2, 17.4), through the real plugin process and through the API, on
 * the real kernel: every path that is not a pod's network namespace gets 103 /
 * HTTP 400 naming the path and what it is, nothing is allocated, and a
 * namespace replaced during an ADD never receives the device.
 */
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { ApiError } from "../api/schema.ts";
import { SimulatedNode } from "./support/node.ts";

const AS_ROOT = Deno.uid() === 0;
const ARGS = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;IgnoreUnknown=1";
/** Whether this machine lets root read PID 1's namespaces. */
const INIT_READABLE = (() => {
  try {
    Deno.readLinkSync("/proc/1/ns/net");
    return true;
  } catch {
    return false;
  }
})();

Deno.test({
  name: "a path that is not a pod's network namespace gets 103 naming it, and nothing moves",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    // Fixtures under /run/netns, seen by the agent (the sandbox propagates /run/netns).
    const tag = crypto.randomUUID().slice(0, 8);
    const file = `/run/netns/enim-t-file-${tag}`;
    const dir = `/run/netns/enim-t-dir-${tag}`;
    const link = `/run/netns/enim-t-link-${tag}`;
    await Deno.writeTextFile(file, "not a namespace");
    await Deno.mkdir(dir);
    await Deno.symlink(node.vpc.node.path, link);
    try {
      const cases: [string, string, RegExp][] = [
        ["a regular file", file, /is a regular file, not a network namespace/],
        ["a directory", dir, /is a directory, not a network namespace/],
        ["a missing path", `/run/netns/enim-t-none-${tag}`, /does not exist/],
        ["/dev/null", "/dev/null", /outside the places enim reads namespaces from/],
        ["/etc/passwd", "/etc/passwd", /outside the places enim reads namespaces from/],
        ["a mount namespace", "/proc/self/ns/mnt", /is a mnt namespace, not a network namespace/],
        ["a uts namespace", "/proc/1/ns/uts", /is a uts namespace/],
        ["the agent's own namespace", node.vpc.node.path, /the agent's own network namespace/],
        ["a symlink to the agent's own", link, /the agent's own network namespace/],
        ["the agent's own, by /proc", "/proc/self/ns/net", /the agent's own network namespace/],
        // Where PID 1 holds capabilities root here lacks (this sandbox), it cannot be read.
        [
          "the host's initial namespace",
          "/proc/1/ns/net",
          INIT_READABLE ? /the host's initial network namespace/ : /cannot be read by the agent/,
        ],
      ];
      for (const [name, path, re] of cases) {
        await t.step(`${name}: the plugin`, async () => {
          const r = await node.cni("ADD", {
            containerId: `cn-${tag}`,
            ifName: "eth0",
            netns: path,
            args: ARGS,
            config: node.netconf(),
          });
          assertEquals(r.code, 1, r.stdout + r.stderr);
          assertEquals(r.json!.code, 103, String(r.json!.msg));
          const msg = String(r.json!.msg);
          assertMatch(msg, re);
          assert(msg.includes(`"${path}"`), `the message names the path: ${msg}`);
          assert(!/--allow|run again/.test(r.stdout), `no runtime hint: ${r.stdout}`);
        });
        await t.step(`${name}: the API`, async () => {
          try {
            await node.client.add({
              containerId: `ca-${tag}`,
              ifName: "eth0",
              netns: path,
              network: "n",
              pod: { namespace: "default", name: "p" },
              mode: "interface",
            });
            throw new Error("the ADD was accepted");
          } catch (err) {
            assert(err instanceof ApiError, String(err));
            assertEquals(err.code, "netns_invalid");
            assertMatch(err.message, re);
            assert(!/--allow|run again/.test(err.message), err.message);
          }
        });
      }
      assertEquals(await node.client.attachments(), [], "nothing recorded");
      assertEquals((await node.client.status()).pool.owned, 0, "nothing allocated");
    } finally {
      await Deno.remove(file).catch(() => {});
      await Deno.remove(dir).catch(() => {});
      await Deno.remove(link).catch(() => {});
    }
  },
});

Deno.test({
  name: "a namespace replaced during the ADD never receives the device: 103, nothing kept",
  ignore: !AS_ROOT,
  async fn() {
    // The ENI is attached on demand, 1.5 s: time enough to replace the pod's namespace.
    await using node = await SimulatedNode.start({
      mock: { enis: 1, preattached: 0, attachLatencyMs: 1500 },
    });
    const pod = await node.vpc.pod("swap");
    const adding = node.cni("ADD", {
      containerId: "cswap",
      ifName: "eth0",
      netns: pod.path,
      args: ARGS,
      config: node.netconf(),
    });
    // Wait for the intent (the namespace was proven and is held), then swap the path.
    const until = Date.now() + 5000;
    while ((await node.client.attachments()).length === 0) {
      assert(Date.now() < until, "the ADD did not start");
      await new Promise((r) => setTimeout(r, 20));
    }
    await node.vpc.deletePod(pod);
    const again = await node.vpc.pod("swap");
    const r = await adding;
    assertEquals(r.code, 1, r.stdout);
    assertEquals(r.json!.code, 103);
    assertMatch(String(r.json!.msg), /was replaced during the ADD/);
    const inNew = await node.vpc.exec(again, ["/usr/sbin/ip", "-o", "link", "show"]);
    assert(!inNew.stdout.includes("eth0"), "the new namespace got no device");
    assertEquals(await node.client.attachments(), []);
    const status = await node.client.status();
    assertEquals([status.pool.owned, status.pool.free], [0, 1], "the ENI is free again");
    const onNode = await node.vpc.exec(node.vpc.node, ["/usr/sbin/ip", "-o", "link", "show"]);
    assert(onNode.stdout.includes(status.enis[0].mac), "its device is back on the node");
  },
});
