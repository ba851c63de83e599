/**
 * The `enim` permission set (deno.json) gives the Kubernetes client what it needs and
 * no more: the four variables, the service account's folder, private IPv4 addresses on
 * the API server's ports 443 and 6443. A process started with exactly that set (the
 * flags the compiled binary bakes in) syncs a cache from the test API server.
 */
import { assertEquals } from "../lib/assert.ts";
import { permissionFlags } from "../scripts/_permissions.ts";
import { makeTestPki } from "./support/kube_pki.ts";
import { KubeApiServer } from "./support/kube_apiserver.ts";
import { makePod } from "./support/kube_objects.ts";

const PROBE = `
import { Kube } from ${JSON.stringify(new URL("../kube/mod.ts", import.meta.url).href)};
const q = async (d) => (await Deno.permissions.query(d)).state;
const out = {};
for (const h of ["10.96.0.1:443", "172.20.0.1:443", "192.168.1.10:6443", "10.0.0.1:80", "8.8.8.8:443", "100.64.0.1:443"]) {
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

Deno.test("the enim permission set lets the Kubernetes client do its work, and no more", async () => {
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
      "10.0.0.1:80": "prompt",
      "8.8.8.8:443": "prompt",
      "100.64.0.1:443": "prompt",
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
