import { assert, assertEquals, assertMatch, assertRejects } from "../lib/assert.ts";
import { withRunDir } from "../tests/support/run_dir.ts";
import { KubeAccessError } from "./access.ts";
import { kubeconfigAccess, parseKubeconfigText, readKubeconfig } from "./kubeconfig.ts";
import { resolveAccess } from "./resolve.ts";

const CA = "-----BEGIN CERTIFICATE-----\nMIIBCA==\n-----END CERTIFICATE-----\n";
const CERT = "-----BEGIN CERTIFICATE-----\nMIIBCB==\n-----END CERTIFICATE-----\n";
const KEY = "-----BEGIN PRIVATE KEY-----\nMIIBCC==\n-----END PRIVATE KEY-----\n";
const b64 = (s: string) => btoa(s);

/** A kubeconfig object with one cluster, one user and one context, changed by `edit`. */
function config(
  cluster: Record<string, unknown> = {},
  user: Record<string, unknown> | null = { token: "abc" },
  extra: Record<string, unknown> = {},
) {
  return {
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: "c1", cluster: { server: "https://10.0.0.1:6443", ...cluster } }],
    users: [{ name: "u1", user }],
    contexts: [{ name: "ctx", context: { cluster: "c1", user: "u1", namespace: "default" } }],
    "current-context": "ctx",
    preferences: {},
    ...extra,
  };
}

async function refused(doc: unknown, pattern: RegExp, path = "/k/config"): Promise<void> {
  const err = await assertRejects(() => kubeconfigAccess(doc, path), KubeAccessError);
  assertMatch(err.message, /^Cannot use the kubeconfig "\/k\/config": /);
  assertMatch(err.message, pattern);
}

Deno.test("a kubeconfig's current context gives the server, its CA data and the user's token", async () => {
  const a = await kubeconfigAccess(
    config({ "certificate-authority-data": b64(CA) }, { token: "abc" }),
    "/k/config",
  );
  assertEquals(a, {
    server: "https://10.0.0.1:6443",
    caCerts: [CA],
    token: { value: "abc" },
    source: 'kubeconfig "/k/config" context "ctx"',
  });
});

Deno.test("the files a kubeconfig names are read relative to its folder", async () => {
  await withRunDir(async (dir) => {
    await Deno.mkdir(`${dir}/pki`);
    await Deno.writeTextFile(`${dir}/pki/ca.crt`, CA);
    await Deno.writeTextFile(`${dir}/pki/client.crt`, CERT);
    await Deno.writeTextFile(`${dir}/client.key`, KEY);
    const a = await kubeconfigAccess(
      config({ "certificate-authority": "pki/ca.crt" }, {
        "client-certificate": "pki/client.crt",
        "client-key": `${dir}/client.key`,
        tokenFile: "token",
      }),
      `${dir}/config`,
    );
    assertEquals(a.caCerts, [CA]);
    assertEquals(a.clientCert, { cert: CERT, key: KEY });
    assertEquals(a.token, { file: `${dir}/token` }, "read later, as it rotates");
  });
});

Deno.test("each field of a kubeconfig is honoured or refused", async (t) => {
  await t.step("certificate-authority-data wins over certificate-authority", async () => {
    const a = await kubeconfigAccess(
      config({ "certificate-authority": "/nonexistent", "certificate-authority-data": b64(CA) }),
      "/k/config",
    );
    assertEquals(a.caCerts, [CA]);
  });
  await t.step("without a CA the default roots are used", async () => {
    const a = await kubeconfigAccess(config(), "/k/config");
    assertEquals(a.caCerts, undefined);
  });
  await t.step("client-certificate-data and client-key-data", async () => {
    const a = await kubeconfigAccess(
      config({}, { "client-certificate-data": b64(CERT), "client-key-data": b64(KEY) }),
      "/k/config",
    );
    assertEquals(a.clientCert, { cert: CERT, key: KEY });
    assertEquals(a.token, undefined);
  });
  await t.step("tokenFile wins over token", async () => {
    const a = await kubeconfigAccess(config({}, { token: "x", tokenFile: "/t" }), "/k/config");
    assertEquals(a.token, { file: "/t" });
  });
  await t.step("a context without a user has no credentials", async () => {
    const doc = config();
    doc.contexts[0].context = { cluster: "c1" } as never;
    const a = await kubeconfigAccess(doc, "/k/config");
    assertEquals([a.token, a.clientCert], [undefined, undefined]);
  });
  await t.step("a user with no fields (null) has no credentials", async () => {
    const a = await kubeconfigAccess(config({}, null), "/k/config");
    assertEquals(a.token, undefined);
  });
  await t.step("a server path prefix is kept, a trailing slash dropped", async () => {
    const a = await kubeconfigAccess(
      config({ server: "https://rancher.example.com/k8s/clusters/c-1/" }),
      "/k/config",
    );
    assertEquals(a.server, "https://rancher.example.com/k8s/clusters/c-1");
  });
  await t.step("the context option wins over current-context", async () => {
    const doc = config();
    doc.clusters.push({ name: "c2", cluster: { server: "https://10.9.9.9" } });
    doc.contexts.push({ name: "other", context: { cluster: "c2", user: "u1", namespace: "x" } });
    const a = await kubeconfigAccess(doc, "/k/config", { context: "other" });
    assertEquals([a.server, a.source], [
      "https://10.9.9.9",
      'kubeconfig "/k/config" context "other"',
    ]);
  });
});

Deno.test("each refused or broken kubeconfig says why", async (t) => {
  const cases: [string, unknown, RegExp][] = [
    ["no current-context", config({}, {}, { "current-context": undefined }), /no current-context/],
    ["an unknown context", config({}, {}, { "current-context": "nope" }), /no context "nope"/],
    [
      "an unknown cluster",
      { ...config(), clusters: [] },
      /context "ctx" names cluster "c1", which it does not define/,
    ],
    ["an unknown user", { ...config(), users: null }, /names user "u1", which it does not define/],
    ["a server that is not a URL", config({ server: "10.0.0.1:6443" }), /not a URL/],
    ["a plain-http server", config({ server: "http://10.0.0.1:8080" }), /over https only/],
    [
      "a server with a query",
      config({ server: "https://a/?x=1" }),
      /parts a server URL does not have/,
    ],
    [
      "insecure-skip-tls-verify",
      config({ "insecure-skip-tls-verify": true }),
      /insecure-skip-tls-verify, which enim refuses: Deno can skip certificate checks only for the whole process/,
    ],
    ["tls-server-name", config({ "tls-server-name": "api" }), /tls-server-name "api"/],
    ["proxy-url", config({ "proxy-url": "http://proxy:3128" }), /proxy-url/],
    [
      "an exec plugin",
      config({}, { exec: { command: "aws", args: ["eks", "get-token"], apiVersion: "x" } }),
      /user "u1" authenticates with an exec plugin \("aws"\), which enim does not run/,
    ],
    [
      "an auth-provider",
      config({}, { "auth-provider": { name: "gcp" } }),
      /auth-provider "gcp", which enim does not support/,
    ],
    ["basic auth", config({}, { username: "a", password: "b" }), /basic authentication/],
    ["impersonation", config({}, { token: "t", as: "admin" }), /impersonates "admin"/],
    [
      "a certificate without its key",
      config({}, { "client-certificate-data": b64(CERT) }),
      /client certificate without its key/,
    ],
    [
      "a key without its certificate",
      config({}, { "client-key-data": b64(KEY) }),
      /client key without its certificate/,
    ],
    [
      "CA data that is not base64",
      config({ "certificate-authority-data": "%%%" }),
      /certificate-authority-data is not base64/,
    ],
    [
      "CA data that is not PEM",
      config({ "certificate-authority-data": b64("hello") }),
      /certificate-authority-data is not a PEM certificate or key/,
    ],
    ["a field of the wrong type", config({ server: 6443 }), /clusters\.0\.cluster\.server: /],
    ["a top level that is a list", [1, 2], /\(top level\)/],
  ];
  for (const [name, doc, pattern] of cases) {
    await t.step(name, () => refused(doc, pattern));
  }
  await t.step("a CA file that does not exist", async () => {
    const err = await assertRejects(
      () => kubeconfigAccess(config({ "certificate-authority": "ca.crt" }), "/nowhere/config"),
      KubeAccessError,
    );
    assertEquals(
      err.message,
      'Cannot read cluster "c1"\'s certificate-authority "/nowhere/ca.crt": no such file',
    );
  });
});

Deno.test("a kubeconfig is read as JSON or as YAML", async () => {
  const json = JSON.stringify(config());
  assertEquals(await parseKubeconfigText(json, "/k"), config());
  const yaml = [
    "apiVersion: v1",
    "kind: Config",
    "clusters:",
    "- name: c1",
    "  cluster:",
    "    server: 'https://10.0.0.1:6443' # the API server",
    "users:",
    "- name: u1",
    "  user: {token: abc}",
    "contexts:",
    "- context:",
    "    cluster: c1",
    "    user: u1",
    "  name: ctx",
    "current-context: ctx",
    "preferences: {}",
  ].join("\n");
  const doc = await parseKubeconfigText(yaml, "/k");
  const a = await kubeconfigAccess(doc, "/k");
  assertEquals([a.server, a.token], ["https://10.0.0.1:6443", { value: "abc" }]);
});

Deno.test("a YAML syntax error is reported with its line", async () => {
  const err = await assertRejects(
    () => parseKubeconfigText("clusters:\n- name: a\n  cluster: [\n", "/k/config"),
    KubeAccessError,
  );
  assertMatch(
    err.message,
    /^The kubeconfig "\/k\/config" is not valid YAML \(line \d+, column \d+\)/,
  );
});

Deno.test("readKubeconfig() names a kubeconfig it cannot read", async () => {
  const err = await assertRejects(() => readKubeconfig("/nonexistent/kubeconfig"), KubeAccessError);
  assertEquals(err.message, 'Cannot read the kubeconfig "/nonexistent/kubeconfig": no such file');
});

Deno.test("the access is found in order: the option, then KUBECONFIG, then in-cluster", async () => {
  await withRunDir(async (dir) => {
    const write = (name: string, server: string) =>
      Deno.writeTextFile(`${dir}/${name}`, JSON.stringify(config({ server })));
    await write("option", "https://option.example");
    await write("env", "https://env.example");
    await Deno.writeTextFile(`${dir}/token`, "t");
    await Deno.writeTextFile(`${dir}/ca.crt`, CA);
    const env = {
      KUBECONFIG: `${dir}/env`,
      KUBERNETES_SERVICE_HOST: "10.96.0.1",
      KUBERNETES_SERVICE_PORT: "443",
    };
    const o = { env, serviceAccountDir: dir };
    assertEquals(
      (await resolveAccess({ ...o, kubeconfig: `${dir}/option` })).server,
      "https://option.example",
    );
    assertEquals((await resolveAccess(o)).server, "https://env.example");
    assertEquals(
      (await resolveAccess({ ...o, env: { ...env, KUBECONFIG: "" } })).server,
      "https://10.96.0.1:443",
    );
    const none = await assertRejects(() => resolveAccess({ env: {} }), KubeAccessError);
    assertMatch(none.message, /^No Kubernetes API server is configured/);
    const list = await assertRejects(
      () => resolveAccess({ env: { KUBECONFIG: "/a:/b" } }),
      KubeAccessError,
    );
    assertMatch(list.message, /KUBECONFIG "\/a:\/b" names several files/);
    assert(list.message.includes("kubectl config view --flatten"));
  });
});
