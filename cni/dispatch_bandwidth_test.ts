/**
 * The dispatcher's side of bandwidth limits: what reaches the agent from the
 * `bandwidth` capability and the pod annotations, and what is refused before the
 * agent is asked for anything.
 */
import { assertEquals, assertStringIncludes } from "../lib/assert.ts";
import type { AddRequest } from "../api/schema.ts";
import { expectError, run } from "../tests/support/run_dispatch.ts";
import { POD_ANNOTATIONS_KEY } from "./selection.ts";
import { SHAPED_10M_RUNTIME_CONFIG } from "../tests/support/bandwidth_fixtures.ts";

const ENV = {
  CNI_COMMAND: "ADD",
  CNI_CONTAINERID: "c0ffee01",
  CNI_NETNS: "/run/netns/pod1",
  CNI_IFNAME: "eth0",
  CNI_PATH: "/opt/cni/bin",
  CNI_ARGS: "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web-0",
};
const config = (runtimeConfig: Record<string, unknown>, over: Record<string, unknown> = {}) => ({
  cniVersion: "1.0.0",
  name: "enimnet",
  type: "enim",
  // A Kubernetes pod gets a host link (issue 27): with a Service CIDR, as shipped, so
  // the only warnings are the bandwidth's.
  serviceCidrs: ["10.96.0.0/12"],
  runtimeConfig,
  ...over,
});
const annotations = (a: Record<string, string>) => ({ [POD_ANNOTATIONS_KEY]: a });
const added = (r: Awaited<ReturnType<typeof run>>) =>
  r.agent.calls.filter((c) => c.method === "add").map((c) => c.req as AddRequest);

Deno.test("ADD sends the pod's annotated limits to the agent, from containerd's two channels", async () => {
  const r = await run(ENV, config(SHAPED_10M_RUNTIME_CONFIG));
  assertEquals(r.code, 0, r.stdout);
  assertEquals(added(r)[0].bandwidth, {
    ingress: { rate: 10_000_000 },
    egress: { rate: 10_000_000 },
  });
  assertEquals(r.logs[0].warnings, undefined);
});

Deno.test("ADD without limits sends no bandwidth", async () => {
  const r = await run(ENV, config(annotations({ "other.io/x": "1" })));
  assertEquals(r.code, 0, r.stdout);
  assertEquals(added(r)[0].bandwidth, undefined);
});

Deno.test("a bad bandwidth value is a 7 before the agent is asked for anything", async (t) => {
  const cases: [string, Record<string, unknown>, string][] = [
    [
      "an annotation of the wrong form",
      annotations({ "kubernetes.io/egress-bandwidth": "10 Mbit" }),
      'Invalid annotation "kubernetes.io/egress-bandwidth" "10 Mbit"',
    ],
    [
      "an annotation under 1 kbit/s",
      annotations({ "kubernetes.io/ingress-bandwidth": "100" }),
      "100 bit/s is below the smallest rate",
    ],
    [
      "a capability rate of the wrong type",
      { bandwidth: { ingressRate: "10M" } },
      'Invalid runtimeConfig.bandwidth.ingressRate "10M"',
    ],
  ];
  for (const [name, rc, msg] of cases) {
    await t.step(name, async () => {
      const r = await run(ENV, config(rc));
      assertStringIncludes(expectError(r, 7).msg, msg);
      assertEquals(added(r), [], "the agent was not asked");
    });
  }
});

Deno.test("DEL never fails on a bandwidth value ADD would refuse", async () => {
  const r = await run(
    { ...ENV, CNI_COMMAND: "DEL" },
    config({ bandwidth: "garbage", ...annotations({ "kubernetes.io/ingress-bandwidth": "x" }) }),
  );
  assertEquals(r.code, 0, r.stdout);
});

Deno.test("in IPAM mode the limits are checked, not sent, and the log says they are not enforced", async () => {
  const ipam = (rc: Record<string, unknown>) => ({
    cniVersion: "1.0.0",
    name: "enimnet",
    type: "host-device",
    ipam: { type: "enim" },
    runtimeConfig: rc,
  });
  const r = await run(ENV, ipam({ bandwidth: { egressRate: 5_000_000 } }));
  assertEquals(r.code, 0, r.stdout);
  assertEquals(added(r)[0].bandwidth, undefined);
  assertStringIncludes(String(r.logs[0].warnings), "not enforced in IPAM mode");
  expectError(await run(ENV, ipam({ bandwidth: { egressRate: 5 } })), 7);
});
