import { createHmac } from "node:crypto";
import { assert, assertEquals } from "../lib/assert.ts";
import { bceTimestamp, sign, uriEncode, wireQuery } from "../providers/bce/signer.ts";
import SdkAuth from "@baiducloud/sdk/src/auth.js";
import { CODES, type FakeEni, toContractEni } from "./support/bce_fake.ts";
import { BceApiError } from "../providers/bce/errors.ts";
import {
  AK,
  assertNoSecretsLogged,
  INSTANCE,
  SECRET,
  SESSION_TOKEN,
  startFake as startCloudLikeFake,
  testClient,
} from "./support/bce_harness.ts";

/** The fake with its plain-API defaults (these tests test the fake; its cloud-like options have their own). */
const startFake = (opts: Parameters<typeof startCloudLikeFake>[0] = {}) =>
  startCloudLikeFake({
    youngEniRefusesAttachMs: 0,
    instanceIdWhileAttaching: "set",
    tokenScope: "operation",
    ...opts,
  });

type Query = [string, string | null][];

/** Sends one request signed by `authorize` (enim's signer unless given). */
/** enim's signature of a request at `ts`, with the test credentials unless `ak` and `secret` are given. */
function signed(
  method: string,
  path: string,
  query: Query,
  headers: Record<string, string>,
  ts: string,
  ak = AK,
  secret = SECRET,
) {
  return sign({
    method,
    path,
    query,
    headers,
    accessKeyId: ak,
    secretAccessKey: secret,
    timestamp: ts,
  });
}

async function send(
  url: string,
  method: string,
  path: string,
  opts: {
    secret?: string;
    ak?: string;
    tamper?: boolean;
    query?: Query;
    authorize?: (headers: Record<string, string>, ts: string) => string;
  } = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const u = new URL(url);
  const ts = bceTimestamp(new Date());
  const headers: Record<string, string> = {
    host: u.host,
    "x-bce-date": ts,
    "x-bce-security-token": SESSION_TOKEN,
  };
  const query = opts.query ?? [];
  const authorization = opts.authorize?.(headers, ts) ??
    signed(method, path, query, headers, ts, opts.ak, opts.secret).authorization;
  const qs = wireQuery(opts.tamper ? [...query, ["extra", "1"]] : query);
  const res = await fetch(`${url}${path}${qs ? "?" + qs : ""}`, {
    method,
    headers: { "x-bce-date": ts, "x-bce-security-token": SESSION_TOKEN, authorization },
  });
  return { status: res.status, body: await res.json() };
}

Deno.test("the fake checks signatures with the official SDK's signer, not enim's", async (t) => {
  const fake = startFake();
  try {
    await t.step("the fake's source does not import enim's signer", async () => {
      const src = await Deno.readTextFile(new URL("./support/bce_fake.ts", import.meta.url));
      const imports = [...src.matchAll(/^import .* from "([^"]+)";$/gm)].map((m) => m[1]);
      assert(!imports.some((i) => i.includes("signer")), JSON.stringify(imports));
      assert(imports.includes("@baiducloud/sdk/src/auth.js"), JSON.stringify(imports));
    });
    await t.step("a request signed by enim's signer passes", async () => {
      const r = await send(fake.url, "GET", "/v1/eni", { query: [["vpcId", "vpc-fake0001"]] });
      assertEquals(r.status, 200);
    });
    await t.step("a request signed by the official SDK passes", async () => {
      const r = await send(fake.url, "GET", "/v1/eni", {
        query: [["vpcId", "vpc-fake0001"], ["maxKeys", "10"]],
        authorize: (headers, ts) =>
          String(
            new SdkAuth(AK, SECRET).generateAuthorization(
              "GET",
              "/v1/eni",
              { vpcId: "vpc-fake0001", maxKeys: "10" },
              headers,
              Date.parse(ts) / 1000,
              1800,
            ),
          ),
      });
      assertEquals(r.status, 200);
    });
    await t.step("a signer bug (query pairs in send order, not sorted) is caught", async () => {
      const query: Query = [["vpcId", "vpc-fake0001"], ["maxKeys", "10"]];
      const r = await send(fake.url, "GET", "/v1/eni", {
        query,
        authorize: (headers, ts) => buggySign("GET", "/v1/eni", query, headers, ts),
      });
      assertEquals([r.status, r.body.code], [403, "SignatureDoesNotMatch"]);
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

/** enim's algorithm with one deliberate bug: query pairs are not sorted. */
function buggySign(
  method: string,
  path: string,
  query: Query,
  headers: Record<string, string>,
  ts: string,
): string {
  const good = signed(method, path, query, headers, ts);
  const unsorted = query.map(([k, v]) => `${uriEncode(k)}=${uriEncode(v ?? "")}`).join("&");
  const lines = good.canonicalRequest.split("\n");
  lines[2] = unsorted;
  const key = good.signingKey;
  const sig = hmac(key, lines.join("\n"));
  return `bce-auth-v1/${AK}/${ts}/1800/${good.signedHeaders}/${sig}`;
}

function hmac(key: string, message: string): string {
  return createHmac("sha256", key).update(message, "utf8").digest("hex");
}

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
    assertEquals(toContractEni(fake.opts.subnets, eni).ipv4, {
      address: "10.0.1.2",
      prefixLength: 24,
      gateway: "10.0.1.1",
    });
    await c.attachEni(id, INSTANCE, "t1-a");
    assertEquals(eni.status, "attaching");
    const delErr = await c.deleteEni(id, "t1-d").then(() => null, (e) => e);
    assert(delErr instanceof BceApiError);
    assertEquals([delErr.status, delErr.code], [CODES.wrongState.status, CODES.wrongState.code]);
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
    assertEquals([e?.reason, e?.code], ["quota_exceeded", "QuotaLimitExceeded"]);
    assertEquals(fake.attachedTo(INSTANCE).length, 1);
  } finally {
    c.close();
    await fake.close();
  }
});

Deno.test("the fake answers with the codes public sources give", async (t) => {
  const fake = startFake();
  const c = testClient(fake, { maxAttempts: 1 });
  try {
    await t.step("a missing ENI: 404 EniNotFoundException 'eni:… resource not exist'", async () => {
      const e = await c.getEni("eni-000000000000").then(() => null, (e) => e);
      assertEquals([e?.status, e?.code, e?.missing], [404, "EniNotFoundException", "eni"]);
    });
    await t.step("a malformed ENI id: 400 EniIdException", async () => {
      const e = await c.getEni("eni-BAD").then(() => null, (e) => e);
      assertEquals([e?.status, e?.code, e?.missing], [400, "EniIdException", "eni"]);
    });
    await t.step("an unknown instance: 404 NoSuchObject, which is not 'ENI gone'", async () => {
      const e = await c.getInstance("i-nobody").then(() => null, (e) => e);
      assertEquals([e?.status, e?.code, e?.missing], [404, "NoSuchObject", "instance"]);
    });
    await t.step("the instance detail carries eniQuota, cpuCount, status and zone", async () => {
      assertEquals(await c.getInstance(INSTANCE), {
        id: INSTANCE,
        status: "Running",
        zoneName: "cn-bj-a",
        eniQuota: 16,
        cpuCount: 4,
      });
    });
  } finally {
    c.close();
    await fake.close();
  }
});

Deno.test("the fake's name filter matches exactly, so a prefix finds nothing", async () => {
  const fake = startFake();
  try {
    const eni = fake.seedEni({ name: `enim/${INSTANCE}/abc123` });
    const prefix = await send(fake.url, "GET", "/v1/eni", {
      query: [["vpcId", "vpc-fake0001"], ["name", `enim/${INSTANCE}/`]],
    });
    assertEquals(prefix.body.enis, []);
    const exact = await send(fake.url, "GET", "/v1/eni", {
      query: [["vpcId", "vpc-fake0001"], ["name", eni.name]],
    });
    assertEquals((exact.body.enis as FakeEni[]).map((e) => e.eniId), [eni.eniId]);
  } finally {
    await fake.close();
  }
});

Deno.test("the fake models stuck ENIs, late visibility, out-of-band changes and IPv6", async (t) => {
  const fake = startFake({
    subnets: [{ subnetId: "sbn-fake0001", cidr: "10.0.1.0/24", ipv6Cidr: "fd00:1::/64" }],
    attachDelayMs: 5,
    detachDelayMs: 5,
  });
  const c = testClient(fake, { maxAttempts: 1 });
  const mk = (name: string, ipv6 = false) =>
    c.createEni({
      name,
      subnetId: "sbn-fake0001",
      securityGroupIds: [],
      enterpriseSecurityGroupIds: [],
      ipv6,
    }, crypto.randomUUID());
  try {
    await t.step("stuck in attaching: detach and delete refused until unstuck", async () => {
      const id = await mk("enim/s/1");
      fake.inject({ kind: "stuck", state: "attaching" });
      await c.attachEni(id, INSTANCE, "s1-a");
      await new Promise((r) => setTimeout(r, 30));
      assertEquals(fake.enis.get(id)?.status, "attaching");
      const d = await c.detachEni(id, INSTANCE, "s1-d").then(() => null, (e) => e);
      assertEquals(d?.code, CODES.wrongState.code);
      const x = await c.deleteEni(id, "s1-x").then(() => null, (e) => e);
      assertEquals(x?.code, CODES.wrongState.code);
      fake.unstick(id);
      assertEquals(fake.enis.get(id)?.status, "inuse");
    });
    await t.step("stuck in attaching with escape 'detach': a detach frees it", async () => {
      const id = await mk("enim/s/2");
      fake.inject({ kind: "stuck", state: "attaching", escape: "detach" });
      await c.attachEni(id, INSTANCE, "s2-a");
      await c.detachEni(id, INSTANCE, "s2-d");
      await new Promise((r) => setTimeout(r, 30));
      assertEquals(fake.enis.get(id)?.status, "available");
    });
    await t.step("invisible for two reads after its create", async () => {
      fake.inject({ kind: "invisible", reads: 2 });
      const id = await mk("enim/v/1");
      for (let i = 0; i < 2; i++) {
        const e = await c.getEni(id).then(() => null, (e) => e);
        assertEquals(e?.code, "EniNotFoundException");
      }
      assertEquals((await c.getEni(id)).eniId, id);
    });
    await t.step("IPv6 from the subnet's ipv6Cidr when asked", async () => {
      const id = await mk("enim/6/1", true);
      const eni = fake.enis.get(id)!;
      assertEquals(eni.ipv6PrivateIpSet.map((p) => [p.privateIpAddress, p.primary]), [[
        "fd00:1::2",
        false,
      ]]);
      const post = fake.requests.findLast((r) => r.method === "POST")!;
      assertEquals(
        (post.body as { ipv6PrivateIpSet: unknown }).ipv6PrivateIpSet,
        [{ publicIpAddress: "", primary: false, privateIpAddress: "" }],
      );
      assertEquals(toContractEni(fake.opts.subnets, eni).ipv6, {
        address: "fd00:1::2",
        prefixLength: 64,
        gateway: "fd00:1::1",
      });
    });
    await t.step("deleted out of band: gone, its device unplugged", async () => {
      const detached: string[] = [];
      fake.opts.onDetach = (e) => void detached.push(e.eniId);
      const id = await mk("enim/o/1");
      await c.attachEni(id, INSTANCE, "o1-a");
      await new Promise((r) => setTimeout(r, 30));
      fake.deleteOutOfBand(id);
      await new Promise((r) => setTimeout(r, 10));
      assertEquals([fake.enis.has(id), detached], [false, [id]]);
    });
  } finally {
    c.close();
    await fake.close();
  }
});

Deno.test("the fake replaces groups with bindSg/bindEsg, sets descriptions and checks every field", async (t) => {
  const fake = startFake({
    subnets: [
      { subnetId: "sbn-fake0001", cidr: "10.0.1.0/24" },
      { subnetId: "sbn-fake0002", cidr: "10.0.2.0/24", ipv6Cidr: "fd00:2::/64" },
    ],
    securityGroups: ["g-a", "g-b"],
    enterpriseSecurityGroups: ["esg-a"],
  });
  const c = testClient(fake, { maxAttempts: 1 });
  const fail = <T>(p: Promise<T>) => p.then(() => null, (e: BceApiError) => e);
  try {
    const id = await c.createEni({
      name: "enim/g/1",
      subnetId: "sbn-fake0002",
      securityGroupIds: ["g-a"],
      enterpriseSecurityGroupIds: [],
      privateIpAddress: "10.0.2.9",
      ipv6: "fd00:2::9",
      description: "pool",
    }, crypto.randomUUID());
    const eni = () => fake.enis.get(id)!;
    await t.step("a create honours the chosen IPv4 and IPv6 in the subnet", () => {
      assertEquals(eni().privateIpSet.map((p) => p.privateIpAddress), ["10.0.2.9"]);
      assertEquals(eni().ipv6PrivateIpSet.map((p) => p.privateIpAddress), ["fd00:2::9"]);
      assertEquals([eni().subnetId, eni().securityGroupIds, eni().description], [
        "sbn-fake0002",
        ["g-a"],
        "pool",
      ]);
    });
    await t.step("bindSg and bindEsg replace every group, of either kind", async () => {
      await c.bindEnterpriseSecurityGroups(id, ["esg-a"], crypto.randomUUID());
      assertEquals([eni().securityGroupIds, eni().enterpriseSecurityGroupIds], [[], ["esg-a"]]);
      await c.bindSecurityGroups(id, ["g-a", "g-b"], crypto.randomUUID());
      assertEquals([eni().securityGroupIds, eni().enterpriseSecurityGroupIds], [
        ["g-a", "g-b"],
        [],
      ]);
    });
    await t.step("a group of the other kind, an unknown one or none is refused", async () => {
      const wrongKind = await fail(c.bindSecurityGroups(id, ["esg-a"], crypto.randomUUID()));
      assertEquals([wrongKind?.status, wrongKind?.code], [404, "NoSuchObject"]);
      const unknown = await fail(
        c.bindEnterpriseSecurityGroups(id, ["esg-zz"], crypto.randomUUID()),
      );
      assertEquals(unknown?.code, "NoSuchObject");
      const none = await fail(c.bindSecurityGroups(id, [], crypto.randomUUID()));
      assertEquals(none?.code, "InappropriateJSON");
      assertEquals(eni().securityGroupIds, ["g-a", "g-b"], "nothing changed");
    });
    await t.step("a create with both kinds of groups is refused", async () => {
      const e = await fail(c.createEni({
        name: "enim/g/2",
        subnetId: "sbn-fake0001",
        securityGroupIds: ["g-a"],
        enterpriseSecurityGroupIds: ["esg-a"],
      }, crypto.randomUUID()));
      assertEquals([e?.status, e?.code], [400, "BadRequest"]);
    });
    await t.step("a misspelt or missing field is refused with InappropriateJSON", async () => {
      for (
        const [query, body] of [
          [[["bindSg", null]], { securityGroupId: ["g-a"] }],
          [[["bindEsg", null]], { securityGroupIds: ["esg-a"] }],
          [[["modifyAttribute", null]], { desc: "x" }],
          [[["modifyAttribute", null]], {}],
          [[["attach", null]], { instanceID: INSTANCE }],
          [[["detach", null]], {}],
        ] as [Query, Record<string, unknown>][]
      ) {
        const res = await sendJson(fake.url, "PUT", `/v1/eni/${id}`, query, body);
        assertEquals([res.status, res.body.code], [400, "InappropriateJSON"], JSON.stringify(body));
      }
      const res = await sendJson(fake.url, "POST", "/v1/eni", [], {
        name: "enim/g/3",
        subnetId: "sbn-fake0001",
        privateIpSet: [{ primary: true, privateIpAddress: "" }],
        securityGroupId: ["g-a"],
      });
      assertEquals([res.status, res.body.code], [400, "InappropriateJSON"]);
    });
    await t.step("modifyAttribute sets the description (and the name when given)", async () => {
      await c.updateEni(id, { description: "default/web-0 on node-1" }, crypto.randomUUID());
      assertEquals([eni().name, eni().description], ["enim/g/1", "default/web-0 on node-1"]);
      await c.updateEni(id, { name: "enim/g/1", description: "pool" }, crypto.randomUUID());
      assertEquals([eni().name, eni().description], ["enim/g/1", "pool"]);
      const bad = await fail(
        c.updateEni(id, { name: "1bad", description: "x" }, crypto.randomUUID()),
      );
      assertEquals(bad?.code, "InappropriateJSON");
    });
  } finally {
    c.close();
    await fake.close();
  }
});

/** Sends one signed request with a JSON body. */
async function sendJson(
  url: string,
  method: string,
  path: string,
  query: Query,
  body: unknown,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const u = new URL(url);
  const ts = bceTimestamp(new Date());
  const headers: Record<string, string> = {
    host: u.host,
    "content-type": "application/json;charset=utf-8",
    "x-bce-date": ts,
    "x-bce-security-token": SESSION_TOKEN,
  };
  const { authorization } = signed(method, path, query, headers, ts);
  const qs = wireQuery(query);
  // fetch sends the URL's authority as Host: the value signed above.
  const { host: _, ...sent } = headers;
  const res = await fetch(`${url}${path}${qs ? "?" + qs : ""}`, {
    method,
    headers: { ...sent, authorization },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

Deno.test("the fake tests logged no secret", () => {
  assertNoSecretsLogged();
});

Deno.test("the fake's name filter can match by prefix, or be ignored as an unverified BCE might", async () => {
  for (const [mode, want] of [["prefix", 2], ["ignore", 3]] as const) {
    const fake = startFake({ nameFilter: mode });
    try {
      fake.seedEni({ name: "enim/z/c1/aaaa" });
      fake.seedEni({ name: "enim/z/c1/aaaabbbb" });
      fake.seedEni({ name: `enim/${INSTANCE}/abc123` });
      const r = await send(fake.url, "GET", "/v1/eni", {
        query: [["vpcId", "vpc-fake0001"], ["name", "enim/z/c1/aaaa"], ["maxKeys", "10"]],
      });
      assertEquals((r.body.enis as FakeEni[]).length, want, mode);
    } finally {
      await fake.close();
    }
  }
});

Deno.test("the fake's instances have a zone and a status; an attach is exclusive and zonal", async (t) => {
  const fake = startFake({
    subnets: [
      { subnetId: "sbn-fake0001", cidr: "10.0.1.0/24", zoneName: "cn-bj-a" },
      { subnetId: "sbn-fake0002", cidr: "10.0.2.0/24", zoneName: "cn-bj-b" },
    ],
    instances: {
      [INSTANCE]: { eniQuota: 4 },
      "i-fake0002": { eniQuota: 4 },
      "i-fakezoneb": { eniQuota: 4, zoneName: "cn-bj-b" },
    },
    attachDelayMs: 5,
    detachDelayMs: 5,
  });
  const c = testClient(fake, { maxAttempts: 1 });
  const mk = (subnetId = "sbn-fake0001") =>
    c.createEni({
      name: `enim/${INSTANCE}/${crypto.randomUUID().slice(0, 6)}`,
      subnetId,
      securityGroupIds: [],
      enterpriseSecurityGroupIds: [],
    }, crypto.randomUUID());
  const settle = () => new Promise((r) => setTimeout(r, 30));
  try {
    await t.step(
      "an instance's detail reports its status and zone, a released one 404",
      async () => {
        assertEquals((await c.getInstance(INSTANCE)).status, "Running");
        assertEquals((await c.getInstance("i-fakezoneb")).zoneName, "cn-bj-b");
        fake.setInstanceStatus("i-fake0002", "Stopped");
        assertEquals((await c.getInstance("i-fake0002")).status, "Stopped");
        const gone = await c.getInstance("i-nosuch").then(() => null, (e) => e);
        assertEquals([gone?.status, gone?.code, gone?.missing], [404, "NoSuchObject", "instance"]);
      },
    );
    await t.step("of two instances attaching one ENI at once, exactly one wins", async () => {
      const id = await mk();
      const outcomes = await Promise.allSettled([
        c.attachEni(id, INSTANCE, "race-a"),
        c.attachEni(id, "i-fake0002", "race-b"),
      ]);
      assertEquals(outcomes.filter((o) => o.status === "fulfilled").length, 1);
      const lost = outcomes.find((o) => o.status === "rejected") as PromiseRejectedResult;
      assert(lost.reason instanceof BceApiError && lost.reason.code === CODES.wrongState.code);
      await settle();
      assertEquals(fake.enis.get(id)?.status, "inuse");
      // A retry of the winner's attach (same token) is idempotent; the loser's is refused again.
      const winner = fake.enis.get(id)!.instanceId;
      await c.attachEni(id, winner, winner === INSTANCE ? "race-a" : "race-b");
    });
    await t.step(
      "an ENI on a stopped instance can be detached, and attached elsewhere",
      async () => {
        const id = await mk();
        await c.attachEni(id, "i-fake0002", "s-a");
        await settle();
        await c.detachEni(id, "i-fake0002", "s-d");
        await settle();
        await c.attachEni(id, INSTANCE, "s-a2");
        await settle();
        assertEquals(fake.enis.get(id)?.instanceId, INSTANCE);
      },
    );
    await t.step("an instance neither Running nor Stopped takes no attach", async () => {
      const id = await mk();
      fake.setInstanceStatus("i-fake0002", "Stopping");
      const e = await c.attachEni(id, "i-fake0002", "st-a").then(() => null, (e) => e);
      assertEquals(e?.status, 400);
      assertEquals(fake.enis.get(id)?.status, "available");
      fake.setInstanceStatus("i-fake0002", "Running");
    });
    await t.step("an ENI attaches only to an instance of its subnet's zone", async () => {
      const id = await mk("sbn-fake0001");
      assertEquals(fake.enis.get(id)?.zoneName, "cn-bj-a");
      const e = await c.attachEni(id, "i-fakezoneb", "z-a").then(() => null, (e) => e);
      assertEquals(e?.status, 400);
      assertEquals(fake.enis.get(id)?.status, "available");
      const b = await mk("sbn-fake0002");
      await c.attachEni(b, "i-fakezoneb", "z-b");
    });
    await t.step("a released instance's ENIs are left available", async () => {
      const id = await mk();
      await c.attachEni(id, "i-fake0002", "r-a");
      await settle();
      fake.removeInstance("i-fake0002");
      assertEquals([fake.enis.get(id)?.status, fake.enis.get(id)?.instanceId], ["available", ""]);
    });
  } finally {
    c.close();
    await fake.close();
  }
});

Deno.test("the fake also answers on a unix socket when asked", async () => {
  const path = await Deno.makeTempFile({ prefix: "enim-fake-", suffix: ".sock" });
  await Deno.remove(path);
  const fake = startFake({ unixSocket: path });
  const client = Deno.createHttpClient({ proxy: { transport: "unix", path } });
  try {
    const res = await fetch("http://fake/1.0/meta-data/instance-shortid", { client });
    assertEquals((await res.text()).trim(), INSTANCE);
  } finally {
    client.close();
    await fake.close();
    await Deno.remove(path).catch(() => {});
  }
});
