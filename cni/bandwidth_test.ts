import { BANDWIDTH_ANNOTATIONS, limitsAny, PLACEHOLDER_BURST, podBandwidth } from "./bandwidth.ts";
import { CniError } from "./errors.ts";
import { assert, assertEquals, assertStringIncludes, assertThrows } from "../lib/assert.ts";

const { ingress: INGRESS, egress: EGRESS } = BANDWIDTH_ANNOTATIONS;
const cap = (bandwidth: unknown) => ({ runtimeConfig: { bandwidth } });

function refused(code: number, fn: () => unknown): string {
  const e = assertThrows(fn);
  assert(e instanceof CniError, String(e));
  assertEquals(e.code, code, e.message);
  return e.message;
}

Deno.test("no limit anywhere: nothing is shaped", () => {
  assertEquals(podBandwidth({}, {}), { shaping: {}, overridden: [] });
  assertEquals(podBandwidth(cap(null), { "other.io/x": "1" }).shaping, {});
  assertEquals(podBandwidth(cap({ ingressRate: 0, egressRate: 0 }), {}).shaping, {});
  assert(!limitsAny({}));
});

Deno.test("kubelet's annotations give each direction's rate in bits per second", () => {
  const b = podBandwidth({}, { [INGRESS]: "10M", [EGRESS]: "1.5Gi" });
  assertEquals(b.shaping, { ingress: { rate: 10_000_000 }, egress: { rate: 1_610_612_736 } });
  assert(limitsAny(b.shaping));
  assertEquals(podBandwidth({}, { [EGRESS]: "500k" }).shaping, { egress: { rate: 500_000 } });
});

Deno.test("the bandwidth capability gives rates and bursts; a runtime's placeholder burst means none", () => {
  // containerd passes 2^32 − 1 bits when the pod sets no burst (Kubernetes has no burst annotation).
  assertEquals(
    podBandwidth(
      cap({
        ingressRate: 10_000_000,
        ingressBurst: 2 ** 32 - 1,
        egressRate: 20_000_000,
        egressBurst: PLACEHOLDER_BURST,
      }),
      {},
    ).shaping,
    { ingress: { rate: 10_000_000 }, egress: { rate: 20_000_000 } },
  );
  assertEquals(
    podBandwidth(cap({ egressRate: 20_000_000, egressBurst: 800_000 }), {}).shaping,
    { egress: { rate: 20_000_000, burst: 800_000 } },
  );
  // A rate without a burst (the reference plugin refuses it) takes the default bucket.
  assertEquals(podBandwidth(cap({ ingressRate: 1_000 }), {}).shaping, {
    ingress: { rate: 1_000 },
  });
});

Deno.test("capability field names match as in Go, ignoring case: containerd 1.6 sends IngressRate", () => {
  assertEquals(
    podBandwidth(
      cap({
        IngressRate: 10_000_000,
        IngressBurst: 2 ** 32 - 1,
        EgressRate: 20_000_000,
        EgressBurst: 2 ** 32 - 1,
      }),
      {},
    ).shaping,
    { ingress: { rate: 10_000_000 }, egress: { rate: 20_000_000 } },
  );
  // An exact name wins over another spelling.
  assertEquals(
    podBandwidth(cap({ EGRESSRATE: 1_000, egressRate: 5_000 }), {}).shaping,
    { egress: { rate: 5_000 } },
  );
  assertStringIncludes(
    refused(7, () => podBandwidth(cap({ IngressRate: 5 }), {})),
    "Invalid runtimeConfig.bandwidth.ingressRate 5",
  );
});

Deno.test("the capability wins over an annotation of the same direction, and the log says so", () => {
  const b = podBandwidth(cap({ ingressRate: 20_000_000, ingressBurst: 2 ** 32 - 1 }), {
    [INGRESS]: "10M",
    [EGRESS]: "5M",
  });
  assertEquals(b.shaping, { ingress: { rate: 20_000_000 }, egress: { rate: 5_000_000 } });
  assertEquals(b.overridden, [
    "ingress bandwidth: runtimeConfig.bandwidth 20000000 bit/s wins over kubernetes.io/ingress-bandwidth 10000000 bit/s",
  ]);
  // Where they agree (containerd derives one from the other) nothing is said.
  assertEquals(
    podBandwidth(cap({ ingressRate: 10_000_000, ingressBurst: 2 ** 32 - 1 }), {
      [INGRESS]: "10M",
    }).overridden,
    [],
  );
});

Deno.test("an annotation of the wrong form or out of kubelet's range is a 7 naming it", async (t) => {
  const cases: [string, string, string][] = [
    ["10 M", `"${INGRESS}" "10 M"`, "expected a number"],
    ["fast", `"${INGRESS}" "fast"`, "expected a number"],
    ["10Mb", `"${INGRESS}" "10Mb"`, "expected a number"],
    ["10K", `"${INGRESS}" "10K"`, 'unknown suffix "K"'],
    ["", `"${INGRESS}" ""`, "empty"],
    ["999", `"${INGRESS}" "999"`, "below the smallest rate, 1 kbit/s"],
    ["-10M", `"${INGRESS}" "-10M"`, "below the smallest rate"],
    ["0", `"${INGRESS}" "0"`, "below the smallest rate"],
    ["1001T", `"${INGRESS}" "1001T"`, "above the largest rate, 1 Pbit/s"],
    ["1e30", `"${INGRESS}" "1e30"`, "beyond"],
  ];
  for (const [value, named, why] of cases) {
    await t.step(JSON.stringify(value), () => {
      const msg = refused(7, () => podBandwidth({}, { [INGRESS]: value }));
      assertStringIncludes(msg, `Invalid annotation ${named}`);
      assertStringIncludes(msg, why);
    });
  }
  await t.step("the edges of the range pass", () => {
    assertEquals(podBandwidth({}, { [EGRESS]: "1k" }).shaping, { egress: { rate: 1_000 } });
    assertEquals(podBandwidth({}, { [EGRESS]: "1P" }).shaping, { egress: { rate: 1e15 } });
  });
  await t.step("an overridden annotation is still checked", () => {
    refused(7, () => podBandwidth(cap({ ingressRate: 10_000_000 }), { [INGRESS]: "lots" }));
  });
});

Deno.test("a capability value of the wrong form or out of range is a 7 naming the field", async (t) => {
  const cases: [unknown, string][] = [
    [
      { ingressRate: 500 },
      "Invalid runtimeConfig.bandwidth.ingressRate 500: 500 bit/s is below the smallest rate",
    ],
    [
      { egressRate: 2e15 },
      "Invalid runtimeConfig.bandwidth.egressRate 2000000000000000: 2000000000000000 bit/s is above",
    ],
    [{ ingressRate: "10M" }, "Invalid runtimeConfig.bandwidth.ingressRate"],
    [{ ingressRate: -1 }, "Invalid runtimeConfig.bandwidth.ingressRate"],
    [{ ingressRate: 1.5e6 + 0.5 }, "Invalid runtimeConfig.bandwidth.ingressRate"],
    [
      { egressBurst: 1000 },
      "Invalid runtimeConfig.bandwidth.egressBurst 1000: a burst needs a rate",
    ],
    [{ ingressRate: 1000, ingressBurst: 1_000_000 }, "the bucket would take 1000 s to fill"],
    ["fast", "Invalid runtimeConfig.bandwidth"],
    [[1], "Invalid runtimeConfig.bandwidth"],
  ];
  for (const [value, msg] of cases) {
    await t.step(JSON.stringify(value), () => {
      assertStringIncludes(refused(7, () => podBandwidth(cap(value), {})), msg);
    });
  }
});

Deno.test("per-subnet exceptions of the reference plugin are refused with 2", () => {
  const msg = refused(
    2,
    () => podBandwidth(cap({ ingressRate: 1e7, unshapedSubnets: ["10.0.0.0/8"] }), {}),
  );
  assertStringIncludes(msg, '"runtimeConfig.bandwidth.unshapedSubnets"');
  // Empty lists (what a runtime serialises for none) are fine.
  assertEquals(
    podBandwidth(cap({ ingressRate: 1e7, unshapedSubnets: [], shapedSubnets: null }), {})
      .shaping,
    { ingress: { rate: 1e7 } },
  );
});
