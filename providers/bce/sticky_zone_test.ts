/**
 * Zone-wide sticky pods on the BCE provider (issue 26), against the fake BCE
 * server with several nodes (providers, each with its own database and
 * instance) sharing one fake cloud: parking, claiming, the races the cloud
 * settles, expiry, and restarts in the middle. What the cloud holds is read
 * back from the fake, not from enim.
 */
import { assert, assertEquals, assertStringIncludes } from "../../lib/assert.ts";
import { type Owner, ProviderError } from "../contract.ts";
import type { FakeBce, FakeEni } from "../../tests/support/bce_fake.ts";
import {
  ANY_ADDRESS,
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

/** Allocates pod `c1`'s sticky ENI on `node` and waits until the cloud shows its owned record. */
async function ownedSticky(node: TestEnv) {
  const eni = await node.provider.allocateNextENI(owner("c1"), { ...ANY_ADDRESS, sticky: true });
  await eventually(
    () => decodeRecord(cloud(node.fake, eni.id)?.description)?.state === "owned",
    "the owned record",
  );
  return eni;
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
    // While the pod owns it, the cloud shows its owned record (see below).
    const eni = await ownedSticky(a);
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
    const eni = await a.provider.allocateNextENI(owner("c1"), { ...ANY_ADDRESS, sticky: true });
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
      ...ANY_ADDRESS,
      sticky: true,
    });
    await a.provider.parkENI(owner("k1", "payments/kept-0"), { until: Date.now() + HOUR });
    const eni = await a.provider.allocateNextENI(owner("c1"), { ...ANY_ADDRESS, sticky: true });
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

/** Parks `pod`'s ENI on `a` (allocated for container `c`) and waits until the cloud shows it parked. */
async function parkedBy(a: TestEnv, c: string, pod = POD, until = Date.now() + HOUR) {
  const eni = await a.provider.allocateNextENI(owner(c, pod), { ...ANY_ADDRESS, sticky: true });
  await a.provider.parkENI(owner(c, pod), { until });
  await parkedInCloud(a.fake, eni.id);
  return eni;
}

/** What a rejected promise was rejected with. */
async function rejection(p: Promise<unknown>): Promise<Error & { reason?: string }> {
  return await p.then(() => {
    throw new Error("Expected a rejection");
  }, (e) => e);
}

Deno.test("a parked ENI is claimed on another node: same ENI, MAC and IPs; the node that parked it stops listing it", async () => {
  const a = await nodeA();
  const b = await nodeOn(a, NODE_B);
  try {
    const first = await parkedBy(a, "c1");
    const from = a.fake.requests.length;
    const back = await b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true });
    assertEquals([back.id, back.mac, back.ipv4, back.ipv6], [
      first.id,
      first.mac,
      first.ipv4,
      first.ipv6,
    ]);
    assertEquals(back.owner, owner("c2"));
    assertEquals([cloud(a.fake, first.id)?.status, cloud(a.fake, first.id)?.instanceId], [
      "inuse",
      NODE_B,
    ]);
    // One name-filtered lookup: no scan of the VPC.
    const lists = a.fake.requests.slice(from).filter((r) =>
      r.method === "GET" && r.path === "/v1/eni"
    );
    assertEquals(lists.map((r) => r.query.name), [await stickyName("enim", CLUSTER, POD, "eth0")]);
    // B records its claim, and the cloud shows the pod's record with B as its owner.
    const claims = (await b.provider.status()).sticky?.claims ?? [];
    assertEquals(claims.map((c) => [c.eniId, c.pod, c.from]), [[first.id, POD, INSTANCE]]);
    await eventually(
      () => decodeRecord(cloud(a.fake, first.id)?.description)?.state === "owned",
      "the owned record",
    );
    assertEquals(decodeRecord(cloud(a.fake, first.id)?.description)?.by, NODE_B);
    assertEquals(b.events, ["claim:default"]);
    // A's next pass sees it claimed: its status no longer shows it.
    await a.provider.maintainPool();
    assertEquals((await a.provider.status()).sticky?.parked, []);
    // Parked again from B, claimed back on A: it moves as often as the pod does.
    await b.provider.parkENI(owner("c2"), { until: Date.now() + HOUR });
    await parkedInCloud(a.fake, first.id);
    const home = await a.provider.allocateNextENI(owner("c3"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(home.id, first.id);
  } finally {
    await b.close();
    await a.close();
  }
});

Deno.test("capacity() takes a zone-sticky ENI being parked off the slots for pods, none parked, and leaves a claimed one to its pod", async () => {
  const a = await nodeA();
  const b = await nodeOn(a, NODE_B);
  const forPods = async (env: TestEnv) => {
    await env.provider.maintainPool();
    const c = await env.provider.capacity();
    return [c.limit, c.forPods, c.unavailable];
  };
  try {
    const eni = await a.provider.allocateNextENI(owner("c1"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(await forPods(a), [8, 8, []], "the pod's own ENI is the pod's");
    // The detach held back: the ENI is still attached here while its park is recorded.
    a.fake.inject({ kind: "slow", delayMs: 2000, match: { action: "detach" } });
    await a.provider.parkENI(owner("c1"), { until: Date.now() + HOUR });
    // Its pod's DEL is done (kubelet has freed the pod's device): no pod can have it.
    assertEquals(
      await forPods(a),
      [8, 7, [{ reason: "parking", count: 1, eniIds: [eni.id] }]],
      'being parked: a slot no pod can have, never "not enim\'s"',
    );
    assertEquals(cloud(a.fake, eni.id)?.instanceId, INSTANCE, "still attached here");
    assertEquals((await a.provider.status()).sticky?.parked.map((p) => p.state), ["parking"]);
    await parkedInCloud(a.fake, eni.id);
    await eventually(
      async () =>
        (await a.provider.status()).sticky?.parked.map((p) => p.state).join() === "parked",
      "the park to be done",
    );
    assertEquals(await forPods(a), [8, 8, []], "parked in the VPC");
    const back = await b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(back.id, eni.id);
    assertEquals(await forPods(b), [8, 8, []], "claimed: the pod's");
    assertEquals(await forPods(a), [8, 8, []], "claimed elsewhere");
  } finally {
    await b.close();
    await a.close();
  }
});

Deno.test("repairDevice() says at once that an ENI this node is parking, or parked, does not come back (a kill cut its DEL short)", async () => {
  const a = await nodeA();
  try {
    const eni = await a.provider.allocateNextENI(owner("c1"), { ...ANY_ADDRESS, sticky: true });
    a.fake.inject({ kind: "slow", delayMs: 2000, match: { action: "detach" } });
    await a.provider.parkENI(owner("c1"), { until: Date.now() + HOUR });
    for (const when of ["being parked", "parked"]) {
      const err = await a.provider.repairDevice(eni.id).then(() => null, (e: unknown) => e);
      assert(err instanceof ProviderError, String(err));
      assertEquals(err.reason, "not_found", when);
      assertStringIncludes(err.message, `is ${when} in the VPC`);
      if (when === "being parked") {
        await parkedInCloud(a.fake, eni.id);
        await eventually(
          async () =>
            (await a.provider.status()).sticky?.parked.map((p) => p.state).join() === "parked",
          "the park to be done",
        );
      }
    }
    // The manager's release of such a row then goes on: nothing is left to park or free.
    await a.provider.parkENI(owner("c1"), { until: Date.now() + HOUR });
    await a.provider.deallocateENI(owner("c1"));
  } finally {
    await a.close();
  }
});

Deno.test("a zone-sticky pod's new ENI carries its owned record; freed into the pool, it loses it", async () => {
  const a = await nodeA();
  try {
    const eni = await a.provider.allocateNextENI(owner("c1"), { ...ANY_ADDRESS, sticky: true });
    // Written after the allocation, in the background; the provider then knows it.
    await eventually(
      async () =>
        decodeRecord((await a.provider.list()).find((e) => e.id === eni.id)?.description)
          ?.state === "owned",
      "the owned record",
    );
    const named = cloud(a.fake, eni.id)!;
    assertEquals(named.name, await stickyName("enim", CLUSTER, POD, "eth0"));
    assertEquals(decodeRecord(named.description)?.by, INSTANCE);
    // The manager's description call for the owner changes nothing more.
    const writes = () => a.fake.requests.filter((r) => "modifyAttribute" in r.query).length;
    const before = writes();
    await a.provider.describeENI(eni.id, `${POD} on node-a`);
    assertEquals(writes(), before);
    // Freed (not parked): this node's marker and the configured description come back.
    await a.provider.deallocateENI(owner("c1"));
    assert(
      cloud(a.fake, eni.id)!.name.startsWith(`enim/${INSTANCE}/`),
      cloud(a.fake, eni.id)!.name,
    );
    assertEquals(cloud(a.fake, eni.id)!.description, "created by enim, do not modify");
    // A plain pod of the zone profile gets no record.
    const plain = await a.provider.allocateNextENI(owner("p1", "payments/web-0"), ANY_ADDRESS);
    await a.provider.describeENI(plain.id, "payments/web-0 on node-a");
    assertEquals(cloud(a.fake, plain.id)!.description, "payments/web-0 on node-a");
    assert(cloud(a.fake, plain.id)!.name.startsWith(`enim/${INSTANCE}/`));
  } finally {
    await a.close();
  }
});

Deno.test("two nodes claiming one parked ENI at once: one attach wins, the other gets sticky_conflict, nothing leaked", async () => {
  const a = await nodeA({ fake: { instances: instancesABC() } });
  const b = await nodeOn(a, NODE_B);
  const c = await nodeOn(a, NODE_C);
  try {
    const first = await parkedBy(a, "c1");
    const enisBefore = a.fake.enis.size;
    const from = a.fake.requests.length;
    // Both lookups are answered together, so both nodes see it parked and attach.
    // Only the lookups (a `name` filter): a pool pass's own list must not take a slow answer.
    a.fake.inject(
      { kind: "slow", delayMs: 100, match: { method: "GET", path: "/v1/eni", action: "name" } },
      2,
    );
    const outcomes = await Promise.allSettled([
      b.provider.allocateNextENI(owner("cb"), { ...ANY_ADDRESS, sticky: true }),
      c.provider.allocateNextENI(owner("cc"), { ...ANY_ADDRESS, sticky: true }),
    ]);
    const won = outcomes.filter((o) => o.status === "fulfilled");
    const lost = outcomes.filter((o) => o.status === "rejected") as PromiseRejectedResult[];
    assertEquals([won.length, lost.length], [1, 1]);
    assertEquals((won[0] as PromiseFulfilledResult<{ id: string }>).value.id, first.id);
    const err = lost[0].reason as Error & { reason?: string };
    assertEquals(err.reason, "sticky_conflict");
    assertStringIncludes(err.message, first.id);
    assertStringIncludes(err.message, "at the same moment");
    const winner = cloud(a.fake, first.id)!.instanceId;
    const [loser, loserId] = winner === NODE_B ? [c, NODE_C] : [b, NODE_B];
    // Attached once, to the winner; the loser holds nothing, not even a slot.
    assertEquals(
      a.fake.requests.slice(from).filter((r) =>
        "attach" in r.query && r.path === `/v1/eni/${first.id}` && r.status === 200
      ).length,
      1,
    );
    assertEquals(a.fake.attachedTo(loserId), []);
    assertEquals(await loser.provider.list(), []);
    const ls = await loser.provider.status();
    assertEquals([ls.details.claiming, ls.details.creating, ls.attachable], [0, 0, 8]);
    assertEquals(loser.events, ["claim_conflict:default"]);
    assertEquals(a.fake.enis.size, enisBefore, "no ENI made or lost");
  } finally {
    await c.close();
    await b.close();
    await a.close();
  }
});

Deno.test("an ENI another running node is attaching is refused as claimed at the same moment (fake instanceIdWhileAttaching: set)", async () => {
  const a = await nodeA({ fake: { instances: instancesABC(), instanceIdWhileAttaching: "set" } });
  const b = await nodeOn(a, NODE_B, { timeouts: { attachMs: 20_000 } });
  const c = await nodeOn(a, NODE_C);
  try {
    const first = await parkedBy(a, "c1");
    a.fake.opts.attachDelayMs = 400;
    const onB = b.provider.allocateNextENI(owner("cb"), { ...ANY_ADDRESS, sticky: true });
    onB.catch(() => {});
    await eventually(
      () => cloud(a.fake, first.id)?.status === "attaching",
      "B's attach to start",
    );
    const err = await rejection(
      c.provider.allocateNextENI(owner("cc"), { ...ANY_ADDRESS, sticky: true }),
    );
    assertEquals(err.reason, "sticky_conflict");
    assertStringIncludes(err.message, `claimed by instance "${NODE_B}" at the same moment`);
    assertEquals(c.events, ["claim_conflict:default"]);
    assertEquals((await onB).id, first.id);
    assertEquals(a.fake.attachedTo(NODE_C), []);
  } finally {
    await c.close();
    await b.close();
    await a.close();
  }
});

const NODE_C = "i-fake0003";
function instancesABC() {
  return {
    [INSTANCE]: { eniQuota: 8 },
    [NODE_B]: { eniQuota: 8 },
    [NODE_C]: { eniQuota: 8 },
  };
}

Deno.test("an ENI on a running instance is never taken, and the refusal says why; from a stopped one it is", async () => {
  const a = await nodeA();
  const b = await nodeOn(a, NODE_B);
  try {
    // The pod runs on A (its ENI owned there, the record in the cloud); A goes silent.
    const eni = await ownedSticky(a);
    await a.provider.close();
    const err = await rejection(
      b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true }),
    );
    assertEquals(err.reason, "sticky_conflict");
    for (const part of [eni.id, `"${INSTANCE}"`, "Running", "never taken"]) {
      assertStringIncludes(err.message, part);
    }
    assertEquals(cloud(a.fake, eni.id)?.instanceId, INSTANCE, "left where it is");
    assertEquals(await b.provider.list(), []);
    assertEquals(b.events, ["claim_conflict:default"]);
    // BCE reports A stopped: B takes it.
    a.fake.setInstanceStatus(INSTANCE, "Stopped");
    const taken = await b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true });
    assertEquals([taken.id, taken.mac], [eni.id, eni.mac]);
    assertEquals(cloud(a.fake, eni.id)?.instanceId, NODE_B);
    assertEquals((await b.provider.status()).sticky?.claims.map((c) => c.from), [INSTANCE]);
    // A comes back: the ENI is no longer its, and it leaves it alone.
    a.fake.setInstanceStatus(INSTANCE, "Running");
    const again = await a.restart();
    await again.reconcile();
    assertEquals((await again.list()).map((e) => [e.id, e.cloudState]), [[eni.id, "lost"]]);
    await again.deallocateENI(owner("c1"));
    assertEquals(await again.list(), []);
    assertEquals(cloud(a.fake, eni.id)?.instanceId, NODE_B, "untouched by A");
  } finally {
    await b.close();
    await a.close();
  }
});

Deno.test("an ENI of a released instance is claimed too", async () => {
  const a = await nodeA();
  const b = await nodeOn(a, NODE_B);
  try {
    const eni = await ownedSticky(a);
    await a.provider.close();
    a.fake.removeInstance(INSTANCE);
    const taken = await b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(taken.id, eni.id);
  } finally {
    await b.close();
    await a.close();
  }
});

Deno.test("a claim from another zone fails naming both zones, and changes nothing", async () => {
  const subnets = [
    { subnetId: "sbn-fake0001", cidr: "10.0.1.0/24", zoneName: "cn-bj-a" },
    { subnetId: "sbn-fakeb001", cidr: "10.0.2.0/24", zoneName: "cn-bj-b" },
  ];
  const a = await nodeA({
    fake: {
      subnets,
      instances: { ...instancesABC(), [NODE_C]: { eniQuota: 8, zoneName: "cn-bj-b" } },
    },
  });
  const c = await nodeOn(a, NODE_C, { config: { subnetId: "sbn-fakeb001" } });
  try {
    const first = await parkedBy(a, "c1");
    const err = await rejection(
      c.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true }),
    );
    assertEquals(err.reason, "wrong_zone");
    for (const part of [first.id, '"cn-bj-a"', '"cn-bj-b"', NODE_C]) {
      assertStringIncludes(err.message, part);
    }
    assertEquals(cloud(a.fake, first.id)?.status, "available", "still parked");
    assertEquals(
      a.fake.requests.filter((r) =>
        "attach" in r.query && r.path === `/v1/eni/${first.id}` &&
        JSON.stringify(r.body).includes(NODE_C)
      ).length,
      0,
      "C never tried to attach it",
    );
    assertEquals(await c.provider.list(), []);
  } finally {
    await c.close();
    await a.close();
  }
});

Deno.test("a claim cut short by a restart is rolled back: parked again, and the pod's retry claims it", async () => {
  const a = await nodeA();
  const b = await nodeOn(a, NODE_B, { timeouts: { attachMs: 20_000 } });
  try {
    const first = await parkedBy(a, "c1");
    // The attach takes long: B dies while it is on its way.
    a.fake.opts.attachDelayMs = 400;
    const pending = b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true });
    pending.catch(() => {});
    await eventually(
      () => cloud(a.fake, first.id)?.status === "attaching",
      "the attach to start",
    );
    await b.provider.close();
    assertEquals(
      b.db.prepare("SELECT kind, eni_id FROM bce_intents").all().map((i) => [i.kind, i.eni_id]),
      [["claim", first.id]],
    );
    a.fake.opts.attachDelayMs = 15;
    const again = await b.restart();
    await eventually(
      () => b.db.prepare("SELECT 1 FROM bce_intents").all().length === 0,
      "the claim's rollback",
    );
    const parked = cloud(a.fake, first.id)!;
    assertEquals([parked.status, decodeRecord(parked.description)?.state], ["available", "parked"]);
    assertEquals(await again.list(), [], "no ENI attached to B without B's record");
    const back = await again.allocateNextENI(owner("c3"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(back.id, first.id);
  } finally {
    await b.close();
    await a.close();
  }
});

Deno.test("should BCE ignore the name filter, lookups share one index of the VPC", async () => {
  const a = await nodeA({ fake: { nameFilter: "ignore", maxKeysCap: 2 } });
  const b = await nodeOn(a, NODE_B);
  try {
    for (let i = 0; i < 4; i++) a.fake.seedEni({ name: `other/eni-${i}` });
    const first = await parkedBy(a, "c1");
    const other = await parkedBy(a, "k1", "payments/db-1");
    const lists = () =>
      a.fake.requests.filter((r) =>
        r.method === "GET" && r.path === "/v1/eni" && !r.query.instanceId
      )
        .length;
    const before = lists();
    // The first lookup finds the filter ignored (the whole VPC, paged) and indexes it.
    assertEquals(
      (await b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true })).id,
      first.id,
    );
    const firstLookup = lists() - before;
    assert(firstLookup >= 3, `paged: ${firstLookup} pages`);
    // The next one, within the index's life, finds its pod in the index: no list at all.
    const mid = lists();
    assertEquals(
      (await b.provider.allocateNextENI(owner("k2", "payments/db-1"), {
        ...ANY_ADDRESS,
        sticky: true,
      })).id,
      other.id,
    );
    assertEquals(lists(), mid);
    // A pod not in the index waits for a fresh listing: never a new IP for a returning pod.
    const miss = await b.provider.allocateNextENI(owner("n1", "payments/new-0"), {
      ...ANY_ADDRESS,
      sticky: true,
    });
    assert(miss.id !== first.id && miss.id !== other.id);
    assert(lists() > mid, "a miss lists again");
  } finally {
    await b.close();
    await a.close();
  }
});

Deno.test("an ENI left in the VPC with an owned record is parked for its pod by the first orphan scan", async () => {
  const a = await nodeA();
  const b = await nodeOn(a, NODE_B, { timeouts: { orphanScanIntervalMs: 1 } });
  try {
    const eni = await ownedSticky(a);
    await a.provider.close();
    a.fake.removeInstance(INSTANCE);
    await b.provider.maintainPool();
    const r = decodeRecord(cloud(a.fake, eni.id)?.description);
    assertEquals([r?.state, r?.pod, r?.by], ["parked", POD, NODE_B]);
    assert(r!.until! > Date.now() + 60_000, "kept for its pod a while");
    assertEquals(cloud(a.fake, eni.id)?.status, "available", "not deleted");
  } finally {
    await b.close();
    await a.close();
  }
});

Deno.test("an ENI that shows no instanceId while attaching (fake instanceIdWhileAttaching: empty) is still claimed by a sticky pod", async () => {
  // A slow attach, so the claim's polls see it attaching with instanceId "".
  const a = await nodeA({ fake: { instanceIdWhileAttaching: "empty" } });
  const b = await nodeOn(a, NODE_B);
  try {
    const first = await parkedBy(a, "c1");
    a.fake.opts.attachDelayMs = 150;
    const taken = await b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(taken.id, first.id);
    assertEquals(cloud(a.fake, first.id)?.instanceId, NODE_B);
    const details = a.fake.requests.filter((r) =>
      r.method === "GET" && r.path === `/v1/eni/${first.id}`
    );
    assert(details.length > 0);
    assertEquals(a.fake.enis.has(first.id), true, "not deleted");
  } finally {
    await b.close();
    await a.close();
  }
});

Deno.test("one node takes the same ENI from a stopped instance twice (a fresh clientToken per take; the fake remembers tokens globally and forever)", async () => {
  const a = await nodeA({
    fake: { tokenScope: "global", youngEniRefusesAttachMs: 0, instanceIdWhileAttaching: "set" },
  });
  const b = await nodeOn(a, NODE_B);
  try {
    const eni = await ownedSticky(a);
    await a.provider.close();
    a.fake.setInstanceStatus(INSTANCE, "Stopped");
    const first = await b.provider.allocateNextENI(owner("c2"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(first.id, eni.id);
    // B parks it; A, running again, claims it for the pod; then A stops again.
    await b.provider.parkENI(owner("c2"), { until: Date.now() + HOUR });
    await parkedInCloud(a.fake, eni.id);
    a.fake.setInstanceStatus(INSTANCE, "Running");
    const again = await a.restart();
    await again.reconcile();
    await again.deallocateENI(owner("c1"));
    const onA = await again.allocateNextENI(owner("c3"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(onA.id, eni.id);
    await again.close();
    a.fake.setInstanceStatus(INSTANCE, "Stopped");
    // B takes the same ENI from A a second time.
    const second = await b.provider.allocateNextENI(owner("c4"), { ...ANY_ADDRESS, sticky: true });
    assertEquals(second.id, eni.id);
    assertEquals(cloud(a.fake, eni.id)?.instanceId, NODE_B);
    const takes = a.fake.requests.filter((r) =>
      "detach" in r.query && r.path === `/v1/eni/${eni.id}` &&
      JSON.stringify(r.body).includes(INSTANCE)
    );
    const tokens = new Set(takes.map((r) => r.query.clientToken));
    assert(tokens.size >= 2, `each take has its own clientToken: ${[...tokens]}`);
  } finally {
    await b.close();
    await a.close();
  }
});
