/**
 * The BCE provider against the fake's cloud-like behaviours (issue 49; each
 * behaviour and its source: docs/testing.md, "The fake BCE cloud"): a new ENI
 * refused an attach for a while, a long attach, an attach that falls back, and
 * list pages holding other tools' ENIs.
 */
import { assert, assertEquals, assertStringIncludes } from "../../lib/assert.ts";
import { ProviderError } from "../contract.ts";
import { configSchema } from "./config.ts";
import {
  ANY_ADDRESS,
  HARNESS_TIMEOUTS,
  INSTANCE,
  LOG_LINES,
  owner,
  setup,
  testClient,
} from "../../tests/support/bce_harness.ts";

Deno.test("a new ENI BCE refuses to attach for a while (400 EniStatusException) is attached again under the same clientToken: the allocation succeeds, no ENI deleted", async () => {
  const env = await setup({ maxEnisPerNode: 2, fake: { youngEniRefusesAttachMs: 400 } });
  try {
    const from = LOG_LINES.length;
    const eni = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    assertEquals(env.fake.enis.get(eni.id)?.status, "inuse");
    const attaches = env.fake.requests.filter((r) =>
      "attach" in r.query && r.path === `/v1/eni/${eni.id}`
    );
    const refused = attaches.filter((r) => r.code === "EniStatusException");
    assert(refused.length >= 1, "BCE refused it at least once");
    assertEquals(attaches.at(-1)?.status, 200);
    assertEquals(new Set(attaches.map((r) => r.query.clientToken)).size, 1, "one clientToken");
    assertEquals(env.fake.requests.filter((r) => r.method === "DELETE"), [], "no ENI deleted");
    assertEquals(env.fake.enis.size, 1);
    const line = LOG_LINES.slice(from).find((l) => l.includes("accepted the attach"));
    assert(line, "the wait is logged with its refusals and time");
  } finally {
    await env.close();
  }
});

/** The config's default timings, every duration scaled by `f` (1/100: 90 s become 900 ms). */
function scaledDefaults(f: number): Record<string, number> {
  const t = configSchema.parse({}).timeouts;
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(t)) {
    out[k] = k.endsWith("Ms") ? Math.max(1, Math.round(v * f)) : v;
  }
  return { ...out, requestMs: HARNESS_TIMEOUTS.requestMs, totalMs: HARNESS_TIMEOUTS.totalMs };
}

Deno.test("a 90 s attach loses no ENI under the default attach bound (time scaled 1/100: a 900 ms attach, the defaults / 100)", async () => {
  const env = await setup({
    maxEnisPerNode: 2,
    fake: { attachDelayMs: 900, youngEniRefusesAttachMs: 0 },
    timeouts: scaledDefaults(1 / 100),
  });
  try {
    const eni = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    assertEquals(env.fake.enis.get(eni.id)?.status, "inuse");
    assertEquals(env.fake.requests.filter((r) => r.method === "DELETE"), [], "no ENI deleted");
  } finally {
    await env.close();
  }
});

Deno.test("an attach that falls back to available fails at once, not at the attach bound", async () => {
  // (No young-ENI refusal here: this test is about what follows an accepted attach.)
  const env = await setup({
    maxEnisPerNode: 2,
    timeouts: { attachMs: 20_000, pollMs: 20 },
    fake: { youngEniRefusesAttachMs: 0 },
  });
  try {
    env.fake.inject({ kind: "fallback" });
    const err = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS).then(
      () => null,
      (e) => e,
    );
    assert(err instanceof ProviderError);
    assertStringIncludes(err.message, "fell back");
    // It cannot be attached: cleaned up.
    assertEquals(env.fake.enis.size, 0);
    // The next allocation works.
    const a = await env.provider.allocateNextENI(owner(2), ANY_ADDRESS);
    assertEquals(env.fake.enis.get(a.id)?.status, "inuse");
  } finally {
    await env.close();
  }
});

Deno.test("a list page with other tools' ENIs (nulls, no traffic mode, another case, no id) is read entry by entry and never fails", async () => {
  const env = await setup({ maxEnisPerNode: 4, fake: { youngEniRefusesAttachMs: 0 } });
  const client = testClient(env.fake);
  try {
    const mine = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    const base = {
      description: null,
      zoneName: "cn-bj-a",
      instanceId: "",
      vpcId: "vpc-fake0001",
      status: "available",
      securityGroupIds: null,
      enterpriseSecurityGroupIds: null,
      createdTime: null,
      privateIpSet: [{ privateIpAddress: "10.0.1.200", primary: true, publicIpAddress: null }],
      ipv6PrivateIpSet: null,
    };
    env.fake.seedRawListEntry({
      ...base,
      eniId: "eni-nullfields01",
      name: null,
      macAddress: null,
      subnetId: null,
      privateIpSet: [{ privateIpAddress: null, primary: true, publicIpAddress: null }],
      networkInterfaceTrafficMode: "standard",
    });
    env.fake.seedRawListEntry({
      ...base,
      eniId: "eni-uppercase01",
      name: "other",
      macAddress: "fa:f6:00:00:00:aa",
      subnetId: "sbn-fake0001",
      networkInterfaceTrafficMode: "Standard",
    });
    env.fake.seedRawListEntry({
      ...base,
      eniId: "eni-nomode00001",
      name: "other",
      macAddress: "fa:f6:00:00:00:ab",
      subnetId: "sbn-fake0001",
    });
    env.fake.seedRawListEntry({
      ...base,
      eniId: "eni-eri00000001",
      name: "eri",
      macAddress: "fa:f6:00:00:00:ac",
      subnetId: "sbn-fake0001",
      networkInterfaceTrafficMode: "highPerformance",
    });
    env.fake.seedRawListEntry({ eniId: 5, status: ["?"], networkInterfaceTrafficMode: "standard" });
    const from = LOG_LINES.length;
    const listed = await client.listEnis({ vpcId: "vpc-fake0001" });
    assertEquals(
      listed.map((e) => e.eniId).sort(),
      [mine.id, "eni-nullfields01", "eni-uppercase01"].sort(),
    );
    const nulls = listed.find((e) => e.eniId === "eni-nullfields01")!;
    assertEquals(
      [nulls.name, nulls.macAddress, nulls.subnetId, nulls.privateIpSet[0].privateIpAddress],
      ["", "", "", ""],
    );
    assert(
      LOG_LINES.slice(from).some((l) => l.includes("cannot be read")),
      "the unreadable entry is logged",
    );
    // The provider's passes list the VPC too: they go on working.
    await env.provider.reconcile();
    assertEquals((await env.provider.list()).map((e) => e.id), [mine.id]);
    assertEquals(env.fake.enis.get(mine.id)?.instanceId, INSTANCE);
  } finally {
    client.close();
    await env.close();
  }
});
