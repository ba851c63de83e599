/**
 * The CNI spec's edge cases on the real kernel, through the plugin process as a
 * runtime execs it (issue 13): GC per network and its keys, two enim interfaces
 * in one pod, and bad config values refused before anything is allocated, for
 * every spec version that has the verb; and with the agent stopped, the calls
 * that are wrong whatever the agent says answered as the agent answers them.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { SUPPORTED_VERSIONS } from "../cni/spec.ts";
import { CNI_CALL_PATH, EXIT_HEADER } from "../api/wire.ts";
import { encodeRequest, unixRoundTrip } from "../lib/http1.ts";
import { SimulatedNode } from "./support/node.ts";
import { SPEC_CASES, specCall } from "./support/spec_cases.ts";
import type { NetnsHandle } from "./support/vpc.ts";

const AS_ROOT = Deno.uid() === 0;

function podArgs(name: string): string {
  return `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1`;
}

function add(
  node: SimulatedNode,
  pod: NetnsHandle,
  id: string,
  config: Record<string, unknown>,
  ifName = "eth0",
) {
  return node.cni("ADD", {
    containerId: id,
    ifName,
    netns: pod.path,
    args: podArgs(pod.name),
    config,
  });
}

async function inPod(node: SimulatedNode, pod: NetnsHandle, argv: string[]): Promise<string> {
  const out = await node.vpc.exec(pod, argv);
  assertEquals(out.code, 0, out.stderr);
  return out.stdout;
}

Deno.test({
  name:
    "GC: only its own network, cni.dev/attachments read too, unlisted attachments past the grace period go",
  ignore: !AS_ROOT,
  async fn() {
    // No grace period: a CNI GC's list alone leaves younger attachments (manager/gc_test.ts).
    await using node = await SimulatedNode.start({
      mock: { enis: 4 },
      gc: { graceSeconds: 0 },
    });
    const a = await node.vpc.pod("ga"), b = await node.vpc.pod("gb"), c = await node.vpc.pod("gc");
    const netA = node.netconf("1.1.0", { name: "net-a" });
    const netB = node.netconf("1.1.0", { name: "net-b" });
    for (const [pod, id, cfg] of [[a, "cga", netA], [b, "cgb", netA], [c, "cgc", netB]] as const) {
      assertEquals((await add(node, pod, id, cfg)).code, 0);
    }
    // Right after the ADDs, with the key some 1.1.0 texts name.
    const gc = await node.cni("GC", {
      config: { ...netA, "cni.dev/attachments": [{ containerID: "cga", ifname: "eth0" }] },
    });
    assertEquals(gc.code, 0, gc.stdout);
    assertEquals(
      (await node.client.attachments()).map((x) => x.containerId).sort(),
      ["cga", "cgc"],
      "net-a's unlisted cgb went; net-b's cgc stayed",
    );
    assert(!(await inPod(node, b, ["/usr/sbin/ip", "-o", "link", "show"])).includes("eth0"));
    assertEquals((await node.client.status()).pool.owned, 2);
    // Neither key: code 7 naming both.
    const none = await node.cni("GC", { config: netA });
    assertEquals([none.code, none.json!.code], [1, 7]);
    assertStringIncludes(String(none.json!.msg), "cni.dev/valid-attachments");
  },
});

Deno.test({
  name:
    "two enim interfaces in one pod: the second with defaultRoutes false; without it a clear 105",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 3 } });
    const pod = await node.vpc.pod("two");
    const first = await add(node, pod, "c2", node.netconf("1.1.0", { name: "net-1" }), "eth0");
    assertEquals(first.code, 0, first.stdout);
    // The same again on eth1 would bring a second default route per family (and a second
    // host link, whose pod end's name clashes first: this case is about the routes).
    const clash = await add(
      node,
      pod,
      "c2",
      node.netconf("1.1.0", { name: "net-2", hostLink: { enabled: false } }),
      "eth1",
    );
    assertEquals([clash.code, clash.json!.code], [1, 105]);
    assertMatch(String(clash.json!.msg), /already has a route to (0\.0\.0\.0|::)\/0/);
    assertStringIncludes(String(clash.json!.msg), '"defaultRoutes": false');
    assertEquals((await node.client.status()).pool.owned, 1, "the failed ADD kept nothing");
    const second = await add(
      node,
      pod,
      "c2",
      node.netconf("1.1.0", { name: "net-2", defaultRoutes: false }),
      "eth1",
    );
    assertEquals(second.code, 0, second.stdout);
    assertEquals((second.json!.routes as unknown[]).length, 0, "no routes in its result");
    const links = await inPod(node, pod, ["/usr/sbin/ip", "-o", "link", "show"]);
    assert(links.includes("eth0") && links.includes("eth1"), links);
    const routes = await inPod(node, pod, ["/usr/sbin/ip", "-4", "route", "show", "default"]);
    assertStringIncludes(routes, "dev eth0");
    assert(!routes.includes("dev eth1"), routes);
    assert(await node.vpc.ping(pod, node.vpc.gateways.ipv4!), "the pod reaches its gateway");
    for (const [ifName, net] of [["eth1", "net-2"], ["eth0", "net-1"]]) {
      const del = await node.cni("DEL", {
        containerId: "c2",
        ifName,
        netns: pod.path,
        args: podArgs("two"),
        config: node.netconf("1.1.0", { name: net }),
      });
      assertEquals(del.code, 0, del.stdout);
    }
    assertEquals((await node.client.status()).pool.owned, 0);
  },
});

Deno.test({
  name: "bad route and range values are refused with 7 before anything is allocated, every version",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const pod = await node.vpc.pod("bad");
    const cases: [string, Record<string, unknown>, RegExp][] = [
      [
        "a gateway of the other family",
        { routes: [{ dst: "10.0.0.0/8", gw: "fd00:99::1" }] },
        /routes\.0\.gw: Expected the gateway of the same family/,
      ],
      [
        "a destination with host bits",
        { routes: [{ dst: "10.1.2.3/8" }] },
        /routes\.0\.dst: .*did you mean 10\.0\.0\.0\/8/,
      ],
      ["a destination that is no prefix", { routes: [{ dst: "default" }] }, /routes\.0\.dst/],
      [
        "an ipRanges subnet of garbage",
        { runtimeConfig: { ipRanges: [[{ subnet: "garbage" }]] } },
        /runtimeConfig\.ipRanges\.0\.0\.subnet/,
      ],
      ["a range start outside its subnet", {
        runtimeConfig: { ipRanges: [[{ subnet: "10.99.0.0/24", rangeStart: "10.98.0.1" }]] },
      }, /inside the subnet/],
    ];
    for (const v of SUPPORTED_VERSIONS) {
      for (const [name, extra, re] of cases) {
        await t.step(`${v}: ${name}`, async () => {
          const r = await add(node, pod, `cb${v.replaceAll(".", "")}`, node.netconf(v, extra));
          assertEquals(r.code, 1, r.stdout);
          assertEquals(r.json!.code, 7, String(r.json!.msg));
          assertMatch(String(r.json!.msg), re);
        });
      }
    }
    assertEquals(await node.client.attachments(), [], "nothing recorded");
    assertEquals((await node.client.status()).pool.owned, 0, "nothing allocated");
  },
});

Deno.test({
  name: "CHECK takes the prevResult as the truth, for every version that has CHECK",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 4 } });
    for (const v of SUPPORTED_VERSIONS.filter((s) => !s.startsWith("0.3"))) {
      await t.step(v, async () => {
        const tag = v.replaceAll(".", "");
        const pod = await node.vpc.pod(`ck${tag}`);
        const added = await add(node, pod, `ck${tag}`, node.netconf(v));
        assertEquals(added.code, 0, added.stdout);
        const prev = added.json!;
        const check = (prevResult: Record<string, unknown>) =>
          node.cni("CHECK", {
            containerId: `ck${tag}`,
            ifName: "eth0",
            netns: pod.path,
            args: podArgs(pod.name),
            config: node.netconf(v, { prevResult }),
          });
        // A later plugin (tuning) set another MAC, and the final result says so.
        const mac = "02:5a:00:00:00:42";
        await inPod(node, pod, ["/usr/sbin/ip", "link", "set", "eth0", "address", mac]);
        const ifaces = prev.interfaces as { mac: string }[];
        const tuned = { ...prev, interfaces: [{ ...ifaces[0], mac }] };
        const ok = await check(tuned);
        assertEquals(ok.code, 0, ok.stdout);
        // A later plugin removed the IPv6 default route and the result omits it.
        await inPod(node, pod, ["/usr/sbin/ip", "-6", "route", "del", "default"]);
        const routes = (prev.routes as { dst: string }[]).filter((r) => r.dst !== "::/0");
        assertEquals((await check({ ...tuned, routes })).code, 0);
        // An address the result lists is gone: 106 naming it.
        const ips = prev.ips as { address: string }[];
        const v4 = ips.find((i) => !i.address.includes(":"))!.address;
        await inPod(node, pod, ["/usr/sbin/ip", "addr", "del", v4, "dev", "eth0"]);
        const bad = await check({ ...tuned, routes });
        assertEquals([bad.code, bad.json!.code], [1, 106]);
        assertStringIncludes(String(bad.json!.msg), `lacks address ${v4}`);
      });
    }
  },
});

// Issue 25 point 4: a 64 KiB annotation made a 65,683-character CNI error whose reason came
// last, and a log line as long; runtimes and kubelet events cut messages short.
Deno.test({
  name:
    "a 64 KiB security-group annotation: the CNI error, the API's answers and the log lines put the reason first and clip the value",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const pod = await node.vpc.pod("big");
    const value = Array.from(
      { length: 6000 },
      (_, i) => `g-${String(i).padStart(8, "0")}`,
    )
      .join(",").slice(0, 64 * 1024);
    const config = node.netconf("1.1.0", {
      runtimeConfig: {
        "io.kubernetes.cri.pod-annotations": {
          "enim.dev/security-group-ids": value,
        },
      },
    });
    const reason = 'Invalid annotation "enim.dev/security-group-ids": Expected at most 10';
    const leftOut = `(${value.length - 120} more bytes left out)`;

    // The plugin, as a runtime execs it.
    const r = await add(node, pod, "c-big", config);
    assertEquals([r.code, r.json?.code], [1, 7], r.stdout);
    const msg = String(r.json!.msg);
    assert(msg.startsWith(reason), msg.slice(0, 300));
    assertStringIncludes(msg, leftOut);
    assert(r.stdout.length < 1024, `${r.stdout.length} bytes on stdout`);

    // The same call through the API (POST /v1/cni): the same short answer.
    const call = {
      env: {
        CNI_COMMAND: "ADD",
        CNI_CONTAINERID: "c-big",
        CNI_IFNAME: "eth0",
        CNI_NETNS: pod.path,
        CNI_PATH: "/opt/cni/bin",
        CNI_ARGS: podArgs(pod.name),
        ENIM_LOG_FILE: node.sandbox.inner("cni.log"),
      },
      stdin: JSON.stringify(config),
    };
    const res = await unixRoundTrip(
      node.socket,
      encodeRequest(
        "POST",
        CNI_CALL_PATH,
        new TextEncoder().encode(JSON.stringify(call)),
      ),
      30_000,
    );
    const body = new TextDecoder().decode(res.body);
    assertEquals(
      [res.status, res.headers.get(EXIT_HEADER)],
      [200, "1"],
      body.slice(0, 300),
    );
    assert(body.length < 1024, `${body.length} bytes`);
    assert(String(JSON.parse(body).msg).startsWith(reason), body.slice(0, 300));

    // An API error naming every one of thousands of bad values: the first few, then a count.
    const err = await node.client.add({
      containerId: "c-big",
      ifName: "eth0",
      netns: pod.path,
      network: "enim-test",
      pod: { namespace: "default", name: "big" },
      mode: "interface",
      ips: value.split(",").slice(0, 4000),
    }).then(() => null, (e) => e as Error);
    assert(err, "refused");
    assert(
      err.message.startsWith("Invalid request body: ips"),
      err.message.slice(0, 300),
    );
    assertMatch(err.message, /and 3995 more$/);
    assert(err.message.length < 1024, `${err.message.length} characters`);

    // The call's log line (the plugin's log file) and the agent's log: no line echoes it all.
    const cniLog = await Deno.readTextFile(node.sandbox.host("cni.log"));
    const lines = [
      ...cniLog.split("\n"),
      ...(await node.agentLog()).split("\n"),
    ];
    const longest = Math.max(...lines.map((l) => l.length));
    assert(longest < 8 * 1024, `a log line of ${longest} characters`);
    const failed = cniLog.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l))
      .filter((l) => String(l.msg).startsWith(reason));
    assertEquals(failed.length, 2, "the plugin's and the API's call each log the reason first");
    for (const l of failed) assertStringIncludes(l.msg, leftOut);
    assertEquals(await node.client.attachments(), [], "nothing was recorded");
  },
});

// Issue 23 point 3: with the agent down the plugin answered 11 ("agent not reachable") to
// calls that can never work, so a runtime retried them and an operator read "agent down".
Deno.test({
  name:
    "with the agent stopped, a call wrong whatever the agent says gets the agent's own code and message; VERSION and DEL with the namespace gone answer as before",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 1 } });
    const pod = await node.vpc.pod("sd");
    const good = {
      containerId: "c-sd",
      ifName: "eth0",
      netns: pod.path,
      args: podArgs("sd"),
      config: node.netconf("1.1.0"),
    };
    const call = (c: (typeof SPEC_CASES)[number]) => {
      const { env, stdin } = specCall(c, good);
      return node.cni(c.verb, { env, config: stdin });
    };
    const up = new Map<string, string>();
    for (const c of SPEC_CASES) {
      const r = await call(c);
      assertEquals([r.code, r.json?.code], [1, c.code], `agent up, ${c.what}: ${r.stdout}`);
      up.set(c.what, r.stdout);
    }
    const version = await node.cni("VERSION", { config: { cniVersion: "1.0.0" } });
    assertEquals(version.code, 0, version.stdout);
    assertEquals(await node.client.attachments(), [], "nothing recorded");
    // DEL ignores a malformed CNI_ARGS (it must not fail on what ADD refused): 0 either way.
    const gone = `/run/netns/enim-gone-${crypto.randomUUID().slice(0, 8)}`;
    const badArgsDel = () => node.cni("DEL", { ...good, netns: gone, args: "K8S_POD_NAME" });
    const delUp = await badArgsDel();
    assertEquals([delUp.code, delUp.stdout.trim()], [0, ""], delUp.stderr);

    // Killed: gone, not being replaced (a graceful stop has calls wait for the next agent:
    // tests/restart_status_test.ts).
    await node.stopAgent("SIGKILL");
    for (const c of SPEC_CASES) {
      await t.step(`${c.what} → ${c.code}, as the agent answered it`, async () => {
        const r = await call(c);
        assertEquals(r.code, 1, r.stderr);
        assertEquals(r.stdout, up.get(c.what));
      });
    }
    await t.step("a call with nothing wrong → 11 (agent not reachable)", async () => {
      const r = await node.cni("ADD", { ...good });
      assertEquals([r.code, r.json?.code], [1, 11], r.stdout);
      assertStringIncludes(String(r.json?.msg), "not reachable");
    });
    await t.step("VERSION answers as with the agent up", async () => {
      const r = await node.cni("VERSION", { config: { cniVersion: "1.0.0" } });
      assertEquals([r.code, r.stdout], [0, version.stdout]);
    });
    await t.step("DEL with the namespace gone → success, nothing printed", async () => {
      for (const netns of ["", `/run/netns/enim-gone-${crypto.randomUUID().slice(0, 8)}`]) {
        const r = await node.cni("DEL", { ...good, netns });
        assertEquals([r.code, r.stdout.trim()], [0, ""], `CNI_NETNS="${netns}": ${r.stderr}`);
      }
    });
    await t.step(
      "DEL with a malformed CNI_ARGS and the namespace gone → 0, as the agent",
      async () => {
        const r = await badArgsDel();
        assertEquals([r.code, r.stdout.trim()], [0, ""], r.stderr);
      },
    );
    await t.step("DEL with the namespace still there → 11", async () => {
      const r = await node.cni("DEL", { ...good });
      assertEquals([r.code, r.json?.code], [1, 11], r.stdout);
    });
  },
});

// Issue 33 item 8: the agent answered `busy` after timeouts.addSeconds (120 s) while the plugin
// gave up after its own timeoutSeconds (30 s), so a runtime never saw the agent's answer.
Deno.test({
  name:
    "an ADD slower than the plugin's timeoutSeconds: the runtime reads the agent's busy (11) naming that limit, and its retry gets the ADD's result",
  ignore: !AS_ROOT,
  async fn() {
    // The ENI is attached on demand and the attach takes 4 s; the plugin waits 3 s.
    await using node = await SimulatedNode.start({
      mock: { enis: 1, preattached: 0, attachLatencyMs: 4000 },
    });
    const pod = await node.vpc.pod("slow");
    const first = await add(node, pod, "c-slow", node.netconf("1.1.0", { timeoutSeconds: 3 }));
    assertEquals([first.code, first.json?.code], [1, 11], first.stdout);
    const msg = String(first.json?.msg);
    assert(msg.startsWith("The enim agent is busy; try again later: The ADD did not finish"), msg);
    assertStringIncludes(msg, "(the plugin waits 3 s, its timeoutSeconds)");
    assertStringIncludes(msg, "the runtime's retry gets its result");
    // The ADD went on: the retry (a patient plugin) gets its result, the one ENI.
    const retry = await add(node, pod, "c-slow", node.netconf("1.1.0", { timeoutSeconds: 30 }));
    assertEquals(retry.code, 0, retry.stdout);
    const [eni] = (await node.client.status()).enis;
    assertEquals(eni.attachment?.containerId, "c-slow");
  },
});
