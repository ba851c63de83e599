import { assertEquals } from "../lib/assert.ts";
import { Backoff } from "./_backoff.ts";

Deno.test("backoff doubles up to its cap, stretched by jitter, and starts over after a reset", () => {
  let now = 0;
  const b = new Backoff({
    initialMs: 100,
    maxMs: 800,
    resetMs: 10_000,
    random: () => 0,
    now: () => now,
  });
  assertEquals([b.next(), b.next(), b.next(), b.next(), b.next()], [100, 200, 400, 800, 800]);
  b.reset();
  assertEquals(b.next(), 100);
  const j = new Backoff({ initialMs: 100, jitter: 1, random: () => 0.5, now: () => now });
  assertEquals([j.next(), j.next()], [150, 300]);
  // A failure long after the last one starts from the first wait again.
  now = 20_000;
  assertEquals(b.next(), 100);
});
