import { assert, assertEquals } from "../lib/assert.ts";
import { bceTimestamp, sign, wireQuery } from "../providers/bce/signer.ts";
import { type FakeEni, toContractEni } from "./bce_fake.ts";
import {
  AK,
  assertNoSecretsLogged,
  INSTANCE,
  SECRET,
  SESSION_TOKEN,
  startFake,
  testClient,
} from "../providers/bce/_harness.ts";

/** Sends one hand-signed request to the fake. */
async function send(
  url: string,
  method: string,
  path: string,
  opts: { secret?: string; ak?: string; tamper?: boolean; query?: [string, string | null][] } = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const u = new URL(url);
  const ts = bceTimestamp(new Date());
  const headers: Record<string, string> = {
    host: u.host,
    "x-bce-date": ts,
    "x-bce-security-token": SESSION_TOKEN,
  };
  const query = opts.query ?? [];
  const { authorization } = sign({
    method,
    path,
    query,
    headers,
    accessKeyId: opts.ak ?? AK,
    secretAccessKey: opts.secret ?? SECRET,
    timestamp: ts,
  });
  const qs = wireQuery(opts.tamper ? [...query, ["extra", "1"]] : query);
  const res = await fetch(`${url}${path}${qs ? "?" + qs : ""}`, {
    method,
    headers: { "x-bce-date": ts, "x-bce-security-token": SESSION_TOKEN, authorization },
  });
  return { status: res.status, body: await res.json() };
}

Deno.test("the fake verifies every signature like BCE", async (t) => {
  const fake = startFake();
  try {
    await t.step("a good signature passes", async () => {
      const r = await send(fake.url, "GET", "/v1/eni", { query: [["vpcId", "vpc-fake0001"]] });
      assertEquals(r.status, 200);
    });
    await t.step("a wrong secret → 403 SignatureDoesNotMatch with a requestId", async () => {
      const r = await send(fake.url, "GET", "/v1/eni", { secret: "nope", query: [["vpcId", "v"]] });
      assertEquals(r.status, 403);
      assertEquals(r.body.code, "SignatureDoesNotMatch");
      assert(typeof r.body.requestId === "string" && typeof r.body.message === "string");
    });
    await t.step("an unsigned extra query parameter → 403", async () => {
      const r = await send(fake.url, "GET", "/v1/eni", { tamper: true, query: [["vpcId", "v"]] });
      assertEquals(r.status, 403);
    });
    await t.step("an unknown access key → 403 InvalidAccessKeyId", async () => {
      const r = await send(fake.url, "GET", "/v1/eni", {
        ak: "AKIDnobody",
        query: [["vpcId", "v"]],
      });
      assertEquals([r.status, r.body.code], [403, "InvalidAccessKeyId"]);
    });
    await t.step("no Authorization → 400 InvalidHTTPAuthHeader", async () => {
      const res = await fetch(`${fake.url}/v1/eni?vpcId=v`);
      assertEquals(res.status, 400);
      assertEquals((await res.json()).code, "InvalidHTTPAuthHeader");
    });
  } finally {
    await fake.close();
  }
});

Deno.test("the fake runs the ENI state machine with async attach/detach and hooks", async () => {
  const attached: FakeEni[] = [];
  const detached: FakeEni[] = [];
  const fake = startFake({
    attachDelayMs: 30,
    detachDelayMs: 30,
    onAttach: (e) => void attached.push(e),
    onDetach: (e) => void detached.push(e),
  });
  const c = testClient(fake);
  try {
    const id = await c.createEni({
      name: "enim/a/1",
      subnetId: "sbn-fake0001",
      securityGroupIds: [],
      enterpriseSecurityGroupIds: [],
    }, "t1");
    const eni = fake.enis.get(id)!;
    assert(/^fa:f6(:[0-9a-f]{2}){4}$/.test(eni.macAddress));
    assertEquals(eni.privateIpSet[0].privateIpAddress, "10.0.1.2");
    assertEquals(eni.status, "available");
    assertEquals(toContractEni(fake, eni).ipv4, {
      address: "10.0.1.2",
      prefixLength: 24,
      gateway: "10.0.1.1",
    });
    await c.attachEni(id, INSTANCE, "t1-a");
    assertEquals(eni.status, "attaching");
    const delErr = await c.deleteEni(id, "t1-d").then(() => null, (e) => e);
    assertEquals(delErr?.reason, "wrong_state");
    await new Promise((r) => setTimeout(r, 60));
    assertEquals(eni.status, "inuse");
    assertEquals(attached.map((e) => e.eniId), [id]);
    assertEquals(
      (await fetch(fake.metadataUrl + "network/interfaces/macs").then((r) => r.text())).includes(
        eni.macAddress,
      ),
      true,
    );
    await c.detachEni(id, INSTANCE, "t1-x");
    assertEquals(eni.status, "detaching");
    assertEquals(detached.length, 1);
    await new Promise((r) => setTimeout(r, 60));
    assertEquals([eni.status, eni.instanceId], ["available", ""]);
    await c.deleteEni(id, "t1-d2");
    assertEquals(fake.enis.size, 0);
    await c.deleteEni(id, "t1-d2"); // the same token again: still fine
    assertEquals(fake.maxAttached.get(INSTANCE), 1);
  } finally {
    c.close();
    await fake.close();
  }
});

Deno.test("the fake enforces the instance quota and honours clientToken", async () => {
  const fake = startFake({ instances: { [INSTANCE]: { eniQuota: 1 } }, attachDelayMs: 1 });
  const c = testClient(fake);
  try {
    const mk = (n: string, tok: string) =>
      c.createEni({
        name: n,
        subnetId: "sbn-fake0001",
        securityGroupIds: [],
        enterpriseSecurityGroupIds: [],
      }, tok);
    const a = await mk("enim/a/1", "ta");
    assertEquals(await mk("enim/a/1", "ta"), a);
    const b = await mk("enim/a/2", "tb");
    await c.attachEni(a, INSTANCE, "ta-a");
    await c.attachEni(a, INSTANCE, "ta-a");
    const e = await c.attachEni(b, INSTANCE, "tb-a").then(() => null, (e) => e);
    assertEquals(e?.reason, "quota_exceeded");
    assertEquals(fake.attachedTo(INSTANCE).length, 1);
  } finally {
    c.close();
    await fake.close();
  }
});

Deno.test("the fake tests logged no secret", () => {
  assertNoSecretsLogged();
});
