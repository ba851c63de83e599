import { assert, assertEquals, assertStringIncludes, assertThrows } from "../../lib/assert.ts";
import type { ProviderError } from "../contract.ts";
import { configSchema, endpointFor, loadCredentials } from "./config.ts";
import { bceModule, configSchema as modSchema, create } from "./mod.ts";
import { SECRET } from "./_harness.ts";

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
