/**
 * Provider contract checks, written against the {@linkcode Provider} interface
 * only, so they can be swapped for the shared `providers/contract_suite.ts`
 * when it lands (same shape: `(t, makeProvider)`).
 *
 * @module
 */
import { assert, assertEquals } from "../../lib/assert.ts";
import { EniSchema, type Owner, type Provider, ProviderError } from "../contract.ts";

/** A provider under test whose node can hold `capacity` ENIs. */
export interface ContractSubject {
  provider: Provider;
  capacity: number;
  close(): Promise<void>;
}

/** Makes a fresh provider (fresh state) for one check. */
export type MakeProvider = () => Promise<ContractSubject>;

const owner = (i: number, c = "c"): Owner => ({
  pod: `default/pod-${i}`,
  containerId: `${c}${i}`,
  ifName: "eth0",
});
const any = { ips: [], ranges: [] };

/** Runs the contract checks as steps of `t`. */
export async function providerContractChecks(
  t: Deno.TestContext,
  makeProvider: MakeProvider,
): Promise<void> {
  const withSubject = async (fn: (s: ContractSubject) => Promise<void>) => {
    const s = await makeProvider();
    try {
      await fn(s);
    } finally {
      await s.close();
    }
  };

  await t.step(
    "deallocateENI() of an owner holding nothing succeeds",
    () =>
      withSubject(async ({ provider }) => {
        await provider.deallocateENI(owner(1));
        assertEquals((await provider.list()).length, 0);
      }),
  );

  await t.step(
    "allocateNextENI() is idempotent per owner and returns a valid ENI",
    () =>
      withSubject(async ({ provider }) => {
        const a = await provider.allocateNextENI(owner(1), any);
        EniSchema.parse(a);
        assertEquals(a.state, "owned");
        assertEquals(a.owner, owner(1));
        const again = await provider.allocateNextENI(owner(1), any);
        assertEquals(again.id, a.id);
        const both = await Promise.all([
          provider.allocateNextENI(owner(2), any),
          provider.allocateNextENI(owner(2), any),
        ]);
        assertEquals(both[0].id, both[1].id);
        const listed = await provider.list();
        assertEquals(listed.filter((e) => e.state === "owned").length, 2);
      }),
  );

  await t.step(
    "a freed ENI goes back to the pool and is reused",
    () =>
      withSubject(async ({ provider }) => {
        const a = await provider.allocateNextENI(owner(1), any);
        await provider.deallocateENI(owner(1));
        await provider.deallocateENI(owner(1));
        const listed = await provider.list();
        assertEquals(listed.find((e) => e.id === a.id)?.state, "free");
        const b = await provider.allocateNextENI(owner(2), any);
        assertEquals(b.id, a.id);
      }),
  );

  await t.step(
    "no ENI goes to two owners under concurrent interleavings",
    () =>
      withSubject(async ({ provider, capacity }) => {
        const n = capacity;
        // Round 1: everyone at once; round 2: frees interleaved with allocations.
        const first = await Promise.allSettled(
          Array.from({ length: n }, (_, i) => provider.allocateNextENI(owner(i), any)),
        );
        const got = first.filter((r) => r.status === "fulfilled").map((r) => r.value.id);
        assertEquals(new Set(got).size, got.length, "an ENI was handed to two owners");
        const ops: Promise<unknown>[] = [];
        for (let i = 0; i < n; i++) {
          if (i % 2 === 0) ops.push(provider.deallocateENI(owner(i)));
          ops.push(provider.allocateNextENI(owner(i, "d"), any).catch((e) => e));
        }
        await Promise.all(ops);
        const owned = (await provider.list()).filter((e) => e.state === "owned");
        const keys = owned.map((e) => `${e.owner!.pod}/${e.owner!.containerId}`);
        assertEquals(new Set(keys).size, keys.length, "an owner holds two ENIs");
        assertEquals(new Set(owned.map((e) => e.id)).size, owned.length);
        assert(owned.length <= capacity);
      }),
  );

  await t.step(
    "a requested IP is honoured or refused with requested_ip_unavailable",
    () =>
      withSubject(async ({ provider }) => {
        const a = await provider.allocateNextENI(owner(1), any);
        await provider.deallocateENI(owner(1));
        const b = await provider.allocateNextENI(owner(2), { ips: [a.ipv4!.address], ranges: [] });
        assertEquals(b.id, a.id);
        const err = await provider.allocateNextENI(owner(3), { ips: ["192.0.2.77"], ranges: [] })
          .then((e) => e, (e) => e);
        if (err instanceof ProviderError) assertEquals(err.reason, "requested_ip_unavailable");
        else assertEquals(err.ipv4?.address, "192.0.2.77");
      }),
  );

  await t.step(
    "exhaustion fails with no_eni_available",
    () =>
      withSubject(async ({ provider, capacity }) => {
        for (let i = 0; i < capacity; i++) await provider.allocateNextENI(owner(i), any);
        const err = await provider.allocateNextENI(owner(capacity), any).then(
          () => null,
          (e) => e,
        );
        assert(err instanceof ProviderError, `expected a ProviderError, got ${err}`);
        assertEquals(err.reason, "no_eni_available");
        const st = await provider.status();
        assertEquals(st.owned, capacity);
        assertEquals(st.attachable, 0);
      }),
  );
}
