/**
 * BCE profiles against the fake BCE server (issue 18): each profile's subnet,
 * groups and warm pool; fixed IPs; inline security groups replaced and put back;
 * the node limit shared by the profiles; a sticky pod's takeover; descriptions.
 * What BCE holds is read back from the fake's state, not from enim's.
 */
import { z } from "zod";
import { assert, assertEquals, assertStringIncludes } from "../../lib/assert.ts";
import { ProviderError } from "../contract.ts";
import type { FakeSubnet } from "../../tests/support/bce_fake.ts";
import { DatabaseSync } from "node:sqlite";
import {
  ANY_ADDRESS,
  HARNESS_TIMEOUTS,
  INSTANCE,
  LOG_LINES,
  owner,
  recordError,
  setup,
  type SetupOptions,
  startFake,
  testClient,
} from "../../tests/support/bce_harness.ts";

/** The fake VPC: the default subnet (dual-stack) and profile b's and c's. */
const SUBNETS: FakeSubnet[] = [
  { subnetId: "sbn-fake0001", cidr: "10.0.1.0/24", ipv6Cidr: "fd00:1::/64" },
  { subnetId: "sbn-fakeb001", cidr: "10.0.2.0/24", ipv6Cidr: "fd00:2::/64" },
  { subnetId: "sbn-fakec001", cidr: "10.0.3.0/24" },
];
/** The groups that exist in the fake VPC. */
const GROUPS = {
  securityGroups: ["g-test0001", "g-b0001", "g-inline01", "g-inline02"],
  enterpriseSecurityGroups: ["esg-c0001", "esg-inline01"],
};
/** Profile b (regular groups) and c (enterprise groups), with their own warm pools. */
const PROFILES = {
  b: {
    subnetId: "sbn-fakeb001",
    securityGroupIds: ["g-b0001"],
    warmPool: { minIdle: 0, maxIdle: 5 },
    allowedSecurityGroupIds: ["g-inline01", "g-inline02", "esg-inline01"],
  },
  c: {
    subnetId: "sbn-fakec001",
    enterpriseSecurityGroupIds: ["esg-c0001"],
    warmPool: { minIdle: 0, maxIdle: 5 },
  },
};

/** A provider with profiles b and c against a fake with their subnets and groups. */
function withProfiles(opts: SetupOptions = {}) {
  return setup({
    maxEnisPerNode: 8,
    ...opts,
    fake: { subnets: SUBNETS, ...GROUPS, ...opts.fake },
    config: {
      allowedSecurityGroupIds: ["g-inline01", "esg-inline01"],
      profiles: PROFILES,
      ...opts.config,
    },
  });
}

async function eventually(fn: () => Promise<boolean> | boolean, ms = 5000, what = "condition") {
  const deadline = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const BodySchema = z.record(z.string(), z.unknown());

Deno.test("profiles() reports each profile with its subnet CIDRs, groups and rules", async () => {
  const env = await withProfiles({
    config: {
      namespaces: ["default", "web"],
      profiles: { ...PROFILES, c: { ...PROFILES.c, subnetCidr: "10.0.3.0/24" } },
    },
  });
  try {
    assertEquals(env.provider.profiles(), [
      {
        name: "default",
        subnets: { ipv4: "10.0.1.0/24", ipv6: "fd00:1::/64" },
        securityGroupIds: ["g-test0001"],
        enterpriseSecurityGroupIds: [],
        namespaces: ["default", "web"],
        allowedSecurityGroupIds: ["g-inline01", "esg-inline01"],
        sticky: { scope: "node", nodeHoldSeconds: 30 },
      },
      {
        name: "b",
        subnets: { ipv4: "10.0.2.0/24", ipv6: "fd00:2::/64" },
        securityGroupIds: ["g-b0001"],
        enterpriseSecurityGroupIds: [],
        namespaces: null,
        allowedSecurityGroupIds: ["g-inline01", "g-inline02", "esg-inline01"],
        sticky: { scope: "node", nodeHoldSeconds: 30 },
      },
      {
        name: "c",
        subnets: { ipv4: "10.0.3.0/24" },
        securityGroupIds: [],
        enterpriseSecurityGroupIds: ["esg-c0001"],
        namespaces: null,
        allowedSecurityGroupIds: [],
        sticky: { scope: "node", nodeHoldSeconds: 30 },
      },
    ]);
    // One lookup per subnet not configured (c's IPv4 was; its IPv6 range was asked for).
    const lookups = env.fake.requests.filter((r) => r.path.startsWith("/v1/subnet/"))
      .map((r) => r.path).sort();
    assertEquals(lookups, [
      "/v1/subnet/sbn-fake0001",
      "/v1/subnet/sbn-fakeb001",
      "/v1/subnet/sbn-fakec001",
    ]);
  } finally {
    await env.close();
  }
});

Deno.test("each profile's ENIs are created in its subnet with its groups", async () => {
  const env = await withProfiles();
  try {
    const d = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    const b = await env.provider.allocateNextENI(owner(2), { ...ANY_ADDRESS, profile: "b" });
    const c = await env.provider.allocateNextENI(owner(3), { ...ANY_ADDRESS, profile: "c" });
    const cloud = (id: string) => env.fake.enis.get(id)!;
    assertEquals(
      [d, b, c].map((e) => [
        e.profile,
        cloud(e.id).subnetId,
        cloud(e.id).securityGroupIds,
        cloud(e.id).enterpriseSecurityGroupIds,
        cloud(e.id).status,
      ]),
      [
        ["default", "sbn-fake0001", ["g-test0001"], [], "inuse"],
        ["b", "sbn-fakeb001", ["g-b0001"], [], "inuse"],
        ["c", "sbn-fakec001", [], ["esg-c0001"], "inuse"],
      ],
    );
    assertEquals(b.ipv4?.gateway, "10.0.2.1");
    assertEquals(b.ipv6?.gateway, "fd00:2::1");
    assertEquals(c.ipv6, null, "c's subnet has no IPv6 range");
    assertEquals(b.securityGroupIds, ["g-b0001"]);
    assertEquals(c.enterpriseSecurityGroupIds, ["esg-c0001"]);
    // The create bodies carried exactly the reference's fields.
    const creates = env.fake.requests.filter((r) => r.method === "POST" && r.status === 200);
    assertEquals(creates.length, 3);
    for (const r of creates) {
      assertEquals(
        Object.keys(BodySchema.parse(r.body)).sort().filter((k) => k !== "ipv6PrivateIpSet"),
        [
          "description",
          "enterpriseSecurityGroupIds",
          "name",
          "privateIpSet",
          "securityGroupIds",
          "subnetId",
        ],
      );
    }
    const st = await env.provider.status();
    assertEquals(st.profiles, {
      default: { free: 0, owned: 1 },
      b: { free: 0, owned: 1 },
      c: { free: 0, owned: 1 },
    });
    assertEquals((await env.provider.list()).map((e) => e.profile).sort(), ["b", "c", "default"]);
  } finally {
    await env.close();
  }
});

Deno.test("each profile keeps its own warm pool, and a pod of b never gets a default ENI", async () => {
  const env = await withProfiles({
    config: {
      warmPool: { minIdle: 2, maxIdle: 2 },
      profiles: { ...PROFILES, b: { ...PROFILES.b, warmPool: { minIdle: 1, maxIdle: 1 } } },
    },
  });
  try {
    await env.provider.start!();
    const pools = async () => (await env.provider.status()).profiles;
    await eventually(
      async () => {
        const p = await pools();
        return p.default?.free === 2 && p.b?.free === 1 && p.c?.free === 0;
      },
      5000,
      "default 2 free, b 1 free, c none",
    );
    const inSubnet = (id: string) => env.fake.enis.get(id)?.subnetId;
    const free = await env.provider.list();
    assertEquals(
      free.map((e) => [e.profile, inSubnet(e.id)]).sort(),
      [["b", "sbn-fakeb001"], ["default", "sbn-fake0001"], ["default", "sbn-fake0001"]],
    );
    // Two pods of b: the first takes b's free ENI, the second gets a new one in b's
    // subnet although two default ENIs are free.
    const b1 = await env.provider.allocateNextENI(owner(1), { ...ANY_ADDRESS, profile: "b" });
    const b2 = await env.provider.allocateNextENI(owner(2), { ...ANY_ADDRESS, profile: "b" });
    assertEquals([b1.profile, b2.profile], ["b", "b"]);
    assertEquals([inSubnet(b1.id), inSubnet(b2.id)], ["sbn-fakeb001", "sbn-fakeb001"]);
    assertEquals((await pools()).default, { free: 2, owned: 0 });
    // b refills to its minIdle; freeing both puts b above its maxIdle: it shrinks to 1.
    await eventually(async () => (await pools()).b?.free === 1, 5000, "b refilled");
    await env.provider.deallocateENI(owner(1));
    await env.provider.deallocateENI(owner(2));
    await eventually(
      async () => {
        const st = await env.provider.status();
        return st.profiles.b?.free === 1 && (st.details.releasing as number) === 0;
      },
      5000,
      "b shrunk to 1",
    );
    assertEquals((await pools()).default, { free: 2, owned: 0 });
    const inB = [...env.fake.enis.values()].filter((e) => e.subnetId === "sbn-fakeb001");
    assertEquals(inB.length, 1, "the surplus b ENIs were deleted in the cloud");
  } finally {
    await env.close();
  }
});

Deno.test("a fixed IP gets a new ENI with it in the profile's subnet; taken and outside IPs fail cleanly", async (t) => {
  const env = await withProfiles();
  try {
    await t.step("a chosen IPv4 and IPv6 in profile b's subnet", async () => {
      const e = await env.provider.allocateNextENI(owner(1), {
        ips: ["10.0.2.77", "fd00:2::77"],
        ranges: [],
        profile: "b",
      });
      assertEquals([e.ipv4?.address, e.ipv6?.address, e.profile], [
        "10.0.2.77",
        "fd00:2::77",
        "b",
      ]);
      const cloud = env.fake.enis.get(e.id)!;
      assertEquals(cloud.privateIpSet, [{
        privateIpAddress: "10.0.2.77",
        primary: true,
        publicIpAddress: "",
      }]);
      assertEquals(cloud.ipv6PrivateIpSet[0].privateIpAddress, "fd00:2::77");
      const create = env.fake.requests.findLast((r) => r.method === "POST")!;
      assertEquals(
        z.object({ privateIpSet: z.array(z.unknown()), ipv6PrivateIpSet: z.array(z.unknown()) })
          .parse(create.body),
        {
          privateIpSet: [{ publicIpAddress: "", primary: true, privateIpAddress: "10.0.2.77" }],
          ipv6PrivateIpSet: [{
            publicIpAddress: "",
            primary: false,
            privateIpAddress: "fd00:2::77",
          }],
        },
      );
    });
    await t.step("the same IP again: held by the first pod, refused without a call", async () => {
      const before = env.fake.requests.length;
      const err = await env.provider.allocateNextENI(owner(2), {
        ips: ["10.0.2.77"],
        ranges: [],
        profile: "b",
      }).then(() => null, (e) => e);
      assert(err instanceof ProviderError);
      assertEquals(err.reason, "requested_ip_unavailable");
      assertStringIncludes(err.message, 'held by pod "default/p-1"');
      assertEquals(env.fake.requests.slice(before).filter((r) => r.method !== "GET"), []);
    });
    await t.step(
      "an IP BCE says is taken: requested_ip_unavailable, nothing left behind",
      async () => {
        // Someone else's ENI in b's subnet has 10.0.2.88.
        const client = testClient(env.fake);
        const taken = await client.createEni({
          name: "other/y",
          subnetId: "sbn-fakeb001",
          securityGroupIds: ["g-b0001"],
          enterpriseSecurityGroupIds: [],
          privateIpAddress: "10.0.2.88",
        }, crypto.randomUUID());
        client.close();
        const enisBefore = env.fake.enis.size;
        const err = await env.provider.allocateNextENI(owner(3), {
          ips: ["10.0.2.88"],
          ranges: [],
          profile: "b",
        }).then(() => null, (e) => e);
        assert(err instanceof ProviderError);
        recordError(err);
        assertEquals(err.reason, "requested_ip_unavailable");
        assertStringIncludes(err.message, "10.0.2.88");
        assertStringIncludes(err.message, "PrivateIpInUseException");
        assertEquals(env.fake.enis.size, enisBefore, "no ENI was left behind");
        assert(env.fake.enis.has(taken));
        const st = await env.provider.status();
        assertEquals([st.details.creating, st.details.cleanup], [0, 0]);
        assertEquals(st.attachable, 7);
      },
    );
    await t.step("an IP outside the profile's subnet: refused before any create", async () => {
      const before = env.fake.requests.filter((r) => r.method === "POST").length;
      for (const ip of ["10.0.1.50", "fd00:1::50"]) {
        const err = await env.provider.allocateNextENI(owner(4), {
          ips: [ip],
          ranges: [],
          profile: "b",
        }).then(() => null, (e) => e);
        assert(err instanceof ProviderError);
        assertEquals(err.reason, "requested_ip_unavailable");
        assertStringIncludes(err.message, `${ip} is not in subnet "sbn-fakeb001"`);
      }
      assertEquals(env.fake.requests.filter((r) => r.method === "POST").length, before);
    });
  } finally {
    await env.close();
  }
});

Deno.test("the fake refuses a fixed IP outside the subnet or in use, with the reference's code", async () => {
  const env = await withProfiles();
  const client = testClient(env.fake, { maxAttempts: 1 });
  try {
    const mk = (ip: string) =>
      client.createEni({
        name: `enim/x/${crypto.randomUUID().slice(0, 6)}`,
        subnetId: "sbn-fakeb001",
        securityGroupIds: ["g-b0001"],
        enterpriseSecurityGroupIds: [],
        privateIpAddress: ip,
      }, crypto.randomUUID()).then(() => null, (e) => e);
    assertEquals(await mk("10.0.2.60"), null);
    const inUse = await mk("10.0.2.60");
    assertEquals([inUse?.code, inUse?.reason], [
      "PrivateIpInUseException",
      "requested_ip_unavailable",
    ]);
    const outside = await mk("10.0.9.9");
    assertEquals([outside?.status, outside?.code], [400, "BadRequest"]);
  } finally {
    client.close();
    await env.close();
  }
});

Deno.test("inline groups replace a pooled ENI's groups (bindSg/bindEsg) and the profile's are put back at release", async (t) => {
  const env = await withProfiles();
  const binds = () =>
    env.fake.requests.filter((r) =>
      r.method === "PUT" && ("bindSg" in r.query || "bindEsg" in r.query)
    );
  try {
    // A free ENI of b in the pool.
    const first = await env.provider.allocateNextENI(owner(1), { ...ANY_ADDRESS, profile: "b" });
    await env.provider.deallocateENI(owner(1));
    assertEquals(binds(), [], "no group change for a pod without inline groups");

    await t.step("regular inline groups: one bindSg with exactly securityGroupIds", async () => {
      const e = await env.provider.allocateNextENI(owner(2), {
        ...ANY_ADDRESS,
        profile: "b",
        securityGroupIds: ["g-inline01", "g-inline02"],
      });
      assertEquals(e.id, first.id, "the pooled ENI of b was used");
      const cloud = env.fake.enis.get(e.id)!;
      assertEquals([cloud.securityGroupIds, cloud.enterpriseSecurityGroupIds], [
        ["g-inline01", "g-inline02"],
        [],
      ]);
      assertEquals(e.securityGroupIds, ["g-inline01", "g-inline02"]);
      const [bind] = binds();
      assertEquals([bind.path, bind.status, "bindSg" in bind.query], [
        `/v1/eni/${e.id}`,
        200,
        true,
      ]);
      assertEquals(bind.body, { securityGroupIds: ["g-inline01", "g-inline02"] });
      assert(bind.query.clientToken, "the bind carries a clientToken");
      assertEquals(bind.rawQuery.split("&")[0], "bindSg", "the bare flag on the wire");
    });
    await t.step("release puts b's groups back before the ENI rejoins the pool", async () => {
      await env.provider.deallocateENI(owner(2));
      const cloud = env.fake.enis.get(first.id)!;
      assertEquals([cloud.securityGroupIds, cloud.enterpriseSecurityGroupIds], [["g-b0001"], []]);
      assertEquals(binds().length, 2);
      assertEquals(binds()[1].body, { securityGroupIds: ["g-b0001"] });
      const listed = (await env.provider.list()).find((e) => e.id === first.id)!;
      assertEquals([listed.state, listed.securityGroupIds], ["free", ["g-b0001"]]);
    });
    await t.step(
      "enterprise inline groups: one bindEsg, which replaces the regular ones",
      async () => {
        const e = await env.provider.allocateNextENI(owner(3), {
          ...ANY_ADDRESS,
          profile: "b",
          securityGroupIds: ["esg-inline01"],
        });
        assertEquals(e.id, first.id);
        const cloud = env.fake.enis.get(e.id)!;
        assertEquals([cloud.securityGroupIds, cloud.enterpriseSecurityGroupIds], [[], [
          "esg-inline01",
        ]]);
        const bind = binds()[2];
        assert("bindEsg" in bind.query);
        assertEquals(bind.body, { enterpriseSecurityGroupIds: ["esg-inline01"] });
        await env.provider.deallocateENI(owner(3));
        assertEquals(
          [
            env.fake.enis.get(e.id)!.securityGroupIds,
            env.fake.enis.get(e.id)!.enterpriseSecurityGroupIds,
          ],
          [["g-b0001"], []],
          "bindSg put the regular groups back (and removed the enterprise one)",
        );
      },
    );
    await t.step("a new ENI for inline groups is created with them (no bind)", async () => {
      const held = await env.provider.allocateNextENI(owner(4), { ...ANY_ADDRESS, profile: "b" });
      const n = binds().length;
      const e = await env.provider.allocateNextENI(owner(5), {
        ...ANY_ADDRESS,
        profile: "b",
        securityGroupIds: ["g-inline02"],
      });
      assert(e.id !== held.id);
      assertEquals(binds().length, n);
      assertEquals(env.fake.enis.get(e.id)!.securityGroupIds, ["g-inline02"]);
      await env.provider.deallocateENI(owner(5));
      assertEquals(env.fake.enis.get(e.id)!.securityGroupIds, ["g-b0001"]);
      await env.provider.deallocateENI(owner(4));
    });
  } finally {
    await env.close();
  }
});

Deno.test("a refused bind fails cleanly: ProviderError, the ENI back in the pool with its groups", async () => {
  const env = await withProfiles();
  try {
    const a = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    await env.provider.deallocateENI(owner(1));
    // g-inline01 exists for enim's config but the fake's VPC no longer has it.
    env.fake.opts.securityGroups = ["g-test0001", "g-b0001"];
    const err = await env.provider.allocateNextENI(owner(2), {
      ...ANY_ADDRESS,
      securityGroupIds: ["g-inline01"],
    }).then(() => null, (e) => e);
    assert(err instanceof ProviderError);
    recordError(err);
    assertStringIncludes(err.message, "went back to the pool");
    assertStringIncludes(err.message, "NoSuchObject");
    const listed = (await env.provider.list()).find((e) => e.id === a.id)!;
    assertEquals([listed.state, listed.owner], ["free", null]);
    assertEquals(env.fake.enis.get(a.id)!.securityGroupIds, ["g-test0001"]);
    // The ENI serves the next pod as usual.
    const next = await env.provider.allocateNextENI(owner(3), ANY_ADDRESS);
    assertEquals(next.id, a.id);
  } finally {
    await env.close();
  }
});

Deno.test("an ENI whose profile groups cannot be put back leaves the pool (detached and deleted)", async () => {
  const env = await withProfiles();
  try {
    const e = await env.provider.allocateNextENI(owner(1), {
      ...ANY_ADDRESS,
      securityGroupIds: ["g-inline01"],
    });
    env.fake.inject({
      kind: "status",
      status: 400,
      code: "BadRequest",
      match: { method: "PUT", action: "bindSg" },
    });
    await env.provider.deallocateENI(owner(1));
    assertEquals((await env.provider.list()).filter((x) => x.id === e.id), []);
    await eventually(() => !env.fake.enis.has(e.id), 5000, "the ENI to be deleted");
    await eventually(
      async () => (await env.provider.status()).attachable === 8,
      5000,
      "its slot to be free again",
    );
  } finally {
    await env.close();
  }
});

Deno.test("the node limit is shared: a pod of b at the limit releases an idle default ENI first", async (t) => {
  await t.step("an idle ENI of another profile makes room", async () => {
    const env = await withProfiles({ maxEnisPerNode: 2 });
    try {
      const d1 = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
      const d2 = await env.provider.allocateNextENI(owner(2), ANY_ADDRESS);
      await env.provider.deallocateENI(owner(1));
      await env.provider.deallocateENI(owner(2));
      const from = LOG_LINES.length;
      const b = await env.provider.allocateNextENI(owner(3), { ...ANY_ADDRESS, profile: "b" });
      assertEquals(env.fake.enis.get(b.id)?.subnetId, "sbn-fakeb001");
      // One of the two idle default ENIs was detached and deleted, before the attach.
      const gone = [d1.id, d2.id].filter((id) => !env.fake.enis.has(id));
      assertEquals(gone.length, 1);
      assert((env.fake.maxAttached.get(INSTANCE) ?? 0) <= 2, "never more than 2 attached");
      const line = LOG_LINES.slice(from).find((l) => l.includes("to make room for a pod"));
      assert(line, "a log line says an idle ENI was released to make room");
      assertStringIncludes(line, gone[0]);
      const st = await env.provider.status();
      assertEquals(st.profiles.default, { free: 1, owned: 0 });
      assertEquals(st.profiles.b, { free: 0, owned: 1 });
      assertEquals(st.attachable, 0);
    } finally {
      await env.close();
    }
  });
  await t.step("no idle ENI of another profile: no_eni_available, nothing evicted", async () => {
    const env = await withProfiles({ maxEnisPerNode: 2 });
    try {
      await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
      await env.provider.allocateNextENI(owner(2), { ...ANY_ADDRESS, profile: "b" });
      await env.provider.deallocateENI(owner(2));
      // A pod of c at the limit: b's idle ENI goes; then a pod of b finds nothing idle.
      const c = await env.provider.allocateNextENI(owner(3), { ...ANY_ADDRESS, profile: "c" });
      assertEquals(c.profile, "c");
      const err = await env.provider.allocateNextENI(owner(4), { ...ANY_ADDRESS, profile: "b" })
        .then(() => null, (e) => e);
      assert(err instanceof ProviderError);
      assertEquals(err.reason, "no_eni_available");
      assertStringIncludes(err.message, "no idle ENI of another profile");
      assertEquals(env.fake.attachedTo(INSTANCE).length, 2);
    } finally {
      await env.close();
    }
  });
  await t.step("a warm pool refill leaves the last slot to a pod waiting for it", async () => {
    // The first sync fails, so the pod's allocation waits on the next one; the pool
    // pass started that sync first and continues first, yet leaves the slot alone.
    const env = await withProfiles({
      maxEnisPerNode: 1,
      config: { warmPool: { minIdle: 1, maxIdle: 1 } },
      fake: { maxKeysCap: 1000 },
      timeouts: { maxAttempts: 1 },
    });
    try {
      await env.provider.close();
      env.fake.inject({ kind: "status", status: 500, match: { method: "GET", path: "/v1/eni" } });
      const p = await env.restart({ timeouts: { ...HARNESS_TIMEOUTS, maxAttempts: 1 } });
      env.fake.inject({ kind: "slow", delayMs: 100, match: { method: "GET", path: "/v1/eni" } });
      const pass = p.maintainPool();
      const pod = p.allocateNextENI(owner(1), { ...ANY_ADDRESS, profile: "b" }).then(
        (e) => e,
        (e: Error) => e,
      );
      await pass;
      const b = await pod;
      assert(!(b instanceof Error), `the pod got no ENI: ${b instanceof Error ? b.message : ""}`);
      assertEquals(b.profile, "b");
      assertEquals((await p.status()).profiles.default, { free: 0, owned: 0 });
      assertEquals(env.fake.enis.size, 1);
    } finally {
      await env.close();
    }
  });
});

Deno.test("takeOver: the sticky pod's comeback gets the ENI its previous container held", async (t) => {
  const env = await withProfiles();
  try {
    await t.step("the held ENI moves to the new owner (no cloud call)", async () => {
      const old = owner(1, "default/sticky-0");
      const a = await env.provider.allocateNextENI(old, { ...ANY_ADDRESS, profile: "b" });
      const before = env.fake.requests.filter((r) => r.method !== "GET").length;
      const now = { ...old, containerId: "c1-new" };
      const b = await env.provider.allocateNextENI(now, {
        ...ANY_ADDRESS,
        profile: "b",
        takeOver: old,
      });
      assertEquals(b.id, a.id);
      assertEquals(b.owner, now);
      assertEquals(env.fake.requests.filter((r) => r.method !== "GET").length, before);
      const owners = (await env.provider.list()).filter((e) => e.owner).map((e) => e.owner);
      assertEquals(owners, [now]);
      await env.provider.deallocateENI(old); // holds nothing any more
      assertEquals((await env.provider.list()).find((e) => e.id === a.id)?.owner, now);
    });
    await t.step("with inline groups: replaced on the taken-over ENI", async () => {
      const old = owner(2, "default/sticky-1");
      const a = await env.provider.allocateNextENI(old, { ...ANY_ADDRESS, profile: "b" });
      const now = { ...old, containerId: "c2-new" };
      const b = await env.provider.allocateNextENI(now, {
        ...ANY_ADDRESS,
        profile: "b",
        securityGroupIds: ["g-inline01"],
        takeOver: old,
      });
      assertEquals(b.id, a.id);
      assertEquals(env.fake.enis.get(a.id)!.securityGroupIds, ["g-inline01"]);
      await env.provider.deallocateENI(now);
      assertEquals(env.fake.enis.get(a.id)!.securityGroupIds, ["g-b0001"]);
    });
    await t.step("the previous container holds nothing: allocated as usual", async () => {
      const e = await env.provider.allocateNextENI(owner(3), {
        ...ANY_ADDRESS,
        takeOver: owner(99, "default/gone"),
      });
      assertEquals([e.state, e.profile], ["owned", "default"]);
    });
  } finally {
    await env.close();
  }
});

Deno.test("describeENI() names the owning pod in BCE and puts the configured description back", async () => {
  const env = await withProfiles({ config: { description: "enim pool ENI" } });
  const modifies = () => env.fake.requests.filter((r) => "modifyAttribute" in r.query);
  try {
    const e = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
    const cloud = () => env.fake.enis.get(e.id)!;
    assertEquals(cloud().description, "enim pool ENI");
    await env.provider.describeENI!(e.id, "default/p-1 on node-7");
    assertEquals(cloud().description, "default/p-1 on node-7");
    const [set] = modifies();
    assertEquals(set.body, { name: cloud().name, description: "default/p-1 on node-7" });
    assertEquals([set.method, set.path, set.status], ["PUT", `/v1/eni/${e.id}`, 200]);
    assertEquals(set.rawQuery.split("&")[0], "modifyAttribute");
    assertEquals((await env.provider.list())[0].description, "default/p-1 on node-7");
    // The same text again: no call.
    await env.provider.describeENI!(e.id, "default/p-1 on node-7");
    assertEquals(modifies().length, 1);
    await env.provider.deallocateENI(owner(1));
    await env.provider.describeENI!(e.id, null);
    assertEquals(cloud().description, "enim pool ENI");
    assertEquals(modifies().length, 2);
    assert(cloud().name.startsWith(`enim/${INSTANCE}/`), "the name (our marker) is unchanged");
    // An ENI the provider does not track (released): nothing to do.
    await env.provider.describeENI!("eni-notours0001", "x");
    assertEquals(modifies().length, 2);
  } finally {
    await env.close();
  }
});

Deno.test("a provider on a database from before profiles serves its ENIs as profile default", async () => {
  // The set-up attaches new ENIs at once with the raw client: no young-ENI refusal.
  const fake = startFake({
    subnets: SUBNETS,
    ...GROUPS,
    attachDelayMs: 1,
    youngEniRefusesAttachMs: 0,
  });
  const client = testClient(fake);
  const db = new DatabaseSync(":memory:");
  try {
    // An ENI the old agent created and pooled, and its row in the old schema.
    const id = await client.createEni({
      name: `enim/${INSTANCE}/old001`,
      subnetId: "sbn-fake0001",
      securityGroupIds: ["g-test0001"],
      enterpriseSecurityGroupIds: [],
      description: "created by enim, do not modify",
    }, crypto.randomUUID());
    await client.attachEni(id, INSTANCE, crypto.randomUUID());
    await eventually(() => fake.enis.get(id)?.status === "inuse", 2000, "attached");
    const cloud = fake.enis.get(id)!;
    db.exec(`CREATE TABLE bce_enis (eni_id TEXT PRIMARY KEY, mac TEXT NOT NULL, subnet_id TEXT,
      ipv4 TEXT, ipv6 TEXT, pod TEXT, container_id TEXT, if_name TEXT, updated_ms INTEGER NOT NULL,
      lost_reason TEXT, lost_ms INTEGER)`);
    db.prepare(
      "INSERT INTO bce_enis (eni_id, mac, subnet_id, ipv4, updated_ms) VALUES (?, ?, ?, ?, 1)",
    ).run(
      id,
      cloud.macAddress,
      "sbn-fake0001",
      JSON.stringify({
        address: cloud.privateIpSet[0].privateIpAddress,
        prefixLength: 24,
        gateway: "10.0.1.1",
      }),
    );
    const env = await withProfiles({ withFake: fake, db });
    try {
      const [listed] = await env.provider.list();
      assertEquals([listed.id, listed.profile, listed.state], [id, "default", "free"]);
      assertEquals(listed.securityGroupIds, ["g-test0001"]);
      const before = fake.requests.length;
      const e = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
      assertEquals(e.id, id);
      assertEquals(fake.requests.slice(before), [], "no call for a default pod on a pooled ENI");
      // The name was learnt from the first list: a description change keeps it.
      await env.provider.describeENI!(id, "default/p-1 on n1");
      const set = fake.requests.findLast((r) => "modifyAttribute" in r.query)!;
      assertEquals(set.body, { name: `enim/${INSTANCE}/old001`, description: "default/p-1 on n1" });
    } finally {
      await env.close();
    }
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("an untracked ENI of ours is adopted into the pool of the profile its subnet says, or released", async () => {
  // The set-up attaches new ENIs at once with the raw client: no young-ENI refusal.
  const fake = startFake({
    subnets: SUBNETS,
    ...GROUPS,
    attachDelayMs: 1,
    youngEniRefusesAttachMs: 0,
  });
  const client = testClient(fake);
  try {
    const attached = async (name: string, subnetId: string, groups: string[]) => {
      const id = await client.createEni({
        name,
        subnetId,
        securityGroupIds: groups,
        enterpriseSecurityGroupIds: [],
      }, crypto.randomUUID());
      await client.attachEni(id, INSTANCE, crypto.randomUUID());
      await eventually(() => fake.enis.get(id)?.status === "inuse", 2000, "attached");
      return id;
    };
    // An agent that lost its database: its ENIs are attached, with our marker.
    const inB = await attached(`enim/${INSTANCE}/aaa001`, "sbn-fakeb001", ["g-b0001"]);
    const inDefault = await attached(`enim/${INSTANCE}/aaa002`, "sbn-fake0001", ["g-inline01"]);
    const nowhere = await attached(`enim/${INSTANCE}/aaa003`, "sbn-fakec001", ["g-test0001"]);
    const env = await withProfiles({
      withFake: fake,
      config: { profiles: { b: PROFILES.b } },
    });
    try {
      const listed = await env.provider.list();
      assertEquals(
        listed.map((e) => [e.id, e.profile, e.state]).sort(),
        [[inB, "b", "free"], [inDefault, "default", "free"]].sort(),
      );
      // Its groups are recorded as BCE has them: the next default pod gets the profile's.
      const e = await env.provider.allocateNextENI(owner(1), ANY_ADDRESS);
      assertEquals(e.id, inDefault);
      assertEquals(fake.enis.get(inDefault)!.securityGroupIds, ["g-test0001"]);
      // No profile uses sbn-fakec001 now: that ENI is detached and deleted.
      await eventually(() => !fake.enis.has(nowhere), 5000, "the ENI of no profile to go");
    } finally {
      await env.close();
    }
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("free ENIs of a profile removed from the config are released; an owned one at its release", async () => {
  const env = await withProfiles();
  try {
    const c1 = await env.provider.allocateNextENI(owner(1), { ...ANY_ADDRESS, profile: "c" });
    const c2 = await env.provider.allocateNextENI(owner(2), { ...ANY_ADDRESS, profile: "c" });
    await env.provider.deallocateENI(owner(1));
    await env.provider.close();
    // The operator drops profile c.
    const p = await env.restart({ profiles: { b: PROFILES.b } });
    assertEquals(p.profiles().map((x) => x.name), ["default", "b"]);
    await p.maintainPool();
    await eventually(() => !env.fake.enis.has(c1.id), 5000, "the free ENI of c to go");
    assertEquals((await p.status()).profiles.c, { free: 0, owned: 1 });
    await p.deallocateENI(owner(2));
    await eventually(() => !env.fake.enis.has(c2.id), 5000, "the owned ENI of c to go");
    assertEquals((await p.list()).filter((e) => e.profile === "c"), []);
  } finally {
    await env.close();
  }
});
