/**
 * What an ADD waits for before it takes an ENI (issue 41 item 3, issue 42 point 11), on
 * fake devices and the mock provider:
 *
 * - DELs that have answered and are still bringing their ENIs home: an ADD the provider
 *   refuses meanwhile waits for them (bounded, its `del_wait` phase) and asks again; it
 *   answers `no_eni_available` (CNI 100) at once when none is finishing, and says how
 *   many still are when the bound passes;
 * - NetworkPolicy's first sync: an ADD waits for it before it records anything or takes
 *   an ENI, so the ENI stays free meanwhile, and one that gives up leaves nothing.
 */
import { ApiError } from "../api/schema.ts";
import { NODE } from "../netns/fake.ts";
import type { Phase, PhaseRecorder } from "../lib/metrics.ts";
import { assert, assertEquals, assertRejects, assertStringIncludes } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import type { AddResponse } from "../api/schema.ts";
import type { PolicyHook } from "./types.ts";
import {
  add,
  addReq,
  delReq,
  type Node,
  settle,
  withNode,
} from "../tests/support/manager_fixtures.ts";

/** The phases each ADD recorded, in the order the ADDs ended. */
class Phases implements PhaseRecorder {
  readonly adds: Phase[][] = [];
  #current: Phase[] = [];
  phase(op: string, phase: Phase): void {
    if (op === "add") this.#current.push(phase);
  }
  operation(op: string): void {
    if (op !== "add") return;
    this.adds.push(this.#current);
    this.#current = [];
  }
  gcReclaim(): void {}
  /** How many ADDs waited for DELs. */
  get delWaits(): number {
    return this.adds.filter((p) => p.includes("del_wait")).length;
  }
}

async function rejectsWith(p: Promise<unknown>, code: string): Promise<ApiError> {
  const e = await assertRejects(() => p);
  assert(e instanceof ApiError, `Expected an ApiError, got ${e}`);
  assertEquals(e.code, code, e.message);
  return e;
}

/** An ADD of pod `i` started now (its namespace made first); its outcome kept for later. */
function started(n: Node, i: number) {
  const req = addReq(i);
  n.devices.addNetns(req.netns);
  let done: AddResponse | Error | null = null;
  const p = n.mgr.add(req).then(
    (r) => (done = r, r),
    (e) => {
      done = e;
      throw e;
    },
  );
  p.catch(() => {});
  return {
    p,
    get done() {
      return done;
    },
  };
}

Deno.test("three ADDs at once on a full node while a DEL is finishing: two take the free ENIs, the third waits for the DEL's and gets it", async () => {
  const phases = new Phases();
  await withNode(async (n) => {
    const first = await add(n, 1);
    // The DEL answers; its device's move home (and so the ENI's release) is held back.
    const open = n.devices.holdOn("unplug");
    let adds: ReturnType<typeof started>[] = [];
    try {
      await n.mgr.del(delReq(1));
      adds = [2, 3, 4].map((i) => started(n, i));
      const two = await poll(
        () => Promise.resolve(adds.filter((a) => a.done !== null).length >= 2 || null),
        { timeoutMs: 10_000, intervalMs: 5 },
      );
      assert(two, "two ADDs answered with the free ENIs");
      await settle();
      const left = adds.filter((a) => a.done === null);
      assertEquals(left.length, 1, "one ADD waits for the ENI on its way home, not 100");
      assertEquals(n.devices.where(first.mac)?.ns, "/run/netns/p1", "that ENI is not home yet");
    } finally {
      open();
    }
    const waiting = adds.filter((a) => a.done === null);
    const results = await Promise.all(adds.map((a) => a.p));
    assertEquals(new Set(results.map((r) => r.eniId)).size, 3);
    assertEquals(await waiting[0].p.then((r) => r.eniId), first.eniId, "the DEL's ENI");
    await n.mgr.settled();
    assertEquals(
      n.mgr.state.all().map((r) => [r.containerId, r.state]).sort(),
      [["c2", "ready"], ["c3", "ready"], ["c4", "ready"]],
    );
    assertEquals(phases.delWaits, 1, "the wait is the waiting ADD's del_wait phase");
  }, { mock: { enis: 3 }, metrics: phases });
});

Deno.test("an ADD on a full node answers no_eni_available at once when no DEL is finishing", async () => {
  const phases = new Phases();
  await withNode(async (n) => {
    await add(n, 1);
    await add(n, 2);
    const e = await rejectsWith(add(n, 3), "no_eni_available");
    assertStringIncludes(e.message, "0 free, 2 of 2 attached");
    assert(!e.message.includes("DEL"), e.message);
    assertEquals(phases.delWaits, 0, "nothing waited for");
    assertEquals(n.mgr.state.all().map((r) => r.containerId).sort(), ["c1", "c2"]);
  }, { mock: { enis: 2 }, metrics: phases });
});

Deno.test("an ADD waits for DELs still finishing at most timeouts.delWaitSeconds, then answers no_eni_available saying so, and leaves nothing", async () => {
  const phases = new Phases();
  await withNode(async (n) => {
    const first = await add(n, 1);
    const open = n.devices.holdOn("unplug");
    try {
      await n.mgr.del(delReq(1));
      const e = await rejectsWith(add(n, 2), "no_eni_available");
      assertStringIncludes(e.message, "0 free, 1 of 1 attached");
      assertStringIncludes(
        e.message,
        "1 DEL is still bringing its ENI home after 0.1 s of waiting (timeouts.delWaitSeconds)",
      );
      assertEquals(phases.delWaits, 1);
    } finally {
      open();
    }
    await n.mgr.settled();
    assertEquals(n.mgr.state.all(), [], "the refused ADD left no record");
    assertEquals((await n.owned()).size, 0);
    assertEquals(n.devices.where(first.mac)?.ns, NODE);
    assertEquals((await add(n, 3)).eniId, first.eniId, "the ENI is the next pod's");
  }, { mock: { enis: 1 }, metrics: phases, delWaitMs: 100 });
});

const LINK = {
  podIfName: "host0",
  nodeIfPrefix: "enimh",
  serviceCidrs: ["172.30.0.0/16"],
  hostStackCidrs: [],
};

/**
 * A NetworkPolicy hook as the enforcer behaves before its first sync: `whenSynced` and
 * `prepare` both wait for `sync()`, and give up with `policy_unavailable` on `giveUp()`.
 */
class UnsyncedPolicy implements PolicyHook {
  synced = false;
  readonly prepared: string[] = [];
  #wait: { p: Promise<void>; resolve: () => void; reject: (e: Error) => void };
  constructor() {
    let resolve!: () => void, reject!: (e: Error) => void;
    const p = new Promise<void>((res, rej) => (resolve = res, reject = rej));
    p.catch(() => {});
    this.#wait = { p, resolve, reject };
  }
  sync(): void {
    this.synced = true;
    this.#wait.resolve();
  }
  giveUp(): void {
    this.#wait.reject(new ApiError("policy_unavailable", "NetworkPolicy: not synced (test)"));
  }
  whenSynced(): Promise<void> | null {
    return this.synced ? null : this.#wait.p;
  }
  reuseWait(): null {
    return null;
  }
  async prepare(p: { key: string }) {
    await this.#wait.p;
    this.prepared.push(p.key);
    return { podRuleset: () => Promise.resolve("") };
  }
  committed(): Promise<void> {
    return Promise.resolve();
  }
  removed(): Promise<void> {
    return Promise.resolve();
  }
  restore(): void {}
}

const NODE_ADDRS = { addresses: ["10.99.0.250"], primary: { ipv4: "10.99.0.250" } };

Deno.test("an ADD waits for NetworkPolicy's first sync before it takes an ENI: the ENI stays free meanwhile, and the ADD completes after the sync", async () => {
  const policy = new UnsyncedPolicy();
  const phases = new Phases();
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    let other: AddResponse | undefined;
    let done = false;
    const waiting = add(n, 1, { hostLink: LINK }).then((r) => (done = true, r));
    try {
      await settle();
      assertEquals(done, false, "the ADD waits for the sync");
      // Meanwhile both ENIs are free: none is pinned by the waiting ADD.
      const s = await n.mgr.status();
      assertEquals([s.pool.free, s.pool.owned], [2, 0]);
      assertEquals(n.mgr.state.all(), [], "nothing recorded yet");
      assertEquals(n.provider.allocations, 0);
      // A pod that needs no policy (no host link) takes one meanwhile; one is still free.
      other = await add(n, 2);
      assertEquals((await n.mgr.status()).pool.free, 1);
      assertEquals(done, false);
    } finally {
      policy.sync();
    }
    const r = await waiting;
    assert(r.eniId !== other?.eniId);
    assertEquals(policy.prepared, ["c1/eth0"]);
    assertEquals((await n.mgr.status()).pool.free, 0);
    const first = phases.adds.find((p) => p.includes("policy_sync"));
    assert(first, `the wait is the ADD's policy_sync phase: ${JSON.stringify(phases.adds)}`);
    // Synced: the next ADD waits for nothing.
    await n.mgr.del(delReq(2));
    await n.mgr.settled();
    await add(n, 3, { hostLink: LINK });
    assertEquals(phases.adds.at(-1)!.includes("policy_sync"), false);
  }, { mock: { enis: 2 }, policy, metrics: phases });
});

Deno.test("an ADD whose wait for NetworkPolicy's first sync gives up fails with policy_unavailable, as before, having taken and changed nothing", async () => {
  const policy = new UnsyncedPolicy();
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    n.devices.addNetns("/run/netns/p1");
    const before = n.devices.snapshot();
    const waiting = n.mgr.add(addReq(1, { hostLink: LINK }));
    await settle();
    policy.giveUp();
    const e = await rejectsWith(waiting, "policy_unavailable");
    assertEquals(e.message, "NetworkPolicy: not synced (test)");
    assertEquals(n.provider.allocations, 0, "no ENI was taken");
    assertEquals(n.mgr.state.all(), []);
    assertEquals((await n.mgr.status()).pool.free, 1);
    const after = n.devices.snapshot();
    assertEquals(after[NODE], before[NODE], "the node's devices are as they were");
    assertEquals(after["/run/netns/p1"], before["/run/netns/p1"], "and the pod's");
    assertEquals(
      n.devices.calls.filter((c) => c.op === "plug" || c.op === "unplug").length,
      0,
      "no device moved",
    );
  }, { mock: { enis: 1 }, policy });
});
