import { assertEquals, assertMatch } from "../lib/assert.ts";
import { healthCheck } from "./health.ts";
import { KeyedMutex } from "../manager/mutex.ts";
import { createHandler } from "./server.ts";
import { FakeManager } from "../tests/support/fake_manager.ts";

const tick = () => new Promise((r) => setTimeout(r, 1));

Deno.test("liveness: ok while nothing is held, or while held locks move; wedged once held locks stand still past stallSeconds", async (t) => {
  let clock = 0;
  const locks = new KeyedMutex(() => clock);
  const health = healthCheck({
    progress: () => locks.progress(),
    stallMs: 300_000,
    now: () => clock,
  });
  await t.step("idle for an hour: ok (nothing to do is not a wedge)", () => {
    clock = 3_600_000;
    assertEquals(health(), { ok: true });
  });
  let release!: () => void;
  const op = locks.run("att:c1/eth0", () => new Promise<void>((r) => (release = r)));
  await tick();
  await t.step("an operation holding its lock within stallSeconds: ok", () => {
    clock += 300_000;
    assertEquals(health(), { ok: true });
  });
  await t.step("another operation moving its own lock keeps the agent live", async () => {
    clock += 200_000;
    await locks.run("att:c2/eth0", () => Promise.resolve());
    clock += 200_000;
    assertEquals(health(), { ok: true });
  });
  await t.step(
    "nothing moved for longer than stallSeconds with a lock held: wedged, and why",
    () => {
      clock += 100_001;
      const h = health();
      assertEquals(h.ok, false);
      assertMatch(
        h.reason!,
        /^The ENI manager is wedged: 1 lock is held or waited for and none was taken or released for 300 s \(health\.stallSeconds: 300\)$/,
      );
    },
  );
  await t.step("the lock released: live again", async () => {
    release();
    await op;
    assertEquals(health(), { ok: true });
  });
});

Deno.test("GET /v1/healthz answers 200 {ok: true} when live and 503 with the reason when wedged", async () => {
  let h = { ok: true } as { ok: boolean; reason?: string };
  const handler = createHandler({ manager: new FakeManager(), health: () => h });
  const get = () => handler(new Request("http://enim/v1/healthz"));
  const live = await get();
  assertEquals([live.status, await live.json()], [200, { ok: true }]);
  h = { ok: false, reason: "The ENI manager is wedged: x" };
  const wedged = await get();
  assertEquals([wedged.status, await wedged.json()], [503, h]);
});
