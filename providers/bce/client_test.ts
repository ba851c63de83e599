import { assert, assertEquals, assertStringIncludes } from "../../lib/assert.ts";
import { ProviderError } from "../contract.ts";
import { BceApiError } from "./errors.ts";
import {
  AK,
  assertNoSecretsLogged,
  clientWith,
  INSTANCE,
  recordError,
  SECRET,
  SESSION_TOKEN,
  startFake,
  testClient,
} from "../../tests/support/bce_harness.ts";

const VPC = "vpc-fake0001";
const SUBNET = "sbn-fake0001";
const args = (name: string) => ({
  name,
  subnetId: SUBNET,
  securityGroupIds: ["g-1"],
  enterpriseSecurityGroupIds: [],
});

Deno.test("listEnis() reads every page, matches names on our side only and drops ERIs", async () => {
  const fake = startFake({ maxKeysCap: 2 });
  const client = testClient(fake);
  try {
    for (let i = 0; i < 5; i++) fake.seedEni({ name: `enim/${INSTANCE}/a${i}` });
    fake.seedEni({ name: `xenim/${INSTANCE}/other` });
    fake.seedEni({ name: `enim/${INSTANCE}/eri`, networkInterfaceTrafficMode: "highPerformance" });
    const all = await client.listEnis({ vpcId: VPC, namePrefix: "enim/" });
    assertEquals(all.length, 5);
    assert(all.every((e) => e.name.startsWith("enim/")));
    const lists = fake.requests.filter((r) => r.path === "/v1/eni" && r.method === "GET");
    assert(lists.length >= 4, `expected several pages, got ${lists.length}`);
    assertEquals(lists[1].query.marker !== undefined, true);
    assert(lists.every((r) => r.query.vpcId === VPC));
    // BCE's name filter (exact? prefix? fuzzy? unverified) is never sent.
    assert(lists.every((r) => !("name" in r.query)), "no list carries a name filter");
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("createEni() sends [] for empty lists and attach uses the bare ?attach flag", async () => {
  // Attached at once with the raw client: no young-ENI refusal.
  const fake = startFake({ youngEniRefusesAttachMs: 0 });
  const client = testClient(fake);
  try {
    const id = await client.createEni(args("enim/x/1"), "tok-1");
    assertEquals(fake.enis.get(id)?.enterpriseSecurityGroupIds, []);
    assertEquals(await client.createEni(args("enim/x/1"), "tok-1"), id);
    assertEquals(fake.enis.size, 1);
    await client.attachEni(id, INSTANCE, "tok-1-attach");
    const put = fake.requests.find((r) => r.method === "PUT")!;
    assertEquals(put.rawQuery, "attach&clientToken=tok-1-attach");
    assertStringIncludes(put.headers.authorization, "host;x-bce-date;x-bce-security-token");
    assertEquals(put.headers["x-bce-security-token"], SESSION_TOKEN);
    assertEquals(await client.eniStatus(id), "attaching");
    await new Promise((r) => setTimeout(r, 40));
    const d = await client.getEni(id);
    assertEquals([d.status, d.instanceId], ["inuse", INSTANCE]);
    assertEquals((await client.eniQuota(INSTANCE)).availableQuantity, 15);
    assertEquals((await client.getSubnet(SUBNET)).cidr, "10.0.1.0/24");
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("errors map to provider reasons with the request id", async (t) => {
  // The set-up attaches a new ENI at once with the raw client: no young-ENI refusal.
  const fake = startFake({
    subnets: [{ subnetId: SUBNET, cidr: "10.0.9.0/30" }],
    youngEniRefusesAttachMs: 0,
  });
  const client = testClient(fake);
  try {
    await t.step("missing ENI → not_found", async () => {
      const e = await client.getEni("eni-000000000000").then(() => null, (e) => e);
      assert(e instanceof ProviderError);
      assertEquals(e.reason, "not_found");
      assert(e.requestId);
      assertStringIncludes(e.message, e.requestId!);
    });
    const id = await client.createEni(args("enim/x/1"), "t1");
    await client.attachEni(id, INSTANCE, "t1-a");
    await t.step("delete of an attaching ENI → a 400 that says nothing is gone", async () => {
      const e = await client.deleteEni(id, "t1-d").then(() => null, (e) => e);
      assert(e instanceof BceApiError);
      assertEquals([e.status, e.code, e.missing, e.retryable], [
        400,
        "EniStatusException",
        null,
        false,
      ]);
    });
    await t.step("a /30 subnet with one host free → subnet_full on the second create", async () => {
      const e = await client.createEni(args("enim/x/2"), "t2").then(() => null, (e) => e);
      assertEquals(e?.reason, "subnet_full");
      recordError(e);
    });
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("RequestExpired is retried with a fresh signature", async () => {
  const fake = startFake();
  const client = testClient(fake);
  try {
    fake.inject({ kind: "skew" }, 1);
    const id = await client.createEni(args("enim/x/1"), "t1");
    const creates = fake.requests.filter((r) => r.method === "POST");
    assertEquals(creates.length, 2);
    assertEquals(creates[0].code, "RequestExpired");
    assert(fake.enis.has(id));
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("a clock 3 h slow is corrected from the server's Date header: the call is resent once and later calls are right first time", async () => {
  const fake = startFake();
  const client = clientWith(fake.url, {
    now: () => new Date(Date.now() - 3 * 3600_000),
    retry: { maxAttempts: 5, baseDelayMs: 1, maxDelayMs: 2 },
  });
  try {
    assertEquals(await client.listEnis({ vpcId: "vpc-fake0001" }), []);
    assertEquals(fake.requests.map((r) => r.code ?? r.status), ["RequestExpired", 200]);
    assert(Math.abs(client.clockOffsetMs - 3 * 3600_000) < 5000, String(client.clockOffsetMs));
    await client.listEnis({ vpcId: "vpc-fake0001" });
    assertEquals(fake.requests.length, 3, "no RequestExpired once corrected");
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("a server whose clock is 2 h ahead: the first call corrects for it (fake clockOffsetMs)", async () => {
  const fake = startFake({ clockOffsetMs: 2 * 3600_000 });
  const client = testClient(fake);
  try {
    const id = await client.createEni(args("enim/x/1"), "t1");
    assert(fake.enis.has(id));
    assertEquals(fake.requests.map((r) => r.code ?? r.status), ["RequestExpired", 200]);
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("a signature still refused after the clock's correction fails as RequestExpired, clearly, after one resend", async () => {
  const fake = startFake();
  const client = clientWith(fake.url, {
    retry: { maxAttempts: 5, baseDelayMs: 1, maxDelayMs: 2 },
  });
  try {
    fake.inject({ kind: "skew" }, 2);
    const e = await client.getEni("eni-000000000000").then(() => null, (e) => e);
    assertEquals(e?.reason, "auth_failed");
    assertStringIncludes(e.message, "RequestExpired");
    assertStringIncludes(e.message, AK);
    assertEquals(fake.requests.length, 2);
    recordError(e);
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("a slow response times out per request and is retried within the total budget", async () => {
  const fake = startFake();
  const client = testClient(fake, { requestTimeoutMs: 100, totalTimeoutMs: 5000 });
  try {
    fake.inject({ kind: "slow", delayMs: 400 }, 1);
    const id = await client.createEni(args("enim/x/1"), "t1");
    assertEquals(fake.enis.size, 1);
    assert(fake.enis.has(id));
    const slow = testClient(fake, { requestTimeoutMs: 50, totalTimeoutMs: 200, maxAttempts: 10 });
    fake.inject({ kind: "slow", delayMs: 300 }, 10);
    const e = await slow.getEni(id).then(() => null, (e) => e);
    assertEquals(e?.reason, "unavailable");
    assertStringIncludes(e.message, "Timed out");
    // The total budget (200 ms) stops the retries long before maxAttempts (10).
    assert(fake.requests.filter((r) => r.method === "GET").length < 10);
    slow.close();
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("a network failure is retried and then reported as unavailable", async () => {
  const fake = startFake();
  const url = fake.url;
  await fake.close();
  const client = clientWith(url, {
    credentials: { accessKeyId: AK, secretAccessKey: SECRET },
    retry: { maxAttempts: 3, baseDelayMs: 1, maxDelayMs: 2 },
  });
  try {
    const e = await client.getEni("eni-000000000000").then(() => null, (e) => e);
    assertEquals(e?.reason, "unavailable");
    recordError(e);
  } finally {
    client.close();
  }
});

Deno.test("client tests logged no secret", () => {
  assertNoSecretsLogged();
});
