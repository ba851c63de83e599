import { assertEquals } from "../../lib/assert.ts";
import { advertise, type HealthInputs, readCapacity } from "./devices.ts";

const base: HealthInputs = {
  capacity: { limit: 4, forPods: 4, unavailable: [], source: "test" },
  failing: null,
  ready: true,
  nowMs: 100_000,
  unreachableAfterMs: 60_000,
};
const health = (h: HealthInputs) =>
  advertise(h).devices.map((d) => `${d.ID}:${d.health[0]}`).join(" ");

Deno.test("advertise() gives one device per slot, Healthy as many as pods can get", async (t) => {
  await t.step("all free", () => assertEquals(health(base), "eni-0:H eni-1:H eni-2:H eni-3:H"));
  await t.step("foreign and quarantined ENIs hold the last slots", () => {
    const a = advertise({
      ...base,
      capacity: {
        limit: 4,
        forPods: 1,
        unavailable: [
          { reason: "foreign", count: 2, eniIds: ["eni-x", "eni-y"] },
          { reason: "quarantined", count: 1, eniIds: ["eni-q"] },
        ],
        source: "test",
      },
    });
    assertEquals(a.devices.map((d) => d.health), [
      "Healthy",
      "Unhealthy",
      "Unhealthy",
      "Unhealthy",
    ]);
    assertEquals(a.unhealthy.map((u) => [u.reason, u.devices, u.message]), [
      [
        "foreign",
        2,
        '2 slots of the node\'s ENI limit taken by 2 ENIs enim does not own ("eni-x", "eni-y")',
      ],
      ["quarantined", 1, '1 ENI stuck attaching or detaching, quarantined ("eni-q")'],
    ]);
  });
  await t.step("more held than the limit: none Healthy, counts clamped", () => {
    const a = advertise({
      ...base,
      capacity: {
        limit: 2,
        forPods: 0,
        unavailable: [{ reason: "foreign", count: 3, eniIds: [] }],
        source: "test",
      },
    });
    assertEquals([a.healthy, a.unhealthy.map((u) => u.devices)], [0, [2]]);
  });
  await t.step("the provider failing for less than the threshold changes nothing", () => {
    assertEquals(
      health({ ...base, failing: { sinceMs: 50_000, message: "down" } }),
      "eni-0:H eni-1:H eni-2:H eni-3:H",
    );
  });
  await t.step("past the threshold every device is Unhealthy, saying for how long", () => {
    const a = advertise({ ...base, failing: { sinceMs: 30_000, message: "down" } });
    assertEquals(a.healthy, 0);
    assertEquals(a.unhealthy, [{
      reason: "provider_unreachable",
      devices: 4,
      message: "The provider has not answered for 70 s: down",
    }]);
  });
  await t.step("an agent that is not ready: every device Unhealthy", () => {
    assertEquals(health({ ...base, ready: false }), "eni-0:U eni-1:U eni-2:U eni-3:U");
  });
  await t.step("no capacity yet: no devices, and why", () => {
    const a = advertise({ ...base, capacity: null, failing: { sinceMs: 0, message: "down" } });
    assertEquals([a.devices, a.limit], [[], null]);
    assertEquals(a.note, "The provider has not told the node's ENI capacity yet: down");
  });
});

Deno.test("readCapacity() without capacity() counts what status() says the pool has and can attach", async () => {
  const provider = {
    status: () =>
      Promise.resolve({ name: "x", free: 2, owned: 3, attachable: 1, details: {}, profiles: {} }),
  };
  assertEquals(await readCapacity(provider), {
    limit: 6,
    forPods: 6,
    unavailable: [],
    source: "status",
  });
});
