/**
 * The agent reaches whatever API server and cloud endpoint its config names (issue 50):
 * the built bundle, run with exactly the `enim` permission set (the flags the compiled
 * binary bakes in), with a kubeconfig naming the test API server at 127.0.0.2 on an
 * ephemeral port (neither 443 nor 6443, not an RFC 1918 address) and the BCE provider's
 * endpoint and metadata service at the fake BCE on 127.0.0.3, another ephemeral port.
 * Before, the set allowed the API server only at private addresses on 443/6443 and the
 * cloud only at `*.baidubce.com`, 169.254.169.254 and 127.0.0.1: both failed NotCapable.
 *
 * Everything stays on loopback. The fake BCE is built from BCE's published API
 * (tests/support/bce_fake.ts), the API server from Kubernetes' (kube_apiserver.ts).
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { SocketAgentClient } from "../api/client.ts";
import { fakeDevicesConfig, startAgent } from "./support/agent_proc.ts";
import { withSandbox } from "./support/run_dir.ts";
import { makeTestPki } from "./support/kube_pki.ts";
import { KubeApiServer } from "./support/kube_apiserver.ts";
import { makePod } from "./support/kube_objects.ts";
import { AK, SECRET, SESSION_TOKEN, startFake } from "./support/bce_harness.ts";
import { FAKE_BCE_AGENT_TIMEOUTS } from "./support/bce_fake_main.ts";
import { poll } from "../lib/async.ts";

Deno.test("the agent reaches an API server and a cloud endpoint at other addresses and ports than before", async () => {
  const pki = await makeTestPki();
  const kube = KubeApiServer.start({ pki, hostname: "127.0.0.2" });
  const fake = startFake({ hostname: "127.0.0.3" });
  try {
    kube.put("pods", makePod({ namespace: "default", name: "a", ip: "10.1.0.1", nodeName: "n1" }));
    const apiPort = Number(new URL(kube.url).port);
    assert(
      ![443, 6443].includes(apiPort),
      `the API server's port ${apiPort} is neither 443 nor 6443`,
    );
    assertEquals(new URL(fake.url).hostname, "127.0.0.3");
    await withSandbox(async (dir, sb) => {
      await Deno.writeTextFile(
        sb.host("kubeconfig"),
        JSON.stringify({
          apiVersion: "v1",
          kind: "Config",
          clusters: [{
            name: "t",
            cluster: { server: kube.url, "certificate-authority-data": btoa(pki.caCert) },
          }],
          users: [{ name: "enim", user: { token: "test-token" } }],
          contexts: [{ name: "t", context: { cluster: "t", user: "enim" } }],
          "current-context": "t",
        }),
      );
      await Deno.writeTextFile(
        sb.host("bce-credentials.json"),
        JSON.stringify({ accessKeyId: AK, secretAccessKey: SECRET, sessionToken: SESSION_TOKEN }),
        { mode: 0o600 },
      );
      await Deno.chmod(sb.host("bce-credentials.json"), 0o600);
      const agent = await startAgent(sb, {
        ...fakeDevicesConfig(dir, {}),
        provider: {
          name: "bce",
          bce: {
            endpoint: fake.url,
            metadataUrl: fake.metadataUrl,
            credentialsFile: `${dir}/bce-credentials.json`,
            timeouts: FAKE_BCE_AGENT_TIMEOUTS,
          },
        },
        kubernetes: { kubeconfig: `${dir}/kubeconfig`, nodeName: "n1" },
        networkPolicy: { enabled: true },
      });
      try {
        const c = new SocketAgentClient(agent.socket);
        const synced = await poll(async () => (await c.status()).policy?.synced || null, {
          timeoutMs: 20_000,
          intervalMs: 50,
        });
        const st = await c.status();
        assert(synced, `the agent never synced with ${kube.url}: ${JSON.stringify(st.policy)}`);
        assertEquals([st.provider, st.ready], ["bce", true]);
        assert(
          kube.requests.some((r) => r.path.endsWith("/pods")),
          "the API server at 127.0.0.2 was listed",
        );
        assert(
          fake.requests.some((r) => r.path.startsWith("/v1/eni")),
          "the cloud endpoint at 127.0.0.3 was asked for the ENIs",
        );
        assert(!/NotCapable|Requires net access/.test(agent.stderr()), agent.stderr());
      } finally {
        const s = await agent.stop("SIGTERM");
        assertEquals(s.code, 0, agent.stderr());
      }
    });
  } finally {
    await fake.close();
    await kube.close();
    await Deno.remove(pki.dir, { recursive: true });
  }
});
