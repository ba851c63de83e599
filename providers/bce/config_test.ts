import { assert, assertEquals, assertStringIncludes, assertThrows } from "../../lib/assert.ts";
import type { ProviderError } from "../contract.ts";
import { configSchema, endpointFor, loadCredentials } from "./config.ts";
import { bceModule, configSchema as modSchema, create } from "./mod.ts";
import { SECRET } from "../../tests/support/bce_harness.ts";

Deno.test("mod.ts exports configSchema, create and bceModule", () => {
  assertEquals(modSchema, configSchema);
  assertEquals(bceModule.create, create);
  assertEquals(bceModule.configSchema, configSchema);
});

Deno.test("configSchema fills defaults and rejects contradictions", () => {
  const c = configSchema.parse({ region: "bj" });
  assertEquals(c.namePrefix, "enim");
  assertEquals(c.warmPool, { minIdle: 0, maxIdle: 2 });
  assertEquals(c.securityGroupIds, []);
  assert(!configSchema.safeParse({ warmPool: { minIdle: 3, maxIdle: 1 } }).success);
  assert(
    !configSchema.safeParse({ securityGroupIds: ["g"], enterpriseSecurityGroupIds: ["e"] }).success,
  );
  assert(!configSchema.safeParse({ namePrefix: "1bad" }).success);
  // IPv6 follows the subnet by default; the budget periods default to 30 s → 5 min, scans hourly.
  assertEquals(c.ipv6, "auto");
  assert(!configSchema.safeParse({ ipv6: "sometimes" }).success);
  assertEquals(
    [c.timeouts.poolIntervalMs, c.timeouts.idleIntervalMs, c.timeouts.orphanScanIntervalMs],
    [30_000, 300_000, 3_600_000],
  );
  // A partial timeouts object keeps the other defaults.
  const t = configSchema.parse({ timeouts: { attachMs: 5 } }).timeouts;
  assertEquals([t.attachMs, t.detachMs, t.jitter], [5, 60_000, 0.2]);
});

Deno.test("sticky scope is node by default; zone needs a cluster id, per profile too", () => {
  const c = configSchema.parse({});
  assertEquals(c.sticky, { scope: "node", nodeHoldSeconds: 30 });
  assertEquals(c.clusterId, undefined);
  const zone = configSchema.safeParse({ sticky: { scope: "zone" } });
  assert(!zone.success);
  assertStringIncludes(JSON.stringify(zone.error.issues), "clusterId");
  const profile = { subnetId: "sbn-b", securityGroupIds: ["g-b"], sticky: { scope: "zone" } };
  assert(!configSchema.safeParse({ profiles: { db: profile } }).success);
  const ok = configSchema.parse({ clusterId: "prod-1", profiles: { db: profile } });
  assertEquals(ok.profiles.db.sticky, { scope: "zone", nodeHoldSeconds: 30 });
  assert(
    !configSchema.safeParse({ clusterId: "a/b" }).success,
    "a cluster id in BCE's name alphabet",
  );
  assert(!configSchema.safeParse({ clusterId: "x".repeat(21) }).success, "at most 20 characters");
});

Deno.test("endpointFor() refuses a region BCE's endpoint tables do not name, saying what to set", () => {
  for (const region of ["cn-bj", "beijing", "xx"]) {
    const e = assertThrows(() => endpointFor(undefined, region, "the metadata service's region"));
    assertStringIncludes((e as Error).message, `Region "${region}"`);
    assertStringIncludes((e as Error).message, "provider.bce.endpoint");
  }
  assertEquals(endpointFor(undefined, "sin"), "https://bcc.sin.baidubce.com");
  assertEquals(endpointFor("bcc.cn-bj.example", "cn-bj"), "https://bcc.cn-bj.example");
});

Deno.test("endpointFor() defaults to https", () => {
  assertEquals(endpointFor(undefined, "gz"), "https://bcc.gz.baidubce.com");
  assertEquals(endpointFor("bcc.example:8443", "gz"), "https://bcc.example:8443");
  assertEquals(endpointFor("http://127.0.0.1:9", undefined), "http://127.0.0.1:9");
  assertThrows(() => endpointFor(undefined, undefined));
});

Deno.test("loadCredentials() refuses a group- or world-readable file and accepts mode 0600", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const file = `${dir}/creds.json`;
    Deno.writeTextFileSync(file, JSON.stringify({ accessKeyId: "AKID1", secretAccessKey: SECRET }));
    Deno.chmodSync(file, 0o644);
    const e = assertThrows(() => loadCredentials(file)) as ProviderError;
    assertEquals(e.reason, "auth_failed");
    assertStringIncludes(e.message, "group or others");
    assertStringIncludes(e.message, "0644");
    assert(!e.message.includes(SECRET));
    Deno.chmodSync(file, 0o640);
    assertThrows(() => loadCredentials(file));
    Deno.chmodSync(file, 0o600);
    assertEquals(loadCredentials(file), { accessKeyId: "AKID1", secretAccessKey: SECRET });
    Deno.writeTextFileSync(file, `{"accessKeyId": "AKID1", "secretAccessKey": "${SECRET}"`);
    const bad = assertThrows(() => loadCredentials(file));
    assert(!bad.message.includes(SECRET));
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("loadCredentials() reads the ENIM_BCE_* environment and says what is missing", () => {
  const env = (m: Record<string, string>) => (n: string) => m[n];
  assertEquals(
    loadCredentials(
      undefined,
      env({
        ENIM_BCE_ACCESS_KEY_ID: "A",
        ENIM_BCE_SECRET_ACCESS_KEY: "S",
        ENIM_BCE_SESSION_TOKEN: "T",
      }),
    ),
    { accessKeyId: "A", secretAccessKey: "S", sessionToken: "T" },
  );
  const e = assertThrows(() => loadCredentials(undefined, env({ ENIM_BCE_ACCESS_KEY_ID: "A" })));
  assertStringIncludes(e.message, "ENIM_BCE_SECRET_ACCESS_KEY");
});

Deno.test("configSchema reads profiles; the top-level settings stay the default profile", async (t) => {
  await t.step("a config from before profiles parses as before", () => {
    const c = configSchema.parse({ region: "bj", subnetId: "sbn-a", securityGroupIds: ["g-1"] });
    assertEquals([c.profiles, c.allowedSecurityGroupIds, c.namespaces], [{}, [], undefined]);
    assertEquals(c.securityGroupIds, ["g-1"]);
  });
  await t.step("named profiles with their subnet, groups, warm pool and rules", () => {
    const c = configSchema.parse({
      securityGroupIds: ["g-def"],
      allowedSecurityGroupIds: ["g-extra"],
      namespaces: ["default"],
      profiles: {
        db: {
          subnetId: "sbn-db",
          subnetCidr: "10.1.0.0/24",
          subnetIpv6Cidr: "fd00:1::/64",
          securityGroupIds: ["g-db"],
          warmPool: { minIdle: 1, maxIdle: 3 },
          namespaces: ["data"],
        },
        edge: { subnetId: "sbn-edge", enterpriseSecurityGroupIds: ["esg-edge"] },
      },
    });
    assertEquals(c.profiles.db.warmPool, { minIdle: 1, maxIdle: 3 });
    assertEquals(c.profiles.edge.warmPool, { minIdle: 0, maxIdle: 2 });
    assertEquals(c.profiles.edge.allowedSecurityGroupIds, []);
    assertEquals(c.profiles.edge.namespaces, undefined);
    assertEquals([c.allowedSecurityGroupIds, c.namespaces], [["g-extra"], ["default"]]);
  });
  const refused: [string, unknown][] = [
    ['"default" as a profile name', {
      profiles: { default: { subnetId: "s", securityGroupIds: ["g-a"] } },
    }],
    ["a name that is no DNS label", {
      profiles: { Bad_Name: { subnetId: "s", securityGroupIds: ["g-a"] } },
    }],
    ["a profile without groups", { profiles: { b: { subnetId: "s" } } }],
    [
      "both kinds of groups",
      {
        profiles: {
          b: { subnetId: "s", securityGroupIds: ["g-a"], enterpriseSecurityGroupIds: ["esg-a"] },
        },
      },
    ],
    ["an enterprise group among the regular ones", {
      profiles: { b: { subnetId: "s", securityGroupIds: ["esg-a"] } },
    }],
    ["an unknown field (a typo)", {
      profiles: { b: { subnetId: "s", securityGroupIds: ["g-a"], securityGroupId: "g-b" } },
    }],
    ["a subnetCidr of the wrong family", {
      profiles: { b: { subnetId: "s", securityGroupIds: ["g-a"], subnetCidr: "fd00::/64" } },
    }],
    ["minIdle above maxIdle", {
      profiles: {
        b: { subnetId: "s", securityGroupIds: ["g-a"], warmPool: { minIdle: 3, maxIdle: 1 } },
      },
    }],
    ["inline groups allowed without the default profile's own groups", {
      allowedSecurityGroupIds: ["g-x"],
    }],
    ["a malformed allowed group", { securityGroupIds: ["g-a"], allowedSecurityGroupIds: ["sg x"] }],
  ];
  for (const [what, config] of refused) {
    await t.step(`refused: ${what}`, () => {
      assert(!configSchema.safeParse(config).success, JSON.stringify(config));
    });
  }
});
