import { assertEquals } from "../lib/assert.ts";
import { probeAnswer, type ProbePhase, probeResponse, serveProbe } from "./probe.ts";
import { unixRequest } from "../api/client.ts";
import { withRunDir } from "../tests/support/run_dir.ts";

const wedged = { ok: false, reason: "The ENI manager is wedged" };

Deno.test("the probe socket's answers, phase by phase (the table of agent/probe.ts)", () => {
  const rows: [ProbePhase, boolean, boolean, [boolean, boolean]][] = [
    // phase, wedged, ready → [live, ready]
    ["standby", false, false, [true, true]],
    ["starting", false, false, [true, false]],
    ["serving", false, true, [true, true]],
    ["serving", false, false, [true, false]],
    ["serving", true, true, [false, true]],
    ["stopping", false, true, [true, false]],
  ];
  for (const [phase, isWedged, ready, want] of rows) {
    const s = {
      phase: () => phase,
      health: () => isWedged ? wedged : { ok: true },
      ready: () => ready,
    };
    const got = [probeAnswer("/healthz", s).ok, probeAnswer("/readyz", s).ok];
    assertEquals(got, want, `${phase} wedged=${isWedged} ready=${ready}`);
    assertEquals(probeAnswer("/readyz", s).phase, phase);
  }
  // Before it serves, a stalled lock is not judged: there is no manager yet.
  const early = { phase: () => "starting" as const, health: () => wedged };
  assertEquals(probeAnswer("/healthz", early), { ok: true, phase: "starting" });
  assertEquals(
    probeAnswer("/healthz", { phase: () => "serving", health: () => wedged }),
    { ok: false, phase: "serving", reason: wedged.reason },
  );
});

Deno.test("the probe socket refuses other paths (404) and methods (405)", async () => {
  const s = { phase: () => "standby" as const };
  assertEquals(probeResponse("GET", "/v1/status", s).status, 404);
  const post = probeResponse("POST", "/healthz", s);
  assertEquals([post.status, post.headers.get("allow")], [405, "GET, HEAD"]);
  const ok = probeResponse("GET", "/readyz?x=1", s);
  assertEquals([ok.status, await ok.json()], [200, { ok: true, phase: "standby" }]);
});

Deno.test("serveProbe answers on its socket (0600), replaces a stale one and removes it on shutdown", async () => {
  await withRunDir(async (dir) => {
    const path = `${dir}/probe/probe.sock`;
    let phase: ProbePhase = "standby";
    // A stale socket left by this pod's previous container.
    await Deno.mkdir(`${dir}/probe`);
    Deno.listen({ transport: "unix", path }).close();
    const server = await serveProbe(path, { phase: () => phase, ready: () => true });
    try {
      assertEquals((await Deno.lstat(path)).mode! & 0o777, 0o600);
      assertEquals((await Deno.stat(`${dir}/probe`)).mode! & 0o777, 0o700);
      const ask = async (p: string) => {
        const r = await unixRequest(path, "GET", p, undefined, 2000);
        return [r.status, JSON.parse(r.body).phase];
      };
      assertEquals(await ask("/readyz"), [200, "standby"]);
      phase = "starting";
      assertEquals(await ask("/readyz"), [503, "starting"]);
      assertEquals(await ask("/healthz"), [200, "starting"]);
      phase = "serving";
      assertEquals(await ask("/readyz"), [200, "serving"]);
    } finally {
      await server.shutdown();
    }
    assertEquals(await Deno.lstat(path).then(() => true, () => false), false);
  });
});
