/**
 * The `enim` permission set (deno.json) gives the Kubernetes client what it needs: the
 * four variables, the service account's folder, and whatever API server a kubeconfig
 * names (any address, port or host name: issue 50); the plugin's own set reaches its
 * agent's socket and nothing else. A process started with exactly the `enim` set (the
 * flags the compiled binary bakes in) syncs a cache from the test API server.
 */
import { assertEquals } from "../lib/assert.ts";
import { permissionFlags, readPermissionSet } from "../scripts/_permissions.ts";
import { ROOT } from "../scripts/_paths.ts";
import { makeTestPki } from "./support/kube_pki.ts";
import { KubeApiServer } from "./support/kube_apiserver.ts";
import { makePod } from "./support/kube_objects.ts";

const PROBE = `
import { Kube } from ${JSON.stringify(new URL("../kube/mod.ts", import.meta.url).href)};
const q = async (d) => (await Deno.permissions.query(d)).state;
const out = {};
for (const h of ["10.96.0.1:443", "172.20.0.1:443", "192.168.1.10:6443", "10.0.0.1:80", "8.8.8.8:443", "100.64.0.1:443", "10.0.0.1:8443", "api.example.com:6443", "bcc.bj.baidubce.com:443"]) {
  out[h] = await q({ name: "net", host: h });
}
for (const v of ["KUBECONFIG", "NODE_NAME", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "HOME"]) {
  out[v] = await q({ name: "env", variable: v });
}
for (const p of ["/var/run/secrets/kubernetes.io/serviceaccount/token", "/etc/enim/kubeconfig", "/root/.kube/config"]) {
  out[p] = await q({ name: "read", path: p });
}
const [url, ca] = Deno.args;
const kube = new Kube({ server: url, caCerts: [ca], token: { value: "test-token" }, source: "t" }, "n1");
out.synced = await kube.pods.waitSynced(10000);
out.pods = kube.pods.size;
await kube.close();
console.log(JSON.stringify(out));
`;

Deno.test("the enim permission set lets the Kubernetes client reach any API server, and reads no more than it needs", async () => {
  const pki = await makeTestPki();
  const server = KubeApiServer.start({ pki });
  try {
    server.put("pods", makePod({ namespace: "default", name: "a", ip: "10.1.0.1" }));
    await Deno.writeTextFile(`${pki.dir}/probe.js`, PROBE);
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--quiet",
        "--no-prompt",
        "--config",
        new URL("./deno.json", import.meta.url).pathname,
        ...permissionFlags(),
        `${pki.dir}/probe.js`,
        server.url,
        pki.caCert,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const err = new TextDecoder().decode(out.stderr);
    assertEquals(out.success, true, err);
    assertEquals(JSON.parse(new TextDecoder().decode(out.stdout)), {
      "10.96.0.1:443": "granted",
      "172.20.0.1:443": "granted",
      "192.168.1.10:6443": "granted",
      "10.0.0.1:80": "granted",
      "8.8.8.8:443": "granted",
      "100.64.0.1:443": "granted",
      "10.0.0.1:8443": "granted",
      "api.example.com:6443": "granted",
      "bcc.bj.baidubce.com:443": "granted",
      KUBECONFIG: "granted",
      NODE_NAME: "granted",
      KUBERNETES_SERVICE_HOST: "granted",
      KUBERNETES_SERVICE_PORT: "granted",
      HOME: "prompt",
      "/var/run/secrets/kubernetes.io/serviceaccount/token": "granted",
      "/etc/enim/kubeconfig": "granted",
      "/root/.kube/config": "prompt",
      synced: true,
      pods: 1,
    });
  } finally {
    await server.close();
    await Deno.remove(pki.dir, { recursive: true });
  }
});

const PLUGIN_PROBE = `
const q = async (d) => (await Deno.permissions.query(d)).state;
const out = {};
for (const h of ["unix:/run/enim/enim.sock", "unix:/run/enim/other.sock", "127.0.0.1:80", "10.96.0.1:443", "bcc.bj.baidubce.com:443", "169.254.169.254:80"]) {
  out[h] = await q({ name: "net", host: h });
}
for (const v of ["CNI_COMMAND", "ENIM_LOG_FILE", "KUBECONFIG"]) out[v] = await q({ name: "env", variable: v });
for (const p of ["/var/log/enim/cni.log", "/etc/enim/agent.jsonc", "/var/lib/enim/enim.db"]) {
  out["write " + p] = await q({ name: "write", path: p });
}
out.run = await q({ name: "run" });
console.log(JSON.stringify(out));
`;

Deno.test("the plugin's own permission set reaches its agent's socket and nothing else", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-plugin-perms-" });
  try {
    await Deno.writeTextFile(`${dir}/probe.js`, PLUGIN_PROBE);
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--quiet",
        "--no-prompt",
        "--no-config",
        ...permissionFlags(readPermissionSet(ROOT, "enim-plugin")),
        `${dir}/probe.js`,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assertEquals(out.success, true, new TextDecoder().decode(out.stderr));
    assertEquals(JSON.parse(new TextDecoder().decode(out.stdout)), {
      "unix:/run/enim/enim.sock": "granted",
      "unix:/run/enim/other.sock": "prompt",
      "127.0.0.1:80": "prompt",
      "10.96.0.1:443": "prompt",
      "bcc.bj.baidubce.com:443": "prompt",
      "169.254.169.254:80": "prompt",
      CNI_COMMAND: "granted",
      ENIM_LOG_FILE: "granted",
      KUBECONFIG: "prompt",
      "write /var/log/enim/cni.log": "granted",
      "write /etc/enim/agent.jsonc": "prompt",
      "write /var/lib/enim/enim.db": "prompt",
      run: "prompt",
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
