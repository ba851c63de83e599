/**
 * Credentials from files (issue 50, "No way to run it on BCE from the repo"): a
 * rotated file is picked up without a restart (the next signed request carries the
 * new key, as the fake cloud sees it), and `enim agent --check-config` refuses
 * missing or world-readable credentials.
 */
import { assert, assertEquals, assertRejects, assertStringIncludes } from "../../lib/assert.ts";
import { DatabaseSync } from "node:sqlite";
import { configSchema } from "./config.ts";
import { createBce } from "./mod.ts";
import { FakeBce } from "../../tests/support/bce_fake.ts";
import { CLOUD_LIKE, HARNESS_TIMEOUTS, testLogger } from "../../tests/support/bce_harness.ts";
import { checkConfig } from "../../agent/agent.ts";
import { ConfigError, resolveConfig } from "../../agent/config.ts";
import { loadProvider } from "../registry.ts";

const OLD = { accessKeyId: "AKIDrotateOld0001", secretAccessKey: "SK-old-secret-0001" };
const NEW = { accessKeyId: "AKIDrotateNew0002", secretAccessKey: "SK-new-secret-0002" };

/** Writes the credentials as the kubelet swaps a Secret: a new file renamed over the old. */
async function writeCreds(path: string, creds: object, mode = 0o600): Promise<void> {
  const tmp = `${path}.new`;
  await Deno.writeTextFile(tmp, JSON.stringify(creds), { mode });
  await Deno.chmod(tmp, mode);
  await Deno.rename(tmp, path);
}

/** The access key id of the fake's last request. */
function lastKey(fake: FakeBce): string {
  const auth = fake.requests.at(-1)?.headers.authorization ?? "";
  return auth.split("/")[1] ?? "";
}

Deno.test("a rotated credentials file is picked up without a restart: the next signed request carries the new key", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-bce-creds-" });
  const file = `${dir}/credentials.json`;
  const fake = FakeBce.start({ credentials: [OLD, NEW], ...CLOUD_LIKE });
  const db = new DatabaseSync(":memory:");
  try {
    await writeCreds(file, OLD);
    const provider = await createBce(
      configSchema.parse({
        endpoint: fake.url,
        metadataUrl: fake.metadataUrl,
        credentialsFile: file,
        securityGroupIds: ["g-test0001"],
        warmPool: { minIdle: 0, maxIdle: 2 },
        timeouts: HARNESS_TIMEOUTS,
      }),
      { db, log: testLogger() },
    );
    try {
      await provider.reconcile();
      assertEquals(lastKey(fake), OLD.accessKeyId);
      await writeCreds(file, NEW);
      await provider.reconcile();
      assertEquals(lastKey(fake), NEW.accessKeyId, "the new key, no restart");
      // A version that cannot be used (world-readable) is refused; the last good key stays.
      await writeCreds(file, OLD, 0o644);
      await provider.reconcile();
      assertEquals(lastKey(fake), NEW.accessKeyId);
      assert(fake.requests.every((r) => r.status !== 403), "never signed with a bad key");
    } finally {
      await provider.close();
    }
  } finally {
    db.close();
    await fake.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("enim agent --check-config refuses BCE credentials that are missing or world-readable, and accepts a 0600 file", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-bce-check-" });
  const file = `${dir}/credentials.json`;
  const cfgWith = (bce: Record<string, unknown>) =>
    resolveConfig({
      file: {
        path: "test.jsonc",
        text: JSON.stringify({ provider: { name: "bce", bce: { region: "bj", ...bce } } }),
      },
      env: {},
    });
  try {
    // None at all (no file, no ENIM_BCE_* variables).
    if (Deno.env.get("ENIM_BCE_ACCESS_KEY_ID") === undefined) {
      const none = await assertRejects(
        () => checkConfig(cfgWith({}), { loadProvider }),
        ConfigError,
      );
      assertStringIncludes(none.message, "No BCE credentials");
    }
    // A file that is not there.
    let e = await assertRejects(
      () => checkConfig(cfgWith({ credentialsFile: file }), { loadProvider }),
      ConfigError,
    );
    assertStringIncludes(e.message, `Cannot read the BCE credentials file "${file}"`);
    // World-readable.
    await writeCreds(file, OLD, 0o644);
    e = await assertRejects(
      () => checkConfig(cfgWith({ credentialsFile: file }), { loadProvider }),
      ConfigError,
    );
    assertStringIncludes(e.message, "accessible by group or others");
    assert(!e.message.includes(OLD.secretAccessKey), "no secret in the message");
    // 0600: accepted.
    await Deno.chmod(file, 0o600);
    await checkConfig(cfgWith({ credentialsFile: file }), { loadProvider });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
