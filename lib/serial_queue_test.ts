import { assert, assertEquals, assertRejects } from "./assert.ts";
import { type FailedAttempt, QueueStoppedError, SerialQueue } from "./serial_queue.ts";

/** Collects the unhandled rejections of `fn`'s run (none is let through to the test). */
async function unhandledDuring(fn: () => Promise<void>): Promise<unknown[]> {
  const seen: unknown[] = [];
  const on = (e: PromiseRejectionEvent) => {
    e.preventDefault();
    seen.push(e.reason);
  };
  globalThis.addEventListener("unhandledrejection", on);
  try {
    await fn();
    // A rejection nobody handles is reported after the microtasks of its turn.
    await new Promise((r) => setTimeout(r, 0));
  } finally {
    globalThis.removeEventListener("unhandledrejection", on);
  }
  return seen;
}

Deno.test("run() runs tasks one at a time in order; first goes before the tasks not started yet", async () => {
  const q = new SerialQueue();
  const log: string[] = [];
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  let running = 0;
  const task = (name: string, wait?: Promise<void>) => async () => {
    running++;
    assertEquals(running, 1, "one task at a time");
    log.push(`${name} start`);
    await wait;
    log.push(`${name} end`);
    running--;
    return name;
  };
  const a = q.run(task("a", gate));
  const b = q.run(task("b"));
  const c = q.run(task("c"), { first: true });
  assertEquals(log, ["a start"], "a started in the turn it was queued");
  open();
  assertEquals(await Promise.all([a, b, c]), ["a", "b", "c"]);
  assertEquals(log, ["a start", "a end", "c start", "c end", "b start", "b end"]);
  await q.stop();
});

Deno.test("a task that throws synchronously or rejects fails alone: the queue runs the next, and nothing is unhandled", async () => {
  const q = new SerialQueue();
  const ran: string[] = [];
  const unhandled = await unhandledDuring(async () => {
    const sync = q.run((): number => {
      throw new Error("sync");
    });
    const rejected = q.run(() => Promise.reject(new Error("async")));
    const after = q.run(() => {
      ran.push("after");
      return 3;
    });
    await assertRejects(() => sync, Error, "sync");
    await assertRejects(() => rejected, Error, "async");
    assertEquals(await after, 3);
    // Even a task whose promise nobody awaits only rejects that promise.
    q.run(() => {
      throw new Error("ignored");
    }).catch(() => {});
    assertEquals(await q.run(() => "still running"), "still running");
  });
  assertEquals(ran, ["after"]);
  assertEquals(unhandled, []);
  await q.stop();
});

Deno.test("retry() runs a failing task again with a doubling backoff until it succeeds, other tasks running meanwhile", async () => {
  const failures: [string, FailedAttempt][] = [];
  const q = new SerialQueue({
    retryInitialMs: 5,
    retryMaxMs: 12,
    onError: (err, a) => failures.push([(err as Error).message, a]),
  });
  let tries = 0;
  const log: string[] = [];
  const retried = q.retry(() => {
    tries++;
    log.push(`try ${tries}`);
    if (tries < 4) throw new Error(`failure ${tries}`);
    return "done";
  }, { name: "flaky" });
  const other = q.run(() => log.push("other"));
  assertEquals(await retried, "done");
  await other;
  assertEquals(tries, 4);
  assertEquals(log.slice(0, 2), ["try 1", "other"], "the other task did not wait for the retries");
  assertEquals(failures, [
    ["failure 1", { name: "flaky", attempt: 1, retryInMs: 5 }],
    ["failure 2", { name: "flaky", attempt: 2, retryInMs: 10 }],
    ["failure 3", { name: "flaky", attempt: 3, retryInMs: 12 }],
  ]);
  await q.idle();
  assertEquals(q.pending, 0);
  await q.stop();
});

Deno.test("an onError that throws stops neither the retries nor the queue", async () => {
  const q = new SerialQueue({
    retryInitialMs: 1,
    onError: () => {
      throw new Error("the report failed");
    },
  });
  let tries = 0;
  assertEquals(
    await q.retry(() => {
      if (++tries < 3) throw new Error("not yet");
      return tries;
    }),
    3,
  );
  assertEquals(await q.run(() => "next"), "next");
  await q.stop();
});

Deno.test("stop() runs what was queued, refuses new tasks, abandons the retries waiting, and resolves once drained", async () => {
  const q = new SerialQueue({ retryInitialMs: 60_000 });
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  const ran: string[] = [];
  const first = q.run(async () => {
    await gate;
    ran.push("first");
  });
  const queued = q.run(() => {
    ran.push("queued");
  });
  const waiting = q.retry(() => {
    throw new Error("fails, then waits a minute");
  });
  // Let the retried task fail once (it runs after the two above).
  open();
  await first;
  await queued;
  await new Promise((r) => setTimeout(r, 0));
  assertEquals(q.pending, 1, "the retry waits out its backoff");
  let stopped = false;
  const stopping = q.stop().then(() => stopped = true);
  await assertRejects(() => waiting, QueueStoppedError);
  await assertRejects(() => q.run(() => "late"), QueueStoppedError);
  await assertRejects(() => q.retry(() => "late"), QueueStoppedError);
  await stopping;
  assert(stopped);
  assertEquals(ran, ["first", "queued"]);
  assertEquals(q.pending, 0);
  assert(q.stopped);
});

Deno.test("stop() waits for the task running and those queued behind it", async () => {
  const q = new SerialQueue();
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  const ran: string[] = [];
  q.run(async () => {
    await gate;
    ran.push("a");
  });
  q.run(() => {
    ran.push("b");
  });
  let stopped = false;
  const stopping = q.stop().then(() => stopped = true);
  await new Promise((r) => setTimeout(r, 0));
  assert(!stopped, "stop waits for the task running");
  open();
  await stopping;
  assertEquals(ran, ["a", "b"]);
});

Deno.test("a retried task that fails while the queue stops rejects with its error", async () => {
  const q = new SerialQueue({ retryInitialMs: 1 });
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  const r = q.retry(async () => {
    await gate;
    throw new Error("failed while stopping");
  });
  const stopping = q.stop();
  open();
  await assertRejects(() => r, Error, "failed while stopping");
  await stopping;
  assertEquals(q.pending, 0);
});
