import { DatabaseSync } from "node:sqlite";
import { providerContractSuite } from "../../tests/support/provider_contract.ts";
import mock, { MockConfigSchema, type MockProvider, nthAddress } from "./mod.ts";
import { type Eni, ProviderError, type SimulatedGroupRule } from "../contract.ts";
import { nullLogger } from "../../lib/log.ts";
import { openDatabase } from "../../lib/sqlite.ts";
import { assert, assertEquals } from "../../lib/assert.ts";

async function makeMock(config: unknown, db = new DatabaseSync(":memory:"), sim?: SimLog) {
  const provider = await mock.create(MockConfigSchema.parse(config), {
    db,
    log: nullLogger,
    deviceSimulator: sim,
  }) as MockProvider;
  return { provider, db };
}

class SimLog {
  plugged = new Set<string>();
  calls: string[] = [];
  plug(eni: Eni) {
    this.calls.push(`plug ${eni.id}`);
    this.plugged.add(eni.mac);
    return Promise.resolve();
  }
  unplug(eni: Eni) {
    this.calls.push(`unplug ${eni.id}`);
    this.plugged.delete(eni.mac);
    return Promise.resolve();
  }
  setSecurityGroups(eni: Eni) {
    this.calls.push(
      `groups ${eni.id} ${[...eni.securityGroupIds, ...eni.enterpriseSecurityGroupIds]}`,
    );
    return Promise.resolve();
  }
  setSecurityGroupRules(rules: SimulatedGroupRule[]) {
    this.calls.push(`rules ${rules.map((r) => `${r.group}<${r.from}:${r.protocol}/${r.port}`)}`);
    return Promise.resolve();
  }
}

for (
  const [name, config] of [
    ["all preattached", { enis: 6 }],
    ["attached on demand", { enis: 6, preattached: 0, attachLatencyMs: 2 }],
    ["dual stack, node limit", {
      enis: 10,
      maxEnisPerNode: 5,
      preattached: 2,
      subnets: { ipv4: { cidr: "10.1.0.0/28" }, ipv6: { cidr: "fd00:1::/64" } },
    }],
    ["IPv6 only", { enis: 5, subnets: { ipv6: { cidr: "fd00:2::/120", gateway: "fd00:2::fe" } } }],
  ] as const
) {
  Deno.test(`mock provider (${name}) meets the provider contract`, (t) =>
    providerContractSuite(t, async () => {
      const { provider, db } = await makeMock(config);
      return {
        provider,
        cleanup: async () => {
          await provider.close();
          db.close();
        },
      };
    }));
}

Deno.test("mock config applies its defaults", () => {
  const c = MockConfigSchema.parse({});
  assertEquals(c.enis, 8);
  assertEquals(c.subnets, { ipv4: { cidr: "10.99.0.0/24" } });
  assertEquals(c.macPrefix, "02:e1:0a");
  assert(!MockConfigSchema.safeParse({ enis: 2, typo: 1 }).success, "Unknown keys are refused");
  assert(!MockConfigSchema.safeParse({ macPrefix: "zz" }).success);
});

Deno.test("nthAddress() counts hosts in IPv4 and IPv6 subnets", () => {
  assertEquals(nthAddress("10.99.0.0/24", 1), "10.99.0.1");
  assertEquals(nthAddress("10.99.0.7/24", 2), "10.99.0.2");
  assertEquals(nthAddress("fd00::/64", 257), "fd00::101");
});

Deno.test("mock ENIs have ids, MACs, addresses and the subnet gateway", async () => {
  const { provider, db } = await makeMock({ enis: 3 });
  try {
    const enis = await provider.list();
    assertEquals(enis.map((e) => e.id), ["eni-mock-0001", "eni-mock-0002", "eni-mock-0003"]);
    assertEquals(enis[0].mac, "02:e1:0a:00:00:01");
    assertEquals(enis[0].ipv4, { address: "10.99.0.2", prefixLength: 24, gateway: "10.99.0.1" });
    assertEquals(enis[0].ipv6, null);
    assertEquals(await provider.status(), {
      name: "mock",
      free: 3,
      owned: 0,
      attachable: 0,
      details: { inventory: 3, maxEnisPerNode: 3, attaching: 0 },
      profiles: { default: { free: 3, owned: 0 } },
    });
  } finally {
    await provider.close();
    db.close();
  }
});

Deno.test("mock state survives a restart on the same database file", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const cfg = { enis: 4, preattached: 1 };
    let db = openDatabase(`${dir}/state.db`);
    let { provider } = await makeMock(cfg, db);
    const o = { pod: "ns/a", containerId: "c1", ifName: "eth0" };
    const e = await provider.allocateNextENI(o, { ips: [], ranges: [] });
    await provider.allocateNextENI({ ...o, containerId: "c2" }, { ips: [], ranges: [] });
    await provider.close();
    db.close();
    db = openDatabase(`${dir}/state.db`);
    ({ provider } = await makeMock(cfg, db));
    const enis = await provider.list();
    assertEquals(enis.length, 2, "the attached ENIs stay attached, preattached is not reapplied");
    assertEquals(enis.find((x) => x.id === e.id)?.owner, o);
    await provider.close();
    db.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("mock plugs attached ENIs into the device simulator and unplugs on detach", async () => {
  const sim = new SimLog();
  const { provider, db } = await makeMock({ enis: 4, preattached: 2 }, undefined, sim);
  try {
    assertEquals(sim.calls, ["plug eni-mock-0001", "plug eni-mock-0002"]);
    const o = (i: number) => ({ pod: "ns/a", containerId: `c${i}`, ifName: "eth0" });
    for (let i = 0; i < 3; i++) await provider.allocateNextENI(o(i), { ips: [], ranges: [] });
    assertEquals(sim.calls.at(-1), "plug eni-mock-0003");
    await provider.deallocateENI(o(2));
    await provider.detach("eni-mock-0003");
    assertEquals(sim.calls.at(-1), "unplug eni-mock-0003");
    assertEquals(sim.plugged.size, 2);
  } finally {
    await provider.close();
    db.close();
  }
});

Deno.test("mock gives the simulated VPC its group rules, and an ENI's groups when a pod's inline ones replace them and when they come back", async () => {
  const sim = new SimLog();
  const { provider, db } = await makeMock(
    {
      enis: 2,
      securityGroupIds: ["g-api"],
      securityGroupRules: [{ group: "g-db", from: "g-web", protocol: "tcp", port: 5432 }],
    },
    undefined,
    sim,
  );
  try {
    assertEquals(sim.calls, [
      "rules g-db<g-web:tcp/5432",
      "plug eni-mock-0001",
      "plug eni-mock-0002",
    ]);
    const o = (i: number) => ({ pod: "ns/a", containerId: `c${i}`, ifName: "eth0" });
    // The profile's own groups: the port has them already.
    await provider.allocateNextENI(o(1), { ips: [], ranges: [] });
    await provider.deallocateENI(o(1));
    assertEquals(sim.calls.length, 3);
    await provider.allocateNextENI(o(2), { ips: [], ranges: [], securityGroupIds: ["g-web"] });
    assertEquals(sim.calls.at(-1), "groups eni-mock-0001 g-web");
    await provider.deallocateENI(o(2));
    assertEquals(sim.calls.at(-1), "groups eni-mock-0001 g-api");
    assertEquals(sim.calls.length, 5);
  } finally {
    await provider.close();
    db.close();
  }
});

Deno.test("mock config takes security group rules of a group id or a CIDR, TCP or UDP", () => {
  const ok = (r: unknown) => MockConfigSchema.safeParse({ securityGroupRules: [r] }).success;
  assert(ok({ group: "g-db", from: "g-web", protocol: "tcp", port: 5432 }));
  assert(ok({ group: "g-db", from: "10.0.0.0/8", protocol: "udp", port: 53 }));
  assert(!ok({ group: "g-db", from: "web", protocol: "tcp", port: 5432 }));
  assert(!ok({ group: "g-db", from: "g-web", protocol: "icmp", port: 1 }));
  assert(!ok({ group: "g-db", from: "g-web", protocol: "tcp", port: 0 }));
  assertEquals(MockConfigSchema.parse({}).securityGroupRules, []);
});

Deno.test("mock failure injection is seeded and reproducible", async () => {
  const run = async () => {
    const { provider, db } = await makeMock({
      enis: 50,
      errorRate: 0.2,
      throttleRate: 0.2,
      seed: 42,
    });
    const out: string[] = [];
    for (let i = 0; i < 30; i++) {
      try {
        const e = await provider.allocateNextENI(
          { pod: "ns/p", containerId: `c${i}`, ifName: "eth0" },
          { ips: [], ranges: [] },
        );
        out.push(e.id);
      } catch (err) {
        assert(err instanceof ProviderError);
        out.push(err.reason);
      }
    }
    await provider.close();
    db.close();
    return out;
  };
  const a = await run();
  assertEquals(await run(), a);
  assert(
    a.includes("throttled") && a.includes("unavailable") && a.some((x) => x.startsWith("eni-")),
  );
});

Deno.test("mock never gives an ENI being attached to anyone else", async () => {
  const { provider, db } = await makeMock({ enis: 2, preattached: 0, attachLatencyMs: 5 });
  try {
    const a = { pod: "ns/a", containerId: "a", ifName: "eth0" };
    const pa = provider.allocateNextENI(a, { ips: [], ranges: [] });
    const [b, c] = await Promise.all([
      provider.allocateNextENI({ ...a, containerId: "b" }, { ips: [], ranges: [] }),
      provider.allocateNextENI({ ...a, containerId: "c" }, { ips: [], ranges: [] }).catch((e) => e),
    ]);
    const ea = await pa;
    assert(ea.id !== b.id);
    assert(c instanceof ProviderError && c.reason === "no_eni_available");
    // A deallocate while attaching: the ENI ends free, the allocate reports it.
    await provider.deallocateENI(a);
    await provider.deallocateENI({ ...a, containerId: "b" });
    assertEquals((await provider.status()).free, 2);
  } finally {
    await provider.close();
    db.close();
  }
});

Deno.test("the mock's capacity follows the cloud's quota and the ENIs that are not enim's", async () => {
  const { provider, db } = await makeMock({ enis: 8, maxEnisPerNode: 4, preattached: 0 });
  try {
    assertEquals(await provider.capacity(), {
      limit: 4,
      forPods: 4,
      unavailable: [],
      source: "config",
    });
    provider.setNode({ maxEnis: 6 });
    assertEquals((await provider.capacity()).forPods, 6);
    assertEquals((await provider.status()).attachable, 6);
    // Another program attaches an ENI: it takes a slot pods cannot have.
    provider.setNode({ foreignEnis: 1 });
    assertEquals(await provider.capacity(), {
      limit: 6,
      forPods: 5,
      unavailable: [{ reason: "foreign", count: 1 }],
      source: "cloud",
    });
    for (let i = 0; i < 5; i++) {
      await provider.allocateNextENI({ pod: `ns/p${i}`, containerId: `c${i}`, ifName: "eth0" }, {});
    }
    const full = await provider.allocateNextENI(
      { pod: "ns/p5", containerId: "c5", ifName: "eth0" },
      {},
    ).then(() => null, (e: unknown) => e);
    assert(full instanceof ProviderError);
    assertEquals(full.reason, "no_eni_available");
    assertEquals(
      full.message,
      'No ENI available for profile "default": 0 free, 5 of 6 attached and 1 not enim\'s',
    );
    assertEquals((await provider.status()).details.otherAttached, 1);
  } finally {
    await provider.close();
    db.close();
  }
});

Deno.test("an unreachable mock cloud fails allocate, deallocate and capacity, and answers when back", async () => {
  const { provider, db } = await makeMock({ enis: 2 });
  const o = { pod: "ns/p", containerId: "c", ifName: "eth0" };
  try {
    provider.setNode({ unreachable: "injected outage" });
    for (
      const call of [
        (): Promise<unknown> => provider.capacity(),
        () => provider.allocateNextENI(o, {}),
        () => provider.deallocateENI(o),
      ]
    ) {
      const err = await Promise.resolve().then(call).then(() => null, (e: unknown) => e);
      assert(err instanceof ProviderError, String(err));
      assertEquals(err.reason, "unavailable");
      assert(
        /^The mock cloud did not answer "\w+": injected outage$/.test(err.message),
        err.message,
      );
    }
    assertEquals((await provider.status()).free, 2, "the pool counts are local");
    provider.setNode({ unreachable: null });
    assertEquals((await provider.capacity()).forPods, 2);
  } finally {
    await provider.close();
    db.close();
  }
});
