/**
 * The enforcer's lifecycle, each phase and transition of docs/network_policy.md ("The
 * enforcer's life"), with steps the test holds and releases.
 */
import { assert, assertEquals } from "../../lib/assert.ts";
import { nullLogger } from "../../lib/log.ts";
import { type LifecycleSteps, PolicyLifecycle, type PolicyPhase } from "./lifecycle.ts";

/** A promise the test settles. */
function gate<T = void>() {
  let resolve!: (v: T) => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<T>((res, rej) => [resolve, reject] = [res, rej]);
  return { promise, resolve, reject };
}

/** Steps that wait for the test, recording what the lifecycle called. */
function heldSteps(o: { takeOverThrows?: number } = {}) {
  const nodeAddresses = gate();
  const sync = gate();
  const firstRender = gate();
  const drained = gate();
  const calls: string[] = [];
  let throws = o.takeOverThrows ?? 0;
  let runSignal: AbortSignal | undefined;
  const steps: LifecycleSteps = {
    nodeAddresses: (signal) => {
      calls.push("nodeAddresses");
      return Promise.race([nodeAddresses.promise, aborted(signal)]);
    },
    sync: (signal) => {
      calls.push("sync");
      return Promise.race([sync.promise, aborted(signal)]);
    },
    takeOver: () => {
      calls.push("takeOver");
      if (throws-- > 0) throw new Error("the compiler could not index the caches");
      return firstRender.promise;
    },
    run: (signal) => {
      calls.push("run");
      runSignal = signal;
    },
    drain: async () => {
      calls.push("drain");
      await drained.promise;
    },
  };
  return {
    steps,
    calls,
    nodeAddresses,
    sync,
    firstRender,
    drained,
    runSignal: () => runSignal,
  };
}

const aborted = (signal: AbortSignal) =>
  new Promise<void>((r) => signal.addEventListener("abort", () => r(), { once: true }));

/** Lets every pending promise callback run. */
const turn = () => new Promise((r) => setTimeout(r, 0));

function lifecycle(steps: LifecycleSteps, retryInitialMs = 1) {
  const l = new PolicyLifecycle(steps, { log: nullLogger, retryInitialMs, retryMaxMs: 4 });
  const phases: PolicyPhase[] = [l.phase];
  l.onPhase((p) => phases.push(p));
  return { l, phases };
}

Deno.test("waiting → taking-over only once the node's addresses, the caches and the hand-over are all in, in any order", async (t) => {
  const orders = [
    ["node-addresses", "caches", "restore"],
    ["node-addresses", "restore", "caches"],
    ["caches", "node-addresses", "restore"],
    ["caches", "restore", "node-addresses"],
    ["restore", "node-addresses", "caches"],
    ["restore", "caches", "node-addresses"],
  ] as const;
  for (const order of orders) {
    await t.step(order.join(", "), async () => {
      const h = heldSteps();
      const { l, phases } = lifecycle(h.steps);
      const meet = {
        "node-addresses": () => h.nodeAddresses.resolve(),
        caches: () => h.sync.resolve(),
        restore: () => l.restored(),
      };
      for (const [i, p] of order.entries()) {
        assertEquals(l.phase, "waiting");
        assert(!l.serving);
        meet[p]();
        await turn();
        if (i < 2) {
          assertEquals(l.waitingFor.sort(), order.slice(i + 1).toSorted());
          assert(!h.calls.includes("takeOver"), `no take-over before ${order.slice(i + 1)}`);
        }
      }
      assertEquals(l.waitingFor, []);
      assertEquals(l.phase, "taking-over");
      assert(l.serving);
      assertEquals(h.calls.filter((c) => c === "takeOver").length, 1);
      h.drained.resolve();
      const stopping = l.stop();
      h.firstRender.resolve();
      await stopping;
      assertEquals(phases, ["waiting", "taking-over", "stopping", "stopped"]);
    });
  }
});

Deno.test("taking-over → running once the first render has settled; running → stopping → stopped once drained", async () => {
  const h = heldSteps();
  const { l, phases } = lifecycle(h.steps);
  h.nodeAddresses.resolve();
  h.sync.resolve();
  l.restored();
  assert(await l.served(10_000));
  assertEquals(l.phase, "taking-over");
  assert(!h.calls.includes("run"), "nothing runs before the first render settled");
  h.firstRender.resolve();
  await turn();
  assertEquals(l.phase, "running");
  assert(h.calls.includes("run"));
  const signal = h.runSignal()!;
  assert(!signal.aborted);
  const stopping = l.stop();
  assertEquals(l.phase, "stopping");
  assert(!l.serving);
  assert(signal.aborted, "what runs is told to stop");
  assertEquals(await l.served(10_000), false, "no ADD is served once stopping");
  await turn();
  assertEquals(l.phase, "stopping", "stopping lasts until drained");
  h.drained.resolve();
  await stopping;
  assertEquals(l.phase, "stopped");
  assertEquals(phases, ["waiting", "taking-over", "running", "stopping", "stopped"]);
  assertEquals(h.calls.filter((c) => c === "drain").length, 1);
  await l.stop();
  assertEquals(h.calls.filter((c) => c === "drain").length, 1, "stop is idempotent");
});

Deno.test("waiting → stopping → stopped: no take-over, the steps' waits end, served() answers false", async () => {
  const h = heldSteps();
  const { l, phases } = lifecycle(h.steps);
  h.sync.resolve();
  await turn();
  const served = l.served(60_000);
  const stopping = l.stop();
  assertEquals(await served, false);
  h.drained.resolve();
  await stopping;
  l.restored();
  await turn();
  assertEquals(phases, ["waiting", "stopping", "stopped"]);
  assert(!h.calls.includes("takeOver"));
  assertEquals(l.waitingFor.sort(), ["node-addresses", "restore"]);
});

Deno.test("taking-over → stopping: the first render is waited for, nothing more runs", async () => {
  const h = heldSteps();
  const { l, phases } = lifecycle(h.steps);
  h.nodeAddresses.resolve();
  h.sync.resolve();
  l.restored();
  assert(await l.served(10_000));
  let stopped = false;
  const stopping = l.stop().then(() => stopped = true);
  h.drained.resolve();
  await turn();
  assert(!stopped, "the stop waits for the first render");
  assert(!h.calls.includes("drain"), "the drain comes after the first render");
  h.firstRender.resolve();
  await stopping;
  assertEquals(phases, ["waiting", "taking-over", "stopping", "stopped"]);
  assert(!h.calls.includes("run"));
});

Deno.test("a take-over that throws stays waiting and is tried again after a backoff", async () => {
  const h = heldSteps({ takeOverThrows: 3 });
  const { l, phases } = lifecycle(h.steps);
  h.nodeAddresses.resolve();
  h.sync.resolve();
  l.restored();
  assertEquals(await l.served(10_000), true);
  assertEquals(h.calls.filter((c) => c === "takeOver").length, 4);
  assertEquals(phases, ["waiting", "taking-over"], "waiting until one succeeded");
  h.firstRender.resolve();
  await turn();
  assertEquals(l.phase, "running");
  h.drained.resolve();
  await l.stop();
});

Deno.test("served() answers false after its bound while waiting, and the hand-over counts once", async () => {
  const h = heldSteps();
  const { l } = lifecycle(h.steps);
  l.restored();
  l.restored();
  assertEquals(await l.served(20), false);
  assertEquals(l.phase, "waiting");
  h.nodeAddresses.resolve();
  h.sync.resolve();
  assert(await l.served(10_000));
  l.restored();
  h.firstRender.resolve();
  await turn();
  assertEquals(h.calls.filter((c) => c === "takeOver").length, 1);
  h.drained.resolve();
  await l.stop();
});
