/**
 * Zone-wide sticky pods on the BCE provider (issue 26), against the fake BCE
 * server with several nodes (providers, each with its own database and
 * instance) sharing one fake cloud: parking, claiming, the races the cloud
 * settles, expiry, and restarts in the middle. What the cloud holds is read
 * back from the fake, not from enim.
 */
import { assert, assertEquals } from "../../lib/assert.ts";
import type { Owner } from "../contract.ts";
import type { FakeBce, FakeEni } from "../../tests/support/bce_fake.ts";
import {
  INSTANCE,
  setup,
  type SetupOptions,
  type TestEnv,
} from "../../tests/support/bce_harness.ts";
import { decodeRecord, stickyName } from "./_sticky.ts";

const NODE_B = "i-fake0002";
const CLUSTER = "c1";
const POD = "payments/db-0";
const HOUR = 3_600_000;
const any = { ips: [], ranges: [] };

const owner = (containerId: string, pod = POD): Owner => ({ pod, containerId, ifName: "eth0" });

/** Zone scope with no node hold (the manager decides the hold; the provider parks when asked). */
const ZONE = { clusterId: CLUSTER, sticky: { scope: "zone", nodeHoldSeconds: 0 } };

/** Node A (the fake's own instance) with zone scope, on a fake that knows node B too. */
function nodeA(opts: SetupOptions = {}): Promise<TestEnv> {
  return setup({
    maxEnisPerNode: 8,
    ...opts,
    fake: {
      instances: { [INSTANCE]: { eniQuota: 8 }, [NODE_B]: { eniQuota: 8 } },
      ...opts.fake,
    },
    config: { ...ZONE, ...opts.config },
  });
}

/** Another node on `a`'s fake: its own database and instance. */
function nodeOn(a: TestEnv, instanceId: string, opts: SetupOptions = {}): Promise<TestEnv> {
  return setup({
    maxEnisPerNode: 8,
    ...opts,
    withFake: a.fake,
    config: { ...ZONE, instanceId, ...opts.config },
  });
}

async function eventually(fn: () => Promise<boolean> | boolean, what: string, ms = 5000) {
  const deadline = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The fake's ENI, read back. */
function cloud(fake: FakeBce, eniId: string): FakeEni | undefined {
  return fake.enis.get(eniId);
}

/** Waits until the fake shows the ENI parked (available, with a parked record). */
async function parkedInCloud(fake: FakeBce, eniId: string): Promise<FakeEni> {
  await eventually(
    () =>
      cloud(fake, eniId)?.status === "available" &&
      decodeRecord(cloud(fake, eniId)!.description)?.state === "parked",
    `ENI ${eniId} parked in the cloud`,
  );
  return cloud(fake, eniId)!;
}

Deno.test("a zone-sticky pod's ENI is parked: its record first, then the detach; it leaves the pool at once", async () => {
  const a = await nodeA();
  try {
    const eni = await a.provider.allocateNextENI(owner("c1"), { ...any, sticky: true });
    const until = Date.now() + HOUR;
    const from = a.fake.requests.length;
    await a.provider.parkENI(owner("c1"), { until });
    assertEquals((await a.provider.list()).map((e) => e.id), [], "off the pool at once");
    const parked = await parkedInCloud(a.fake, eni.id);
    assertEquals(parked.instanceId, "");
    assertEquals(parked.name, await stickyName("enim", CLUSTER, POD, "eth0"));
    assertEquals(decodeRecord(parked.description), {
      state: "parked",
      cluster: CLUSTER,
      pod: POD,
      ifName: "eth0",
      until,
      by: INSTANCE,
    });
    const calls = a.fake.requests.slice(from).filter((r) => r.method === "PUT");
    assertEquals(
      calls.map((
        r,
      ) => ("modifyAttribute" in r.query ? "record" : "detach" in r.query ? "detach" : "?")),
      ["record", "detach"],
      "the record is written before the detach",
    );
    await eventually(
      async () => (await a.provider.status()).sticky?.parked[0]?.state === "parked",
      "the parked entry",
    );
    const st = await a.provider.status();
    assertEquals(st.sticky?.parked.map((p) => [p.eniId, p.pod, p.ifName, p.until]), [[
      eni.id,
      POD,
      "eth0",
      new Date(until).toISOString(),
    ]]);
    assertEquals(a.events, ["park:default"]);
    // Parking what the owner no longer holds is a no-op (a retried release).
    await a.provider.parkENI(owner("c1"), { until });
  } finally {
    await a.close();
  }
});

Deno.test("a park cut short by a restart is finished at the next start", async () => {
  const a = await nodeA();
  try {
    const eni = await a.provider.allocateNextENI(owner("c1"), { ...any, sticky: true });
    // The detach is slow: the agent dies while it is on its way.
    a.fake.inject({ kind: "slow", delayMs: 300, match: { action: "detach" } });
    await a.provider.parkENI(owner("c1"), { until: Date.now() + HOUR });
    await eventually(
      () => a.fake.requests.some((r) => "detach" in r.query),
      "the detach to be sent",
    );
    await a.provider.close();
    const intents = a.db.prepare("SELECT kind, eni_id FROM bce_intents").all();
    assertEquals(intents.map((i) => [i.kind, i.eni_id]), [["park", eni.id]]);
    const again = await a.restart();
    await parkedInCloud(a.fake, eni.id);
    await eventually(
      async () => (await again.status()).sticky?.parked[0]?.state === "parked",
      "the park to finish after the restart",
    );
    assertEquals(a.db.prepare("SELECT kind FROM bce_intents").all(), []);
    assertEquals((await again.list()).length, 0);
  } finally {
    await a.close();
  }
});

Deno.test("an expired parked ENI is reclaimed exactly once, by whichever node sweeps first; an unexpired one is left alone", async () => {
  const fast = { orphanScanIntervalMs: 1, parkedExpiryGraceMs: 0 };
  const a = await nodeA({ timeouts: fast });
  const b = await nodeOn(a, NODE_B, { timeouts: fast });
  try {
    const kept = await a.provider.allocateNextENI(owner("k1", "payments/kept-0"), {
      ...any,
      sticky: true,
    });
    await a.provider.parkENI(owner("k1", "payments/kept-0"), { until: Date.now() + HOUR });
    const eni = await a.provider.allocateNextENI(owner("c1"), { ...any, sticky: true });
    const until = Date.now() + 200;
    await a.provider.parkENI(owner("c1"), { until });
    await parkedInCloud(a.fake, eni.id);
    await parkedInCloud(a.fake, kept.id);
    await eventually(() => Date.now() > until, "the hold to expire");
    // Both nodes sweep at once: A checks what it parked, B's orphan scan lists the VPC.
    await Promise.all([a.provider.maintainPool(), b.provider.maintainPool()]);
    assert(!a.fake.enis.has(eni.id), "the expired ENI is deleted");
    const deletes = a.fake.requests.filter((r) =>
      r.method === "DELETE" && r.path === `/v1/eni/${eni.id}` && r.status === 200
    );
    assertEquals(deletes.length, 1, "one delete succeeded");
    assertEquals([...a.events, ...b.events].filter((e) => e.startsWith("expiry")).length, 1);
    // The unexpired hold is respected by both.
    assertEquals(cloud(a.fake, kept.id)?.status, "available");
    assertEquals(
      a.fake.requests.filter((r) => r.method === "DELETE" && r.path === `/v1/eni/${kept.id}`),
      [],
    );
    await a.provider.maintainPool();
    assertEquals((await a.provider.status()).sticky?.parked.map((p) => p.eniId), [kept.id]);
  } finally {
    await b.close();
    await a.close();
  }
});
