import { assertEquals } from "../../lib/assert.ts";
import { PassScheduler } from "./_schedule.ts";

Deno.test("PassScheduler doubles the period while nothing changes, up to idleMs, and resets on a change", async () => {
  const seen: number[] = [];
  const answers = [false, false, false, false, false, true, false];
  const { promise: done, resolve } = Promise.withResolvers<void>();
  const s: PassScheduler = new PassScheduler({
    baseMs: 1,
    idleMs: 8,
    minGapMs: 0,
    jitter: 0.2,
    random: () => 0.5,
    run: () => {
      seen.push(s.intervalMs);
      if (seen.length === answers.length) resolve();
      return Promise.resolve(answers[seen.length - 1] ?? false);
    },
    onError: () => {},
  });
  s.start();
  await done;
  await s.stop();
  // The period in force when each pass started.
  assertEquals(seen, [1, 2, 4, 8, 8, 8, 1]);
  assertEquals(s.passes, answers.length);
});

Deno.test("PassScheduler: a kick during a pass runs another right after it, even when that pass failed", async () => {
  const events: string[] = [];
  const { promise: done, resolve } = Promise.withResolvers<void>();
  let n = 0;
  const s: PassScheduler = new PassScheduler({
    baseMs: 60_000,
    idleMs: 600_000,
    minGapMs: 0,
    jitter: 0,
    run: () => {
      n++;
      events.push(`pass ${n}`);
      if (n === 1) {
        s.kick(); // an allocation emptied the pool meanwhile
        return Promise.reject(new Error("list failed"));
      }
      resolve();
      return Promise.resolve(false);
    },
    onError: (e) => events.push(`error ${(e as Error).message}`),
  });
  s.start();
  await done;
  await s.stop();
  // Without the kick the second pass would wait a minute.
  assertEquals(events, ["pass 1", "error list failed", "pass 2"]);
  assertEquals(s.nextInMs, null);
});
