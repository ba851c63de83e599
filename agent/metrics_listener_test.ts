import { assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { serveMetricsTcp } from "./metrics_listener.ts";
import type { Health } from "./health.ts";

Deno.test("the TCP listener serves /metrics and /healthz, and nothing of the API", async (t) => {
  let health: Health = { ok: true };
  const tcp = serveMetricsTcp(
    { metrics: () => "# TYPE enim_agent_up gauge\nenim_agent_up 1\n", health: () => health },
    { address: "127.0.0.1", port: 0 },
  );
  const url = (p: string) => `http://127.0.0.1:${tcp.port}${p}`;
  try {
    await t.step("GET /metrics: the Prometheus text", async () => {
      const r = await fetch(url("/metrics"));
      assertEquals(r.status, 200);
      assertMatch(r.headers.get("content-type")!, /^text\/plain; version=0\.0\.4/);
      assertStringIncludes(await r.text(), "enim_agent_up 1");
    });
    await t.step("GET /healthz: 200 live, 503 wedged", async () => {
      const live = await fetch(url("/healthz"));
      assertEquals([live.status, await live.json()], [200, { ok: true }]);
      health = { ok: false, reason: "wedged" };
      const wedged = await fetch(url("/healthz"));
      assertEquals([wedged.status, await wedged.json()], [503, health]);
    });
    await t.step("the socket's API is not here: 404, and 405 for another method", async () => {
      for (
        const [method, path, status] of [
          ["POST", "/v1/add", 404],
          ["GET", "/v1/status", 404],
          ["GET", "/v1/attachments", 404],
          ["POST", "/v1/gc", 404],
          ["POST", "/metrics", 405],
          ["DELETE", "/healthz", 405],
        ] as const
      ) {
        const r = await fetch(url(path), { method, body: method === "POST" ? "{}" : undefined });
        await r.body?.cancel();
        assertEquals(r.status, status, `${method} ${path}`);
      }
    });
  } finally {
    await tcp.shutdown();
  }
});

Deno.test("a TCP address that cannot be bound fails naming it", () => {
  const busy = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  try {
    let err: unknown;
    try {
      serveMetricsTcp({ metrics: () => "", health: () => ({ ok: true }) }, {
        address: "127.0.0.1",
        port: busy.addr.port,
      });
    } catch (e) {
      err = e;
    }
    assertMatch(
      String(err),
      new RegExp(`Cannot listen on 127\\.0\\.0\\.1:${busy.addr.port} for metrics and health`),
    );
  } finally {
    busy.close();
  }
});
