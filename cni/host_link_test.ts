import { assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { FakeAgent, SAMPLE_ADD_RESPONSE } from "../tests/support/fake_agent.ts";
import { expectError, run } from "../tests/support/run_dispatch.ts";
import type { AddRequest, AddResponse } from "../api/schema.ts";

const K8S = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web-0";
const env = (args = K8S, over: Record<string, string> = {}) => ({
  CNI_COMMAND: "ADD",
  CNI_CONTAINERID: "c0ffee01",
  CNI_NETNS: "/run/netns/pod1",
  CNI_IFNAME: "eth0",
  CNI_PATH: "/opt/cni/bin",
  CNI_ARGS: args,
  ...over,
});
const iface = (over: Record<string, unknown> = {}) => ({
  cniVersion: "1.1.0",
  name: "enimnet",
  type: "enim",
  ...over,
});
const hostLinkOf = (r: { agent: FakeAgent }) =>
  (r.agent.calls[0]?.req as AddRequest | undefined)?.hostLink;

Deno.test("the host link is on for a Kubernetes pod and carries the config's CIDRs", async () => {
  const r = await run(
    env(),
    iface({
      serviceCidrs: ["10.96.0.0/12", "fd00:10:96::/108"],
      hostStackCidrs: ["169.254.20.10/32"],
    }),
  );
  assertEquals(r.code, 0, r.stdout);
  assertEquals(hostLinkOf(r), {
    podIfName: "host0",
    nodeIfPrefix: "enimh",
    serviceCidrs: ["10.96.0.0/12", "fd00:10:96::/108"],
    hostStackCidrs: ["169.254.20.10/32"],
  });
});

Deno.test("the host link is off without K8S_POD_NAMESPACE, and with enabled false the request is today's", async (t) => {
  for (
    const [name, args, config] of [
      ["podman-style CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web-0", iface()],
      ["enabled false", K8S, iface({ hostLink: { enabled: false } })],
      ["a second interface without default routes", K8S, iface({ defaultRoutes: false })],
    ] as const
  ) {
    await t.step(name, async () => {
      const r = await run(env(args), config);
      assertEquals(r.code, 0, r.stdout);
      assertEquals("hostLink" in (r.agent.calls[0].req as object), false);
      assertEquals(JSON.parse(r.stdout).interfaces.length, 1);
    });
  }
  await t.step("enabled true turns it on for any pod", async () => {
    const r = await run(
      env("IgnoreUnknown=1"),
      iface({ hostLink: { enabled: true, podIfName: "node0", nodeIfPrefix: "hl" } }),
    );
    assertEquals(r.code, 0, r.stdout);
    assertEquals(hostLinkOf(r)?.podIfName, "node0");
    assertEquals(hostLinkOf(r)?.nodeIfPrefix, "hl");
  });
});

Deno.test("a link without serviceCidrs still ADDs and warns in the invocation log", async () => {
  const r = await run(env(), iface());
  assertEquals(r.code, 0, r.stdout);
  assertEquals(r.logs.length, 1);
  assertEquals(r.logs[0].level, "warn");
  assertStringIncludes(JSON.stringify(r.logs[0].warnings), "Services will not route");
  assertEquals(r.logs[0].hostLink, "host0");
});

Deno.test("bad host link config fails with 7 naming the field, before the agent is asked", async (t) => {
  const cases: [string, Record<string, unknown>, string, string?][] = [
    ["a service CIDR that is no prefix", { serviceCidrs: ["10.96.0.0"] }, "serviceCidrs.0"],
    ["host bits set", { serviceCidrs: ["10.96.0.1/12"] }, "serviceCidrs.0"],
    ["a host-stack CIDR of the wrong form", { hostStackCidrs: ["dns"] }, "hostStackCidrs.0"],
    [
      "a CIDR in both lists",
      { serviceCidrs: ["10.96.0.0/12"], hostStackCidrs: ["10.96.0.0/12"] },
      "hostStackCidrs[0]",
    ],
    [
      "a service CIDR that is a route too",
      { routes: [{ dst: "10.96.0.0/12" }], serviceCidrs: ["10.96.0.0/12"] },
      "serviceCidrs[0]",
    ],
    ["an unknown hostLink field", { hostLink: { enable: false } }, "hostLink"],
    ["a node-end prefix too long", { hostLink: { nodeIfPrefix: "enimhost" } }, "nodeIfPrefix"],
    ["a pod end named like CNI_IFNAME", { hostLink: { podIfName: "eth0" } }, "podIfName"],
    ["a pod end name too long", { hostLink: { podIfName: "host-link-of-pod" } }, "podIfName"],
    ["a mark of two bits", { hostLink: { marks: { answer: "0x3000" } } }, "marks.answer"],
    ["a mark that is no number", { hostLink: { marks: { return: "high" } } }, "marks.return"],
    [
      "the return mark equal to the default answer mark",
      { hostLink: { marks: { return: 4096 } } },
      "hostLink.marks.return: 0x1000 is the mark of hostLink.marks.answer already",
    ],
    ["an unknown mark", { hostLink: { marks: { node: "0x1000" } } }, "marks"],
  ];
  for (const [name, over, field] of cases) {
    await t.step(name, async () => {
      const r = await run(env(), iface(over));
      const e = expectError(r, 7);
      assertStringIncludes(e.msg, field);
      assertEquals(r.agent.calls, []);
    });
  }
  await t.step("hostLink.enabled in IPAM mode", async () => {
    const r = await run(env(), {
      cniVersion: "1.1.0",
      name: "n",
      type: "host-device",
      ipam: { type: "enim", hostLink: { enabled: true } },
    });
    assertStringIncludes(expectError(r, 7).msg, "ipam.hostLink.enabled");
    assertEquals(r.agent.calls, []);
  });
});

Deno.test("the host link's pod marks reach the agent as numbers, from hex strings too", async () => {
  const r = await run(env(), iface({ hostLink: { marks: { answer: "0x100", return: 512 } } }));
  assertEquals(r.code, 0, r.stdout);
  const add = r.agent.calls[0].req as AddRequest;
  assertEquals(add.hostLink?.marks, { answer: 0x100, return: 0x200 });
});

Deno.test("the result lists the host link's two ends after the ENI's interface", async () => {
  const res: AddResponse = {
    ...SAMPLE_ADD_RESPONSE,
    routes: [...SAMPLE_ADD_RESPONSE.routes, { dst: "10.96.0.0/12", gw: "169.254.1.1" }],
    hostLink: {
      nodeIfName: "enimh0123456789",
      podIfName: "host0",
      nodeMac: "0e:01:02:03:04:05",
      podMac: "0a:01:02:03:04:05",
    },
  };
  const agent = new FakeAgent({ add: () => res });
  const r = await run(env(), iface({ serviceCidrs: ["10.96.0.0/12"] }), agent);
  assertEquals(r.code, 0, r.stdout);
  const out = JSON.parse(r.stdout);
  assertEquals(out.interfaces, [
    { name: "eth0", mac: SAMPLE_ADD_RESPONSE.mac, sandbox: "/run/netns/pod1" },
    { name: "enimh0123456789", mac: "0e:01:02:03:04:05" },
    { name: "host0", mac: "0a:01:02:03:04:05", sandbox: "/run/netns/pod1" },
  ]);
  assertEquals(out.ips.map((i: { interface: number }) => i.interface), [0, 0]);
  assertEquals(out.routes.at(-1), { dst: "10.96.0.0/12", gw: "169.254.1.1" });
});
