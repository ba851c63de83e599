import { assertEquals, assertMatch, assertRejects, assertThrows } from "../lib/assert.ts";
import { withRunDir } from "../tests/support/run_dir.ts";
import { inClusterAccess, KubeAccessError, resolveNodeName } from "./access.ts";

const CA = "-----BEGIN CERTIFICATE-----\nMIIBCA==\n-----END CERTIFICATE-----\n";

async function serviceAccount(dir: string, token = "tok\n", ca: string | null = CA) {
  await Deno.writeTextFile(`${dir}/token`, token);
  if (ca !== null) await Deno.writeTextFile(`${dir}/ca.crt`, ca);
}

Deno.test("in-cluster access uses the service host and port, the CA and the token file", async () => {
  await withRunDir(async (dir) => {
    await serviceAccount(dir);
    const a = await inClusterAccess(
      { KUBERNETES_SERVICE_HOST: "10.96.0.1", KUBERNETES_SERVICE_PORT: "443" },
      dir,
    );
    assertEquals(a, {
      server: "https://10.96.0.1:443",
      caCerts: [CA],
      token: { file: `${dir}/token` },
      source: `in-cluster (KUBERNETES_SERVICE_HOST "10.96.0.1", ${dir})`,
    });
  });
});

Deno.test("an IPv6 service host is bracketed", async () => {
  await withRunDir(async (dir) => {
    await serviceAccount(dir);
    const a = await inClusterAccess(
      { KUBERNETES_SERVICE_HOST: "fd00:10:96::1", KUBERNETES_SERVICE_PORT: "6443" },
      dir,
    );
    assertEquals(a.server, "https://[fd00:10:96::1]:6443");
  });
});

Deno.test("each in-cluster problem says what is wrong", async (t) => {
  await withRunDir(async (dir) => {
    const env = { KUBERNETES_SERVICE_HOST: "10.96.0.1", KUBERNETES_SERVICE_PORT: "443" };
    const cases: [string, () => Promise<unknown>, RegExp][] = [
      [
        "no port",
        () => inClusterAccess({ KUBERNETES_SERVICE_HOST: "10.96.0.1" }, dir),
        /^KUBERNETES_SERVICE_PORT "" is not a port/,
      ],
      [
        "a port out of range",
        () => inClusterAccess({ ...env, KUBERNETES_SERVICE_PORT: "70000" }, dir),
        /"70000" is not a port/,
      ],
      [
        "a host with a slash",
        () => inClusterAccess({ ...env, KUBERNETES_SERVICE_HOST: "a/b" }, dir),
        /^KUBERNETES_SERVICE_HOST "a\/b" is not a host name or address$/,
      ],
      [
        "no token file",
        () => inClusterAccess(env, `${dir}/none`),
        /^Cannot read the service account's token ".*\/none\/token": no such file$/,
      ],
      [
        "an empty token",
        async () => {
          await serviceAccount(dir, "\n");
          return inClusterAccess(env, dir);
        },
        /^The token file ".*\/token" is empty$/,
      ],
      [
        "no CA",
        async () => {
          await serviceAccount(dir, "tok", null);
          await Deno.remove(`${dir}/ca.crt`).catch(() => {});
          return inClusterAccess(env, dir);
        },
        /^Cannot read the service account's CA ".*\/ca\.crt": no such file$/,
      ],
    ];
    for (const [name, fn, pattern] of cases) {
      await t.step(name, async () => {
        const err = await assertRejects(fn, KubeAccessError);
        assertMatch(err.message, pattern);
      });
    }
  });
});

Deno.test("the node name is the option, else NODE_NAME, else the host name lowercased", () => {
  const host = () => "Worker-1.Example";
  assertEquals(resolveNodeName("n-opt", { NODE_NAME: "n-env" }, host), "n-opt");
  assertEquals(resolveNodeName(undefined, { NODE_NAME: "n-env" }, host), "n-env");
  assertEquals(resolveNodeName(undefined, {}, host), "worker-1.example");
  const err = assertThrows(() => resolveNodeName("Bad_Name", {}, host));
  assertMatch(err.message, /^The node name "Bad_Name" is not a Kubernetes node name/);
});
