import { poll, sleep, Slots, withDeadline } from "./async.ts";
import { assertEquals, assertRejects } from "./assert.ts";

Deno.test("withDeadline() answers with the promise, or the timeout error, and leaves no timer", async () => {
  assertEquals(await withDeadline(Promise.resolve(7), 1000, () => new Error("late")), 7);
  const slow = sleep(50).then(() => 1);
  const e = await assertRejects(() => withDeadline(slow, 5, () => new RangeError("late")));
  assertEquals((e as Error).name, "RangeError");
  await slow; // the sanitizer checks that nothing is left running
});

Deno.test("poll() returns the first value, or null after the timeout, backing off", async () => {
  let n = 0;
  assertEquals(
    await poll(() => Promise.resolve(++n >= 3 ? "ok" : null), { timeoutMs: 1000, intervalMs: 1 }),
    "ok",
  );
  assertEquals(n, 3);
  const times: number[] = [];
  const none = await poll(() => {
    times.push(performance.now());
    return Promise.resolve(undefined);
  }, { timeoutMs: 60, intervalMs: 5, maxIntervalMs: 20 });
  assertEquals(none, null);
  const waits = times.slice(1).map((t, i) => t - times[i]);
  // It waited between tries (5, 10, 20, 20, … ms) and tried more than once.
  assertEquals(waits.length >= 2 && waits.slice(0, 2).every((w) => w >= 4), true);
  const stop = new AbortController();
  stop.abort();
  assertEquals(
    await poll(() => Promise.resolve(null), {
      timeoutMs: 1000,
      intervalMs: 100,
      signal: stop.signal,
    }),
    null,
  );
});

Deno.test("Slots runs at most its size at once, the others in their order, and frees a slot that threw", async () => {
  const slots = new Slots(2);
  let running = 0, most = 0;
  const order: number[] = [];
  const job = (i: number) =>
    slots.run(async () => {
      running++;
      most = Math.max(most, running);
      order.push(i);
      await sleep(5);
      running--;
      if (i === 1) throw new Error("one");
      return i;
    });
  const results = await Promise.allSettled([0, 1, 2, 3, 4].map(job));
  assertEquals(most, 2);
  assertEquals(order, [0, 1, 2, 3, 4]);
  assertEquals(results.map((r) => r.status), [
    "fulfilled",
    "rejected",
    "fulfilled",
    "fulfilled",
    "fulfilled",
  ]);
  // A new arrival after all that finds both slots free.
  assertEquals(await Promise.all([job(5), job(6)]), [5, 6]);
});
