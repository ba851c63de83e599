/**
 * The shared provider contract test suite: one function every provider's test
 * runs (the mock in process, BCE against a fake BCE API), checking the seed's
 * rules for `list`, `allocateNextENI` and `deallocateENI`.
 *
 * The provider under test must start with at least 4 ENIs free or attachable,
 * all of them carrying an IPv4 or IPv6 address, and nothing owned.
 *
 * @module
 */
import {
  type AllocationRequestInput,
  type Eni,
  EniSchema,
  keyOf,
  NodeCapacitySchema,
  type Owner,
  type Provider,
  ProviderError,
  ProviderStatusSchema,
} from "../../providers/contract.ts";
import { assert, assertEquals, assertRejects } from "../../lib/assert.ts";

/** What the suite needs: a fresh provider and a way to dispose of it. */
export interface ProviderUnderTest {
  provider: Provider;
  cleanup: () => Promise<void>;
}

const ANY: AllocationRequestInput = { ips: [], ranges: [] };

function owner(i: number, c = "c"): Owner {
  return { pod: `ns/pod-${i}`, containerId: `${c}${i}`, ifName: "eth0" };
}

/** Asserts no ENI is owned twice and no owner holds two ENIs. */
function assertOwnershipSound(enis: Eni[]): void {
  const ids = new Set<string>();
  const owners = new Map<string, string>();
  for (const e of enis) {
    EniSchema.parse(e);
    assert(!ids.has(e.id), `ENI "${e.id}" is listed twice`);
    ids.add(e.id);
    assertEquals(e.state === "owned", e.owner !== null, `ENI "${e.id}" state and owner disagree`);
    if (e.owner) {
      const k = keyOf(e.owner);
      assert(!owners.has(k), `Owner "${k}" holds "${owners.get(k)}" and "${e.id}"`);
      owners.set(k, e.id);
    }
  }
}

async function capacity(p: Provider): Promise<number> {
  const s = ProviderStatusSchema.parse(await p.status());
  return s.free + s.attachable;
}

/**
 * Runs the provider contract as steps of `t`; each step gets a fresh provider
 * from `makeProvider` and disposes of it.
 *
 * @example
 * ```ts ignore
 * Deno.test("mock provider meets the contract", (t) =>
 *   providerContractSuite(t, async () => ({ provider, cleanup })));
 * ```
 */
export async function providerContractSuite(
  t: Deno.TestContext,
  makeProvider: () => Promise<ProviderUnderTest>,
): Promise<void> {
  const step = (name: string, fn: (p: Provider) => Promise<void>) =>
    t.step(name, async () => {
      const { provider, cleanup } = await makeProvider();
      try {
        await fn(provider);
      } finally {
        await cleanup();
      }
    });

  await step("list() starts with nothing owned", async (p) => {
    const enis = await p.list();
    assertOwnershipSound(enis);
    assertEquals(enis.filter((e) => e.owner).length, 0);
    assert((await capacity(p)) >= 4, "The suite needs at least 4 ENIs");
  });

  await step(
    "capacity(), where offered, counts every ENI pods can get and stays put while they take them",
    async (p) => {
      if (!p.capacity) return;
      const before = NodeCapacitySchema.parse(await p.capacity());
      const s = ProviderStatusSchema.parse(await p.status());
      // Nothing is in flight: what pods can get is what the pool has and can still attach.
      assertEquals(before.forPods, s.free + s.owned + s.attachable);
      const held = before.unavailable.reduce((n, u) => n + u.count, 0);
      assertEquals(before.forPods, Math.max(0, before.limit - held));
      const n = await capacity(p);
      for (let i = 0; i < n; i++) await p.allocateNextENI(owner(i), ANY);
      assertEquals(NodeCapacitySchema.parse(await p.capacity()), before, "pods holding ENIs");
      for (let i = 0; i < n; i++) await p.deallocateENI(owner(i));
      assertEquals(NodeCapacitySchema.parse(await p.capacity()), before, "pods gone");
    },
  );

  await step("allocateNextENI() is idempotent per owner", async (p) => {
    const a = await p.allocateNextENI(owner(1), ANY);
    const b = await p.allocateNextENI(owner(1), ANY);
    assertEquals(b.id, a.id);
    assertEquals(a.state, "owned");
    assertEquals(a.owner, owner(1));
    const listed = (await p.list()).filter((e) => e.owner);
    assertEquals(listed.map((e) => e.id), [a.id]);
  });

  await step(
    "allocateNextENI() gives one owner's attachments of one pod distinct ENIs",
    async (p) => {
      const a = await p.allocateNextENI({ pod: "ns/x", containerId: "old", ifName: "eth0" }, ANY);
      const b = await p.allocateNextENI({ pod: "ns/x", containerId: "new", ifName: "eth0" }, ANY);
      assert(a.id !== b.id, "Two attachments of one pod got the same ENI");
      await p.deallocateENI({ pod: "ns/x", containerId: "old", ifName: "eth0" });
      const held = (await p.list()).filter((e) => e.owner);
      assertEquals(held.map((e) => e.id), [b.id]);
    },
  );

  await step("deallocateENI() of an owner holding nothing succeeds", async (p) => {
    const before = await p.list();
    await p.deallocateENI(owner(99));
    await p.deallocateENI(owner(99));
    assertEquals(await p.list(), before);
  });

  await step("deallocateENI() frees exactly what the owner holds", async (p) => {
    const a = await p.allocateNextENI(owner(1), ANY);
    const b = await p.allocateNextENI(owner(2), ANY);
    await p.deallocateENI(owner(1));
    const enis = await p.list();
    assertEquals(enis.find((e) => e.id === a.id)?.state, "free");
    assertEquals(enis.find((e) => e.id === b.id)?.owner, owner(2));
    const again = await p.allocateNextENI(owner(3), ANY);
    assert(again.id !== b.id, "An owned ENI was handed out again");
  });

  await step("allocateNextENI() with eniId claims exactly that free ENI, or fails", async (p) => {
    const a = await p.allocateNextENI(owner(1), ANY);
    await p.deallocateENI(owner(1));
    // Reconcile's repair: the state still records `a` for owner 2.
    const back = await p.allocateNextENI(owner(2), { ...ANY, eniId: a.id });
    assertEquals(back.id, a.id);
    assertEquals((await p.list()).find((e) => e.id === a.id)?.owner, owner(2));
    const err = await p.allocateNextENI(owner(3), { ...ANY, eniId: a.id }).then(
      () => null,
      (e: unknown) => e,
    );
    assert(err instanceof ProviderError, `Claiming an owned ENI must fail, got ${err}`);
    assertEquals(err.reason, "wrong_state");
    assertEquals((await p.list()).filter((e) => e.owner).map((e) => e.id), [a.id]);
  });

  await step("exhaustion gives no_eni_available, and freeing makes room", async (p) => {
    const n = await capacity(p);
    const got: Eni[] = [];
    for (let i = 0; i < n; i++) got.push(await p.allocateNextENI(owner(i), ANY));
    assertEquals(new Set(got.map((e) => e.id)).size, n);
    const err = await assertRejects(() => p.allocateNextENI(owner(n), ANY));
    assert(err instanceof ProviderError, `Expected a ProviderError, got ${err}`);
    assertEquals(err.reason, "no_eni_available");
    await p.deallocateENI(owner(0));
    const e = await p.allocateNextENI(owner(n), ANY);
    assertEquals(e.id, got[0].id);
  });

  await step("a requested IP is honoured or refused clearly", async (p) => {
    const first = await p.allocateNextENI(owner(1), ANY);
    const ip = (first.ipv4 ?? first.ipv6)!.address;
    await p.deallocateENI(owner(1));
    const got = await p.allocateNextENI(owner(2), { ips: [ip], ranges: [] });
    assertEquals(got.id, first.id);
    const taken = await assertRejects(() => p.allocateNextENI(owner(3), { ips: [ip], ranges: [] }));
    assert(taken instanceof ProviderError);
    assertEquals(taken.reason, "requested_ip_unavailable");
    const nowhere = first.ipv4 ? "192.0.2.254" : "2001:db8:ffff::1";
    const none = await assertRejects(() =>
      p.allocateNextENI(owner(4), { ips: [nowhere], ranges: [] })
    );
    assert(none instanceof ProviderError);
    assertEquals(none.reason, "requested_ip_unavailable");
    assert(none.message.length > 10, "The error message says nothing");
    assertEquals((await p.list()).filter((e) => e.owner).length, 1);
  });

  await step("requested ranges are honoured or refused clearly", async (p) => {
    const enis = await p.list();
    const all = enis.length > 0 ? enis : [await p.allocateNextENI(owner(0), ANY)];
    await p.deallocateENI(owner(0));
    const target = all[all.length - 1];
    const exact = target.ipv4 ? `${target.ipv4.address}/32` : `${target.ipv6!.address}/128`;
    const got = await p.allocateNextENI(owner(1), { ips: [], ranges: [[{ subnet: exact }]] });
    assertEquals(got.id, target.id);
    const err = await assertRejects(() =>
      p.allocateNextENI(owner(2), { ips: [], ranges: [[{ subnet: "198.51.100.0/24" }]] })
    );
    assert(err instanceof ProviderError);
    assertEquals(err.reason, "requested_ip_unavailable");
  });

  await step("no ENI goes to two owners under concurrent allocate and deallocate", async (p) => {
    const n = await capacity(p);
    const owners = Array.from({ length: n * 3 }, (_, i) => owner(i));
    let seed = 7;
    const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    for (let round = 0; round < 5; round++) {
      const ops = owners.map(async (o) => {
        await new Promise((r) => queueMicrotask(() => r(undefined)));
        try {
          const e = await p.allocateNextENI(o, ANY);
          assertEquals(e.owner, o);
          if (rnd() < 0.5) await p.deallocateENI(o);
        } catch (err) {
          if (!(err instanceof ProviderError)) throw err;
          assert(
            ["no_eni_available", "throttled", "unavailable"].includes(err.reason),
            `Unexpected provider error "${err.reason}": ${err.message}`,
          );
        }
      });
      const snaps = Array.from({ length: 5 }, () => p.list().then(assertOwnershipSound));
      await Promise.all([...ops, ...snaps]);
      const enis = await p.list();
      assertOwnershipSound(enis);
      assert(enis.filter((e) => e.owner).length <= n);
    }
    await Promise.all(owners.map((o) => p.deallocateENI(o)));
    assertEquals((await p.list()).filter((e) => e.owner).length, 0);
  });

  await step("list() is a consistent snapshot while allocations run", async (p) => {
    const n = await capacity(p);
    const allocs = Array.from({ length: n }, (_, i) => p.allocateNextENI(owner(i), ANY));
    const snaps: Eni[][] = [];
    for (let i = 0; i < 5; i++) snaps.push(await p.list());
    await Promise.all(allocs);
    let last = -1;
    for (const s of snaps) {
      assertOwnershipSound(s);
      const owned = s.filter((e) => e.owner).length;
      assert(owned >= last, "A later snapshot shows fewer owned ENIs with no deallocation");
      last = owned;
    }
    assertEquals((await p.list()).filter((e) => e.owner).length, n);
  });
}
