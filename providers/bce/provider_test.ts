import { assert, assertEquals, assertMatch, assertStringIncludes } from "../../lib/assert.ts";
import { ProviderError } from "../contract.ts";
import { encodeRecord } from "./_sticky.ts";
import { providerContractSuite } from "../../tests/support/provider_contract.ts";
import {
  AK,
  ANY_ADDRESS,
  assertNoSecretsLogged,
  clientWith,
  INSTANCE,
  LOG_LINES,
  owner,
  recordError,
  SECRET,
  SESSION_TOKEN,
  setup,
  startFake,
  testClient,
} from "../../tests/support/bce_harness.ts";

async function eventually(fn: () => Promise<boolean> | boolean, ms = 5000, what = "condition") {
  const deadline = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

Deno.test("bce meets the shared provider contract against the fake BCE server", async (t) => {
  await providerContractSuite(t, async () => {
    const env = await setup({ maxEnisPerNode: 4 });
    return { provider: env.provider, cleanup: env.close };
  });
});

Deno.test("capacity() follows the instance's quota and the ENIs that are not ours, and fails while BCE does not answer", async () => {
  const fake = startFake({ instances: { [INSTANCE]: { eniQuota: 6 } } });
  const env = await setup({ withFake: fake, timeouts: { limitRefreshMs: 1 } });
  try {
    assertEquals(await env.provider.capacity(), {
      limit: 6,
      forPods: 6,
      unavailable: [],
      source: "instance-eni-quota",
    });
    // BCE raises the instance's quota: the next pass asks again.
    fake.opts.instances[INSTANCE].eniQuota = 8;
    await env.provider.maintainPool();
    assertEquals((await env.provider.capacity()).forPods, 8);
    // Someone attaches an ENI of their own: it takes a slot pods cannot have.
    const other = fake.seedEni({ name: "someone-else/eni", instanceId: INSTANCE, status: "inuse" });
    await env.provider.maintainPool();
    assertEquals(await env.provider.capacity(), {
      limit: 8,
      forPods: 7,
      unavailable: [{ reason: "foreign", count: 1, eniIds: [other.eniId] }],
      source: "instance-eni-quota",
    });
    assertEquals((await env.provider.status()).attachable, 7, "status agrees");
    // BCE stops answering: the figure would be stale, so capacity() says so.
    fake.inject({ kind: "status", status: 500, code: "InternalError" }, 1000);
    const pass = await env.provider.maintainPool().then(() => null, (e: unknown) => e);
    assert(pass instanceof Error, "the pass fails while BCE fails");
    const err = await env.provider.capacity().then(() => null, (e: unknown) => e);
    assert(err instanceof ProviderError, String(err));
    assertEquals(err.reason, "unavailable");
    assertMatch(err.message, /^BCE has not answered the list of this node's ENIs since \S+Z: /);
    fake.clearFaults();
    await env.provider.maintainPool();
    assertEquals((await env.provider.capacity()).forPods, 7);
  } finally {
    await env.close();
    await fake.close();
  }
});

Deno.test("allocateNextENI() creates, attaches and waits for the device, then reuses it without detach", async () => {
  const env = await setup({ maxEnisPerNode: 4 });
  try {
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    const cloud = env.fake.enis.get(a.id)!;
    assertEquals(cloud.status, "inuse");
    assertEquals(cloud.instanceId, INSTANCE);
    assert(cloud.name.startsWith(`enim/${INSTANCE}/`));
    assertEquals(cloud.securityGroupIds, ["g-test0001"]);
    assertEquals(cloud.enterpriseSecurityGroupIds, []);
    assert(env.devices.has(a.mac));
    assertEquals(a.mac, cloud.macAddress);
    assertEquals(a.ipv4, {
      address: cloud.privateIpSet[0].privateIpAddress,
      prefixLength: 24,
      gateway: "10.0.1.1",
    });
    const detachesBefore = env.fake.requests.filter((r) => "detach" in r.query).length;
    await env.provider.deallocateENI(owner(1));
    assertEquals(env.fake.enis.get(a.id)!.status, "inuse");
    assertEquals(env.fake.requests.filter((r) => "detach" in r.query).length, detachesBefore);
    const st = await env.provider.status();
    assertEquals([st.free, st.owned, st.attachable], [1, 0, 3]);
  } finally {
    await env.close();
  }
});

Deno.test("allocateNextENI() creates an ENI with the requested IP", async () => {
  const env = await setup({ maxEnisPerNode: 4 });
  try {
    const a = await env.provider.allocateNextENI(owner(1), { ips: ["10.0.1.77"], ranges: [] });
    assertEquals(a.ipv4?.address, "10.0.1.77");
    const err = await env.provider.allocateNextENI(owner(2), { ips: ["10.0.1.77"], ranges: [] })
      .then(() => null, (e) => e);
    assert(err instanceof ProviderError);
    assertEquals(err.reason, "requested_ip_unavailable");
    recordError(err);
    assertEquals(env.fake.enis.size, 1);
    assertEquals((await env.provider.status()).attachable, 3);
  } finally {
    await env.close();
  }
});

Deno.test("the warm pool converges to its bounds and never touches foreign ENIs", async () => {
  const fake = startFake({ instances: { [INSTANCE]: { eniQuota: 16 } } });
  const foreign = fake.seedEni({ name: "someone-else/eni", instanceId: INSTANCE, status: "inuse" });
  const ours = (n: number) =>
    [...fake.enis.values()].filter((e) => e.name.startsWith("enim/") && e.status === "inuse")
      .length === n;
  const env = await setup({
    withFake: fake,
    maxEnisPerNode: 8,
    warmPool: { minIdle: 2, maxIdle: 3 },
  });
  try {
    await env.provider.start!();
    await eventually(async () => (await env.provider.status()).free === 2, 5000, "2 free");
    assert(ours(2));
    // Take both: the loop tops the pool up again.
    await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    await env.provider.allocateNextENI(owner(2), ANY_ADDRESS);
    await env.provider.allocateNextENI(owner(3), ANY_ADDRESS);
    await eventually(async () => (await env.provider.status()).free === 2, 5000, "refill");
    // Free all three: 5 free > maxIdle 3, the loop releases 2 (detach + delete).
    for (const i of [1, 2, 3]) await env.provider.deallocateENI(owner(i));
    await eventually(
      async () => {
        const st = await env.provider.status();
        return st.free === 3 && (st.details.releasing as number) === 0 && ours(3);
      },
      5000,
      "shrink to 3",
    );
    assertEquals([...fake.enis.values()].filter((e) => e.name.startsWith("enim/")).length, 3);
    assertEquals(fake.enis.get(foreign.eniId)?.status, "inuse");
    assertEquals((await env.provider.status()).details.otherAttached, 1);
    assert((fake.maxAttached.get(INSTANCE) ?? 0) <= 8);
  } finally {
    await env.close();
    await fake.close();
  }
});

Deno.test("a create whose response is lost is retried with the same clientToken and yields one ENI", async () => {
  const env = await setup({ maxEnisPerNode: 4, timeouts: { requestMs: 200 } });
  try {
    env.fake.inject({ kind: "lose", match: { method: "POST", path: "/v1/eni" } }, 2);
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    const creates = env.fake.requests.filter((r) => r.method === "POST" && r.path === "/v1/eni");
    assertEquals(creates.length, 3);
    assertEquals(new Set(creates.map((r) => r.query.clientToken)).size, 1);
    assertEquals(env.fake.enis.size, 1);
    assertEquals([...env.fake.enis.keys()], [a.id]);
  } finally {
    await env.close();
  }
});

Deno.test("a create whose every response is lost is cleaned up by its name", async () => {
  const env = await setup({ maxEnisPerNode: 2, timeouts: { requestMs: 100, maxAttempts: 3 } });
  try {
    env.fake.inject({ kind: "lose", match: { method: "POST", path: "/v1/eni" } }, 3);
    const err = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS).then(
      () => null,
      (e) => e,
    );
    assert(err instanceof ProviderError);
    assertEquals(err.reason, "unavailable");
    recordError(err);
    const creates = env.fake.requests.filter((r) => r.method === "POST" && r.path === "/v1/eni");
    assertEquals(creates.length, 3);
    assertEquals(new Set(creates.map((r) => r.query.clientToken)).size, 1);
    await eventually(() => env.fake.enis.size === 0, 5000, "the orphan to be deleted");
    assertEquals((await env.provider.status()).attachable, 2);
  } finally {
    await env.close();
  }
});

Deno.test("a requested range outside the subnet fails fast without creating an ENI", async () => {
  const env = await setup({ maxEnisPerNode: 2 });
  try {
    const err = await env.provider.allocateNextENI(owner(1), {
      ips: [],
      ranges: [[{ subnet: "192.168.0.0/16" }]],
    }).then(() => null, (e) => e);
    assertEquals(err?.reason, "requested_ip_unavailable");
    assertEquals(env.fake.enis.size, 0);
    const ok = await env.provider.allocateNextENI(owner(2), {
      ips: [],
      ranges: [[{ subnet: "10.0.0.0/16" }]],
    });
    assertEquals(ok.ipv4?.prefixLength, 24);
  } finally {
    await env.close();
  }
});

Deno.test("20 parallel allocations on a node limited to 8 ENIs never exceed 8", async () => {
  const env = await setup({ maxEnisPerNode: 8, fake: { attachDelayMs: 40 } });
  try {
    const results = await Promise.allSettled(
      Array.from({ length: 20 }, (_, i) => env.provider.allocateNextENI(owner(i), ANY_ADDRESS)),
    );
    const ok = results.filter((r) => r.status === "fulfilled");
    const failed = results.filter((r) => r.status === "rejected") as PromiseRejectedResult[];
    assertEquals(ok.length, 8);
    for (const f of failed) {
      assert(f.reason instanceof ProviderError);
      assertEquals(f.reason.reason, "no_eni_available");
    }
    assertEquals(env.fake.maxAttached.get(INSTANCE), 8);
    assertEquals(env.fake.enis.size, 8);
    assertEquals(env.fake.attachedTo(INSTANCE).length, 8);
  } finally {
    await env.close();
  }
});

Deno.test("a foreign ENI attached to the node counts against the node limit", async () => {
  const fake = startFake();
  fake.seedEni({ name: "other/x", instanceId: INSTANCE, status: "inuse" });
  const env = await setup({ withFake: fake, maxEnisPerNode: 2 });
  try {
    await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    const err = await env.provider.allocateNextENI(owner(2), ANY_ADDRESS).then(
      () => null,
      (e) => e,
    );
    assertEquals(err?.reason, "no_eni_available");
    assertEquals(fake.attachedTo(INSTANCE).length, 2);
  } finally {
    await env.close();
    await fake.close();
  }
});

Deno.test("throttling and 5xx are retried and succeed", async () => {
  const env = await setup({ maxEnisPerNode: 4, timeouts: { maxAttempts: 8 } });
  try {
    // 429 with an empty body (bce-sdk-go reports TooManyRequests), then CCE's "RateLimit" marker.
    env.fake.inject({ kind: "throttle" }, 1);
    env.fake.inject({ kind: "throttle", status: 400, message: "Request RateLimit exceeded" }, 1);
    env.fake.inject({ kind: "status", status: 503, code: "ServiceUnavailable" }, 1);
    env.fake.inject({ kind: "status", status: 500 }, 1);
    env.fake.inject({ kind: "status", status: 504, code: "GatewayTimeout" }, 1);
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    assertEquals(env.fake.pendingFaults, 0);
    assertEquals(env.fake.enis.size, 1);
    assertEquals(env.fake.enis.get(a.id)?.status, "inuse");
    assert(env.fake.requests.some((r) => r.status === 429));
  } finally {
    await env.close();
  }
});

Deno.test("an auth failure names the access key id and never the secret", async () => {
  const fake = startFake();
  try {
    const bad = testClient(fake);
    // A client whose secret does not match the server's.
    const wrong = clientWith(fake.url, {
      credentials: { accessKeyId: AK, secretAccessKey: SECRET + "x", sessionToken: SESSION_TOKEN },
    });
    const err = await wrong.getEni("eni-abcdefabcdef").then(() => null, (e) => e);
    assert(err instanceof ProviderError);
    assertEquals(err.reason, "auth_failed");
    assertStringIncludes(err.message, AK);
    assertStringIncludes(err.message, "SignatureDoesNotMatch");
    assert(!err.message.includes(SECRET) && !err.message.includes(SESSION_TOKEN));
    assert(err.requestId);
    recordError(err);
    const unknown = clientWith(fake.url, {
      credentials: { accessKeyId: "AKIDunknown", secretAccessKey: SECRET },
    });
    const err2 = await unknown.getEni("eni-abcdefabcdef").then(() => null, (e) => e);
    assertEquals(err2?.reason, "auth_failed");
    assertStringIncludes(err2.message, "AKIDunknown");
    recordError(err2);
    bad.close();
    wrong.close();
    unknown.close();
  } finally {
    await fake.close();
  }
});

Deno.test("a restart re-uses a persisted clientToken and adopts the ENI", async () => {
  const env = await setup({ maxEnisPerNode: 4 });
  try {
    // A crash after the create was sent: the intent is persisted, the ENI exists.
    const client = testClient(env.fake);
    const token = crypto.randomUUID();
    const name = `enim/${INSTANCE}/abc123`;
    const eniId = await client.createEni({
      name,
      subnetId: "sbn-fake0001",
      securityGroupIds: [],
      enterpriseSecurityGroupIds: [],
    }, token);
    client.close();
    env.db.prepare(
      "INSERT INTO bce_intents (id, kind, client_token, name, eni_id, requested_ip, purpose, phase, created_ms) VALUES (?, 'create', ?, ?, NULL, NULL, 'owner', 'active', ?)",
    ).run(token, token, name, Date.now());
    await env.provider.close();
    const p2 = await env.restart();
    await eventually(async () => (await p2.status()).free === 1, 5000, "adoption");
    assertEquals(env.fake.enis.size, 1);
    assertEquals(env.fake.enis.get(eniId)?.status, "inuse");
    const creates = env.fake.requests.filter((r) => r.method === "POST");
    assertEquals(creates.map((r) => r.query.clientToken), [token, token]);
    const a = await p2.allocateNextENI(owner(1), ANY_ADDRESS);
    assertEquals(a.id, eniId);
  } finally {
    await env.close();
  }
});

Deno.test("the pool loop deletes orphaned available ENIs of this node and nothing else", async () => {
  // i-other is a node that exists (its agent down): its ENIs are its own.
  const fake = startFake({
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
    assert(!fake.enis.has(orphan.eniId));
    assert(fake.enis.has(otherNode.eniId));
    assert(fake.enis.has(foreign.eniId));
  } finally {
    await env.close();
    await fake.close();
  }
});

Deno.test("the pool loop reclaims the ENIs a released instance left, and keeps a stopped one's", async () => {
  const fake = startFake({
    instances: {
      [INSTANCE]: { eniQuota: 16 },
      "i-gone01": { eniQuota: 8 },
      "i-stopped1": { eniQuota: 8 },
    },
  });
  const gone = [1, 2].map((i) =>
    fake.seedEni({ name: `enim/i-gone01/e${i}`, instanceId: "i-gone01", status: "inuse" })
  );
  const stopped = fake.seedEni({
    name: "enim/i-stopped1/e1",
    instanceId: "i-stopped1",
    status: "inuse",
  });
  // Detached from the stopped node: available, but its instance may boot again.
  const stoppedFree = fake.seedEni({ name: "enim/i-stopped1/e2" });
  fake.setInstanceStatus("i-stopped1", "Stopped");
  // A zone-sticky pod's ENI the gone node parked, its hold not over: kept for the pod.
  const parked = fake.seedEni({
    name: "enim/z/c1/0123456789abcdef",
    description: encodeRecord({
      state: "parked",
      cluster: "c1",
      pod: "payments/db-0",
      ifName: "eth0",
      until: Date.now() + 3_600_000,
      by: "i-gone01",
    }),
  });
  // The node is gone for good: BCE releases its instance and the ENIs are left available.
  fake.removeInstance("i-gone01");
  const env = await setup({
    withFake: fake,
    maxEnisPerNode: 2,
    warmPool: { minIdle: 0, maxIdle: 1 },
  });
  try {
    await env.provider.maintainPool();
    for (const e of gone) assert(!fake.enis.has(e.eniId), `${e.name} reclaimed`);
    assert(fake.enis.has(stopped.eniId), "a stopped node keeps its ENI");
    assert(fake.enis.has(stoppedFree.eniId), "a stopped node keeps its detached ENI");
    assert(fake.enis.has(parked.eniId), "a parked sticky ENI waits for its hold's expiry");
  } finally {
    await env.close();
    await fake.close();
  }
});

Deno.test("a failed attach is rolled back: the ENI is deleted and the slot freed", async () => {
  const env = await setup({ maxEnisPerNode: 2 });
  try {
    env.fake.inject({
      kind: "status",
      status: 400,
      code: "InappropriateJSON",
      match: { method: "PUT", action: "attach" },
    }, 1);
    const err = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS).then(
      () => null,
      (e) => e,
    );
    assert(err instanceof ProviderError);
    recordError(err);
    assertEquals(env.fake.enis.size, 0);
    assertEquals((await env.provider.status()).attachable, 2);
  } finally {
    await env.close();
  }
});

Deno.test("no log line or error message holds the secret key or session token", () => {
  assert(LOG_LINES.length > 20, `expected many collected log lines, got ${LOG_LINES.length}`);
  assert(LOG_LINES.some((l) => l.includes(AK)));
  assertNoSecretsLogged();
});
