import { assertEquals } from "./assert.ts";
import { IdleGc } from "./idle_gc.ts";

Deno.test("IdleGc collects once requests stop, never while one is in flight", async () => {
  let collected = 0;
  const idle = new IdleGc({ gc: () => collected++, idleMs: 0, everyOps: 1000, quietMs: 0 });
  let release!: () => void;
  const slow = idle.wrap((_: number) => new Promise<string>((r) => release = () => r("slow")));
  const fast = idle.wrap((n: number) => Promise.resolve(`fast ${n}`));
  assertEquals(fast.length, 1, "Deno.serve passes the Request only to handlers that declare it");
  const pending = slow(1);
  assertEquals(await fast(2), "fast 2");
  await new Promise((r) => setTimeout(r, 5));
  assertEquals(collected, 0, "a request is in flight");
  release();
  assertEquals(await pending, "slow");
  await new Promise((r) => setTimeout(r, 5));
  assertEquals(collected, 1);
  idle.stop();
});

Deno.test("IdleGc is a no-op without a collector", async () => {
  const idle = new IdleGc({ gc: undefined });
  const h = (n: number) => Promise.resolve(n);
  assertEquals(idle.wrap(h), h);
  assertEquals(await idle.wrap(h)(1), 1);
  idle.stop();
});
