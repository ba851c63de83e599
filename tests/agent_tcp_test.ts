/**
 * The agent's TCP listener as Prometheus and kubelet use it (issue 50): the built agent,
 * run with exactly the `enim` permission set, `metrics.enabled` on a loopback port; a
 * scrape of `/metrics` over TCP, `/healthz` live, the socket's API absent from the port;
 * then an agent whose manager is wedged (an ADD stuck in a provider call that does not
 * settle: the mock's attach latency far past a provider deadline raised out of its way)
 * answers `/healthz` 503, which is what makes kubelet restart it.
 *
 * @module
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { unixRequest } from "../api/client.ts";
import { fakeDevicesConfig, podAddRequest, startAgent } from "./support/agent_proc.ts";
import { withSandbox } from "./support/run_dir.ts";
import { poll } from "../lib/async.ts";

/** A free TCP port of 127.0.0.1 (bound and let go: the agent binds it next). */
function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  return port;
}

Deno.test("Prometheus scrapes the agent over TCP, and its health endpoint turns 503 when the manager is wedged", async () => {
  await withSandbox(async (dir, sb) => {
    const port = freePort();
    const agent = await startAgent(sb, {
      // One ENI, not attached: an ADD attaches it, and the mock's attach takes 10 minutes.
      ...fakeDevicesConfig(dir, { enis: 1, preattached: 0, attachLatencyMs: 600_000 }),
      metrics: { enabled: true, address: "127.0.0.1", port },
      health: { stallSeconds: 1 },
      timeouts: { providerSeconds: 3600, addSeconds: 3600 },
    });
    const url = (p: string) => `http://127.0.0.1:${port}${p}`;
    let add: Promise<unknown> | undefined;
    try {
      const scrape = await fetch(url("/metrics"));
      assertEquals(scrape.status, 200);
      const text = await scrape.text();
      assertStringIncludes(text, "enim_agent_up 1");
      assertMatch(text, /^enim_ready 1$/m);
      const live = await fetch(url("/healthz"));
      assertEquals([live.status, await live.json()], [200, { ok: true }]);
      for (const [method, path] of [["POST", "/v1/add"], ["GET", "/v1/status"]] as const) {
        const r = await fetch(url(path), { method, body: method === "POST" ? "{}" : undefined });
        await r.body?.cancel();
        assertEquals(r.status, 404, `${method} ${path} is not served over TCP`);
      }
      // An ADD that never settles: its lock is held and nothing else moves.
      add = unixRequest(agent.socket, "POST", "/v1/add", JSON.stringify(podAddRequest(1)))
        .catch(() => null);
      const wedged = await poll(async () => {
        const r = await fetch(url("/healthz"));
        const body = await r.json();
        return r.status === 503 ? body : null;
      }, { timeoutMs: 30_000, intervalMs: 100 });
      assert(wedged, "the health endpoint never said the agent was wedged");
      assertEquals(wedged.ok, false);
      assertMatch(wedged.reason, /^The ENI manager is wedged: 1 lock is held or waited for/);
      // The socket's own health check says the same.
      const sock = await unixRequest(agent.socket, "GET", "/v1/healthz");
      assertEquals(sock.status, 503);
    } finally {
      // Killed, as kubelet's restart would (a SIGTERM would wait for the stuck ADD).
      await agent.stop("SIGKILL");
      await add;
    }
  });
});
