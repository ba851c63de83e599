/**
 * The BCE provider against the fake's models of real-cloud behaviour (issue 14):
 * stuck ENIs, late visibility, out-of-band changes, IPv6, the node limit's
 * fallbacks, orphans found without the name filter, and 404 classification.
 */
import { z } from "zod";
import { assert, assertEquals, assertStringIncludes } from "../../lib/assert.ts";
import { ProviderError } from "../contract.ts";
import {
  ANY_ADDRESS,
  INSTANCE,
  LOG_LINES,
  owner,
  recordError,
  setup,
  startFake,
  testClient,
} from "../../tests/support/bce_harness.ts";

/** Timings that make a stuck ENI show quickly. */
const STUCK_TIMEOUTS = { attachMs: 300, detachMs: 200, escalateMs: 100, pollMs: 5 };

const QuarantineSchema = z.object({
  quarantined: z.number(),
  quarantinedEnis: z.array(z.object({
    eniId: z.string(),
    status: z.string(),
    reason: z.string(),
    since: z.string(),
    tries: z.number(),
  })),
});
const LostSchema = z.object({
  lost: z.number(),
  lostEnis: z.array(z.object({
    eniId: z.string(),
    pod: z.string().nullable(),
    containerId: z.string().nullable(),
    reason: z.string().nullable(),
  })),
});
const LimitSchema = z.object({ maxEnisPerNode: z.number(), limitSource: z.string() });

/** Log lines (parsed) written since `from` whose message includes `msg`. */
function logged(from: number, msg: string): Record<string, unknown>[] {
  return LOG_LINES.slice(from).filter((l) => l.includes(msg)).map((l) =>
    z.record(z.string(), z.unknown()).parse(JSON.parse(l))
  );
}

async function eventually(fn: () => Promise<boolean> | boolean, ms = 5000, what = "condition") {
  const deadline = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

// ---- 2. stuck attaching / detaching ------------------------------------------------------

Deno.test("an ENI stuck in attaching is escalated (detach, then delete) and its slot freed", async () => {
  const env = await setup({ maxEnisPerNode: 2, timeouts: STUCK_TIMEOUTS });
  try {
    const from = LOG_LINES.length;
    // BCE lets a detach cancel the hung attach.
    env.fake.inject({ kind: "stuck", state: "attaching", escape: "detach" });
    const err = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS).then(
      () => null,
      (e) => e,
    );
    assert(err instanceof ProviderError);
    assertStringIncludes(err.message, "attaching");
    recordError(err);
    // The detach went through, then the delete: nothing left, nothing quarantined.
    assertEquals(env.fake.enis.size, 0);
    const st = await env.provider.status();
    assertEquals(st.attachable, 2, "the slot is free again");
    assertEquals(QuarantineSchema.parse(st.details).quarantined, 0);
    assertEquals(logged(from, "ENI is stuck; escalating").length, 1);
    // The next allocation works.
    const a = await env.provider.allocateNextENI(owner(2), ANY_ADDRESS);
    assertEquals(env.fake.enis.get(a.id)?.status, "inuse");
  } finally {
    await env.close();
  }
});

Deno.test("an ENI BCE will neither detach nor delete is quarantined: slot freed, metric and operator line, no more waiting", async () => {
  const env = await setup({ maxEnisPerNode: 2, timeouts: STUCK_TIMEOUTS });
  try {
    const from = LOG_LINES.length;
    env.fake.inject({ kind: "stuck", state: "attaching" }); // escape: never
    const err = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS).then(
      () => null,
      (e) => e,
    );
    assert(err instanceof ProviderError);
    const [stuckId] = [...env.fake.enis.keys()];
    assertEquals(env.fake.enis.get(stuckId)?.status, "attaching");

    const st = await env.provider.status();
    const q = QuarantineSchema.parse(st.details);
    assertEquals(q.quarantined, 1);
    assertEquals([q.quarantinedEnis[0].eniId, q.quarantinedEnis[0].status], [stuckId, "attaching"]);
    assertEquals(st.attachable, 2, "a quarantined ENI holds no slot");
    // The device plugin is told more carefully (BCE may still count it): one slot fewer for pods.
    assertEquals(await env.provider.capacity(), {
      limit: 2,
      forPods: 1,
      unavailable: [{ reason: "quarantined", count: 1, eniIds: [stuckId] }],
      source: "config",
    });
    const lines = logged(from, "ENI quarantined");
    assertEquals(lines.length, 1);
    assertEquals(lines[0].level, "error");
    assertEquals(lines[0].eniId, stuckId);
    assertStringIncludes(String(lines[0].action), `detach ENI "${stuckId}"`);
    assertEquals(
      env.fake.requests.filter((r) => r.method === "DELETE" && r.path.endsWith(stuckId)).length,
      1,
      "one delete despite the status (the force delete)",
    );

    // Later passes do not wait on it, nor even look at it (until quarantineRetryMs).
    const n = env.fake.requests.length;
    await env.provider.maintainPool();
    await env.provider.maintainPool();
    const touched = env.fake.requests.slice(n).filter((r) => r.path.includes(stuckId));
    assertEquals(touched, []);
    assertEquals(
      env.fake.requests.slice(n).map((r) => `${r.method} ${r.path}`),
      ["GET /v1/eni", "GET /v1/eni"],
      "one list per pass and nothing else",
    );
    // Another pod still gets an ENI.
    await env.provider.allocateNextENI(owner(2), ANY_ADDRESS);

    // BCE recovers: the ENI becomes inuse; the next pass adopts it and lifts the quarantine.
    env.fake.unstick(stuckId);
    await env.provider.maintainPool();
    const after = await env.provider.status();
    assertEquals(QuarantineSchema.parse(after.details).quarantined, 0);
    assert((await env.provider.list()).some((e) => e.id === stuckId && e.state === "free"));
    assertEquals((await env.provider.capacity()).forPods, 2);
  } finally {
    await env.close();
  }
});

Deno.test("a surplus ENI stuck in detaching is quarantined and retried after quarantineRetryMs", async () => {
  const env = await setup({
    maxEnisPerNode: 2,
    warmPool: { minIdle: 0, maxIdle: 0 },
    timeouts: { ...STUCK_TIMEOUTS, quarantineRetryMs: 1 },
  });
  try {
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    await env.provider.deallocateENI(owner(1));
    env.fake.inject({ kind: "stuck", state: "detaching" });
    await env.provider.maintainPool(); // free 1 > maxIdle 0: release it
    await eventually(
      async () => QuarantineSchema.parse((await env.provider.status()).details).quarantined === 1,
      5000,
      "the quarantine",
    );
    const st = await env.provider.status();
    assertEquals(QuarantineSchema.parse(st.details).quarantinedEnis[0].status, "detaching");
    assertEquals(env.fake.enis.get(a.id)?.status, "detaching");
    assertEquals([st.free, st.attachable], [0, 2]);
    // BCE finishes the detach; the retry deletes it and forgets it.
    env.fake.unstick(a.id);
    await eventually(
      async () => {
        await env.provider.maintainPool();
        return QuarantineSchema.parse((await env.provider.status()).details).quarantined === 0;
      },
      5000,
      "the retry",
    );
    await eventually(() => !env.fake.enis.has(a.id), 5000, "the delete");
  } finally {
    await env.close();
  }
});

Deno.test("after a restart, an intent whose ENI is still attaching past its deadline is escalated at once", async () => {
  // The set-up attaches a new ENI at once with the raw client: no young-ENI refusal.
  const env = await setup({
    maxEnisPerNode: 2,
    timeouts: STUCK_TIMEOUTS,
    fake: { youngEniRefusesAttachMs: 0 },
  });
  try {
    env.fake.inject({ kind: "stuck", state: "attaching", escape: "detach" });
    // An intent from long ago, its ENI created and attached (and stuck) before the crash.
    const c = testClient(env.fake);
    const token = crypto.randomUUID();
    const name = `enim/${INSTANCE}/old001`;
    const eniId = await c.createEni({
      name,
      subnetId: "sbn-fake0001",
      securityGroupIds: [],
      enterpriseSecurityGroupIds: [],
    }, token);
    await c.attachEni(eniId, INSTANCE, `${token}-attach`);
    c.close();
    env.db.prepare(
      "INSERT INTO bce_intents (id, kind, client_token, name, eni_id, requested_ip, purpose, phase, created_ms) VALUES (?, 'create', ?, ?, ?, NULL, 'pool', 'active', ?)",
    ).run(token, token, name, eniId, Date.now() - 3600_000);
    await env.provider.close();
    const p2 = await env.restart();
    await eventually(() => !env.fake.enis.has(eniId), 5000, "the stuck ENI to be removed");
    const gets = env.fake.requests.filter((r) =>
      r.method === "GET" && r.path === `/v1/eni/${eniId}`
    );
    assert(
      gets.length <= 6,
      `no long wait on a stuck ENI past its deadline (${gets.length} polls)`,
    );
    await eventually(async () => (await p2.status()).attachable === 2, 5000, "the slot to free");
  } finally {
    await env.close();
  }
});

// ---- 3. eventual consistency right after a create ---------------------------------------------

Deno.test("a not-found right after the provider's own create is retried briefly", async () => {
  const env = await setup({ maxEnisPerNode: 2 });
  try {
    const from = LOG_LINES.length;
    env.fake.inject({ kind: "invisible", reads: 2 });
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    assertEquals(env.fake.enis.get(a.id)?.status, "inuse");
    const early = env.fake.requests.filter((r) => r.path === `/v1/eni/${a.id}` && r.status === 404);
    assertEquals(early.map((r) => r.code), ["EniNotFoundException", "EniNotFoundException"]);
    assertEquals(logged(from, "A new ENI is not visible yet").length, 1);
  } finally {
    await env.close();
  }
});

Deno.test("a not-found on the attach right after the create is retried too", async () => {
  const env = await setup({ maxEnisPerNode: 2 });
  try {
    // Visible to the detail call, then gone for the attach, then back.
    env.fake.inject({
      kind: "status",
      status: 404,
      code: "EniNotFoundException",
      match: { action: "attach" },
    });
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    assertEquals(env.fake.enis.get(a.id)?.status, "inuse");
    // (Refusals of the young ENI, EniStatusException, aside.)
    const attaches = env.fake.requests.filter((r) =>
      "attach" in r.query && r.code !== "EniStatusException"
    );
    assertEquals(attaches.map((r) => r.status), [404, 200]);
  } finally {
    await env.close();
  }
});

// ---- 4. out-of-band deletion while a pod owns the ENI ----------------------------------------

Deno.test("an owned ENI deleted out of band is surfaced as lost, and DEL forgets it", async () => {
  const env = await setup({ maxEnisPerNode: 2 });
  try {
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    const from = LOG_LINES.length;
    env.fake.deleteOutOfBand(a.id);
    await env.provider.maintainPool();

    const st = await env.provider.status();
    const lost = LostSchema.parse(st.details);
    assertEquals(lost.lost, 1);
    assertEquals(lost.lostEnis[0], {
      eniId: a.id,
      pod: "default/p-1",
      containerId: "c1",
      reason: "deleted out of band",
    });
    assertEquals(st.attachable, 2, "a lost ENI holds no slot");
    // The manager still sees the attachment (so DEL and GC reach the provider).
    const listed = (await env.provider.list()).find((e) => e.id === a.id);
    assertEquals([listed?.state, listed?.owner?.containerId], ["owned", "c1"]);
    const lines = logged(from, "changed out of band");
    assertEquals(lines.length, 1);
    assertEquals(lines[0].level, "error");
    assertStringIncludes(String(lines[0].action), 'pod "default/p-1"');
    // Its device cannot come back: the manager's repair is told at once, with no call.
    const n = env.fake.requests.length;
    const repair = await env.provider.repairDevice(a.id).then(() => null, (e) => e);
    assertEquals(repair?.reason, "not_found");
    assertEquals(env.fake.requests.length, n);

    // DEL (or GC) releases it: forgotten, never handed to anyone else.
    await env.provider.deallocateENI(owner(1));
    assertEquals(LostSchema.parse((await env.provider.status()).details).lost, 0);
    assertEquals(await env.provider.list(), []);
    const b = await env.provider.allocateNextENI(owner(2), ANY_ADDRESS);
    assert(b.id !== a.id);
  } finally {
    await env.close();
  }
});

Deno.test("an ENI detached out of band: a free one is dropped and deleted, an owned one is lost then deleted at DEL", async () => {
  const env = await setup({ maxEnisPerNode: 4 });
  try {
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    const b = await env.provider.allocateNextENI(owner(2), ANY_ADDRESS);
    await env.provider.deallocateENI(owner(2)); // b is free
    env.fake.detachOutOfBand(a.id);
    env.fake.detachOutOfBand(b.id);
    await env.provider.maintainPool();
    const st = await env.provider.status();
    assertEquals([st.free, st.owned], [0, 1]);
    assertStringIncludes(
      String(LostSchema.parse(st.details).lostEnis[0].reason),
      "detached out of band (now available)",
    );
    await eventually(() => !env.fake.enis.has(b.id), 5000, "the free one to be deleted");
    assert(env.fake.enis.has(a.id), "the owned one waits for its pod");
    await env.provider.deallocateENI(owner(1));
    await eventually(() => !env.fake.enis.has(a.id), 5000, "the lost one to be deleted at DEL");
  } finally {
    await env.close();
  }
});

Deno.test("a lost ENI that shows up attached again is no longer lost", async () => {
  const env = await setup({ maxEnisPerNode: 2 });
  try {
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    env.fake.detachOutOfBand(a.id);
    await env.provider.maintainPool();
    assertEquals(LostSchema.parse((await env.provider.status()).details).lost, 1);
    // Someone attaches it back to this node.
    const eni = env.fake.enis.get(a.id)!;
    eni.status = "inuse";
    eni.instanceId = INSTANCE;
    await env.provider.maintainPool();
    assertEquals(LostSchema.parse((await env.provider.status()).details).lost, 0);
  } finally {
    await env.close();
  }
});

// ---- 5. IPv6 ----------------------------------------------------------------------------------

Deno.test("IPv6 is requested on a dual-stack subnet and reported in the ENI", async (t) => {
  const dual = [{ subnetId: "sbn-fake0001", cidr: "10.0.1.0/24", ipv6Cidr: "fd00:1::/64" }];
  await t.step("auto + a subnet with ipv6Cidr → asked for, reported", async () => {
    const env = await setup({ maxEnisPerNode: 2, fake: { subnets: dual } });
    try {
      const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
      const create = env.fake.requests.find((r) => r.method === "POST" && r.path === "/v1/eni");
      assertEquals(
        z.object({ ipv6PrivateIpSet: z.array(z.unknown()) }).parse(create?.body).ipv6PrivateIpSet
          .length,
        1,
      );
      const v6 = env.fake.enis.get(a.id)!.ipv6PrivateIpSet[0].privateIpAddress;
      assertEquals(a.ipv6, { address: v6, prefixLength: 64, gateway: "fd00:1::1" });
      assertEquals(a.ipv4?.gateway, "10.0.1.1");
      // And the row keeps it (a reused ENI carries it too).
      await env.provider.deallocateENI(owner(1));
      const again = await env.provider.allocateNextENI(owner(2), ANY_ADDRESS);
      assertEquals(again.ipv6?.address, v6);
    } finally {
      await env.close();
    }
  });
  await t.step("auto + an IPv4-only subnet → not asked for", async () => {
    const env = await setup({ maxEnisPerNode: 2 });
    try {
      const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
      const create = env.fake.requests.find((r) => r.method === "POST" && r.path === "/v1/eni");
      assert(!("ipv6PrivateIpSet" in z.record(z.string(), z.unknown()).parse(create?.body)));
      assertEquals(a.ipv6, null);
    } finally {
      await env.close();
    }
  });
  await t.step("never → not asked for even on a dual-stack subnet", async () => {
    const env = await setup({
      maxEnisPerNode: 2,
      fake: { subnets: dual },
      config: { ipv6: "never" },
    });
    try {
      const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
      assertEquals(a.ipv6, null);
    } finally {
      await env.close();
    }
  });
  await t.step("subnetIpv6Cidr in the config saves the subnet lookup", async () => {
    const env = await setup({
      maxEnisPerNode: 2,
      fake: { subnets: dual },
      config: { subnetCidr: "10.0.1.0/24", subnetIpv6Cidr: "fd00:1::/64" },
    });
    try {
      const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
      assertEquals(a.ipv6?.prefixLength, 64);
      assertEquals(env.fake.requests.filter((r) => r.path.startsWith("/v1/subnet/")), []);
    } finally {
      await env.close();
    }
  });
});

// ---- 6. node limit fallbacks ------------------------------------------------------------------

Deno.test("the node limit comes from the instance's eniQuota (primary NIC excluded, as CCE reads it), falls back to /v1/eni/quota, CCE's CPU rule or the config, and the agent starts anyway", async (t) => {
  const failQuota = {
    kind: "status" as const,
    status: 500,
    code: "InternalError",
    match: { path: "/v1/eni/quota" },
  };
  const failInstance = {
    kind: "status" as const,
    status: 404,
    code: "InvalidVersion",
    match: { path: /^\/v2\/instance\// },
  };
  const limit = async (env: Awaited<ReturnType<typeof setup>>) =>
    LimitSchema.parse((await env.provider.status()).details);

  await t.step("the instance detail answers → its eniQuota, /v1/eni/quota not asked", async () => {
    const env = await setup({ fake: { instances: { [INSTANCE]: { eniQuota: 6 } } } });
    try {
      assertEquals(await limit(env), { maxEnisPerNode: 6, limitSource: "instance-eni-quota" });
      assertEquals(env.fake.requests.filter((r) => r.path === "/v1/eni/quota"), []);
    } finally {
      await env.close();
    }
  });
  await t.step("the instance detail fails → /v1/eni/quota's totalQuantity", async () => {
    const fake = startFake({ instances: { [INSTANCE]: { eniQuota: 5 } } });
    fake.inject(failInstance, 50);
    const env = await setup({ withFake: fake });
    try {
      assertEquals(await limit(env), { maxEnisPerNode: 5, limitSource: "eni-quota-api" });
    } finally {
      await env.close();
      await fake.close();
    }
  });
  await t.step("configured below it → the configured value (a cap)", async () => {
    const env = await setup({
      maxEnisPerNode: 3,
      fake: { instances: { [INSTANCE]: { eniQuota: 6 } } },
    });
    try {
      assertEquals(await limit(env), { maxEnisPerNode: 3, limitSource: "config" });
    } finally {
      await env.close();
    }
  });
  await t.step("/v1/eni/quota failing changes nothing: the instance's eniQuota", async () => {
    const fake = startFake({ instances: { [INSTANCE]: { eniQuota: 5 } } });
    fake.inject(failQuota, 50);
    const from = LOG_LINES.length;
    const env = await setup({ withFake: fake });
    try {
      assertEquals(await limit(env), { maxEnisPerNode: 5, limitSource: "instance-eni-quota" });
      assertEquals(logged(from, "Node ENI limit 5, from instance-eni-quota").length, 1);
    } finally {
      await env.close();
      await fake.close();
    }
  });
  await t.step("eniQuota 0 → CCE's rule min(CPU count, 8)", async () => {
    const fake = startFake({ instances: { [INSTANCE]: { eniQuota: 0, cpuCount: 3 } } });
    fake.inject(failQuota, 50);
    const env = await setup({ withFake: fake });
    try {
      assertEquals(await limit(env), { maxEnisPerNode: 3, limitSource: "instance-cpu-rule" });
    } finally {
      await env.close();
      await fake.close();
    }
  });
  await t.step("both fail → the configured maxEnisPerNode", async () => {
    const fake = startFake();
    fake.inject(failQuota, 50);
    fake.inject(failInstance, 50);
    const env = await setup({ withFake: fake, maxEnisPerNode: 2 });
    try {
      assertEquals(await limit(env), { maxEnisPerNode: 2, limitSource: "config" });
      await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    } finally {
      await env.close();
      await fake.close();
    }
  });
  await t.step(
    "both fail, nothing configured → starts, allocates nothing new, resolves later",
    async () => {
      const fake = startFake();
      fake.inject(failQuota, 50);
      fake.inject(failInstance, 50);
      const from = LOG_LINES.length;
      const env = await setup({ withFake: fake });
      try {
        assertEquals(await limit(env), { maxEnisPerNode: 0, limitSource: "unresolved" });
        const lines = logged(from, "Cannot tell this node's ENI limit");
        assertEquals(lines[0]?.level, "error");
        const err = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS).then(
          () => null,
          (e) => e,
        );
        assertEquals(err?.reason, "no_eni_available");
        assertStringIncludes(err.message, "unresolved");
        recordError(err);
        // BCE answers again: the next try resolves it (at most once a minute; the test
        // restarts the provider rather than wait).
        fake.clearFaults();
        await env.provider.close();
        const p2 = await env.restart();
        assertEquals(
          LimitSchema.parse((await p2.status()).details).limitSource,
          "instance-eni-quota",
        );
        await p2.allocateNextENI(owner(1), ANY_ADDRESS);
      } finally {
        await env.close();
        await fake.close();
      }
    },
  );
});

// ---- 7. orphans without the name filter -------------------------------------------------------

Deno.test("orphans are found without BCE's name filter (which the fake matches exactly)", async () => {
  // i-other is a node that exists (its agent down): its ENIs are its own.
  const fake = startFake({
    nameFilter: "exact",
    instances: { [INSTANCE]: { eniQuota: 16 }, "i-other": { eniQuota: 8 } },
  });
  const orphan = fake.seedEni({ name: `enim/${INSTANCE}/dead01` });
  const otherNode = fake.seedEni({ name: "enim/i-other/dead02" });
  const foreign = fake.seedEni({ name: "someone/else" });
  const env = await setup({
    withFake: fake,
    maxEnisPerNode: 2,
    warmPool: { minIdle: 0, maxIdle: 1 },
  });
  try {
    await env.provider.maintainPool();
    assert(!fake.enis.has(orphan.eniId), "our orphan is deleted");
    assert(fake.enis.has(otherNode.eniId) && fake.enis.has(foreign.eniId), "nothing else");
    const lists = fake.requests.filter((r) => r.method === "GET" && r.path === "/v1/eni");
    assert(lists.length > 0);
    assert(lists.every((r) => !("name" in r.query)), "no list relies on the name filter");
    assert(lists.some((r) => !("instanceId" in r.query)), "the scan lists the whole VPC");
  } finally {
    await env.close();
    await fake.close();
  }
});

// ---- 9. 404 classification in the provider ------------------------------------------------------

Deno.test("a 404 that does not say the ENI is gone never counts as deleted", async () => {
  const env = await setup({ maxEnisPerNode: 2, warmPool: { minIdle: 0, maxIdle: 0 } });
  try {
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    await env.provider.deallocateENI(owner(1));
    // The release's delete answers 404 InvalidVersion: not "gone".
    env.fake.inject({
      kind: "status",
      status: 404,
      code: "InvalidVersion",
      match: { method: "DELETE" },
    });
    await env.provider.maintainPool();
    assert(env.fake.enis.has(a.id), "the ENI still exists");
    const st = await env.provider.status();
    assertEquals(
      z.object({ releasing: z.number() }).parse(st.details).releasing,
      1,
      "the release stays pending",
    );
    // A later pass finishes it.
    await eventually(
      async () => {
        await env.provider.maintainPool();
        return !env.fake.enis.has(a.id);
      },
      5000,
      "the retried release",
    );
    assertEquals(
      z.object({ releasing: z.number() }).parse((await env.provider.status()).details).releasing,
      0,
    );
  } finally {
    await env.close();
  }
});

Deno.test("an ENI missing from the list with a NoSuchObject about something else is not taken for gone", async () => {
  const env = await setup({ maxEnisPerNode: 2 });
  try {
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    // The list lags (the ENI is missing from it) and the detail call fails with a
    // 404 that names no ENI: the row stays, nothing is lost.
    env.fake.inject({
      kind: "status",
      status: 200,
      match: { path: "/v1/eni", method: "GET" },
    });
    env.fake.inject({
      kind: "status",
      status: 404,
      code: "InvalidVersion",
      match: { path: `/v1/eni/${a.id}` },
    });
    await env.provider.maintainPool();
    assertEquals(LostSchema.parse((await env.provider.status()).details).lost, 0);
    assertEquals((await env.provider.list()).map((e) => e.id), [a.id]);
  } finally {
    await env.close();
  }
});
