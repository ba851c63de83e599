/**
 * Seeded crash test in process: random ADD/DEL operations, each possibly
 * "killed" at a random step (the step never returns), then a restart on the
 * same database file and reconcile; the invariants are checked after each.
 */
import { addReq, delReq, makeNode, type Node, settle } from "../tests/support/manager_fixtures.ts";
import type { FakeStep } from "../netns/fake.ts";
import { NODE } from "../netns/fake.ts";
import type { ProviderHang } from "../tests/support/manager_fixtures.ts";
import { mulberry32 } from "../lib/rng.ts";
import { assert, assertEquals } from "../lib/assert.ts";

const DEVICE_POINTS: FakeStep[] = [
  "netnsIdentity",
  "findByMac",
  "plug",
  "plug:after-move",
  "unplug",
];
const PROVIDER_POINTS: Exclude<ProviderHang, null>[] = [
  "before-allocate",
  "after-allocate",
  "after-deallocate",
];

async function assertInvariants(n: Node, confirmed: Map<string, string>, label: string) {
  const rows = n.mgr.state.all();
  const owned = await n.owned();
  const seen = new Set<string>();
  for (const r of rows) {
    const k = `${r.containerId}/${r.ifName}`;
    assert(r.state === "ready" || r.state === "recycling", `${label}: ${k} left ${r.state}`);
    assertEquals(owned.get(r.eniId!), k, `${label}: ENI of ${k}`);
    assert(!seen.has(r.eniId!), `${label}: ${r.eniId} recorded twice`);
    seen.add(r.eniId!);
    assertEquals(n.devices.where(r.mac!)?.ns, r.netns, `${label}: device of ${k}`);
  }
  assertEquals(owned.size, rows.length, `${label}: every owned ENI has one live attachment`);
  for (const e of await n.mock.list()) {
    if (!e.owner) assertEquals(n.devices.where(e.mac)?.ns, NODE, `${label}: free ${e.id} on node`);
  }
  for (const [k, eni] of confirmed) {
    const r = rows.find((x) => `${x.containerId}/${x.ifName}` === k);
    assertEquals(r?.eniId, eni, `${label}: confirmed attachment ${k} lost`);
  }
}

Deno.test("reconcile() restores the invariants after crashes at 60 seeded random points", async () => {
  const seed = Number(Deno.env.get("ENIM_CRASH_SEED") ?? 20261122);
  const rand = mulberry32(seed);
  const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)];
  const n = await makeNode({ mock: { enis: 6, preattached: 3 } });
  try {
    /** Attachments the client was told succeeded and has not asked to delete: key → ENI. */
    const confirmed = new Map<string, string>();
    let crashes = 0;
    let repaired = 0;
    for (let step = 0; crashes < 60; step++) {
      const live = n.mgr.state.all().map((r) => r.containerId);
      const op = live.length > 0 && rand() < 0.45 ? "del" : "add";
      const id = op === "del" ? pick(live).slice(1) : String(step);
      const crash = rand() < 0.8;
      if (crash) {
        if (rand() < 0.5) n.devices.hangOn(pick(DEVICE_POINTS));
        else n.provider.hang = pick(PROVIDER_POINTS);
      }
      const key = `c${id}/eth0`;
      if (op === "del") confirmed.delete(key); // once DEL is sent, the client no longer relies on it
      let done = false;
      const p = op === "add"
        ? (n.devices.snapshot()[`/run/netns/p${id}`] || n.devices.addNetns(`/run/netns/p${id}`),
          n.mgr.add(addReq(id)).then((r) => {
            confirmed.set(key, r.eniId);
          }))
        : n.mgr.del(delReq(id));
      p.then(() => (done = true), () => (done = true));
      for (let i = 0; i < 5; i++) await settle();
      const label = `seed ${seed} step ${step} ${op} ${key}`;
      if (crash) {
        crashes++;
        await n.restart();
        const rep = await n.mgr.reconcile();
        assertEquals(rep.errors, [], label);
        repaired += rep.rolledBack + rep.finished + rep.orphansFreed;
      } else {
        assert(done, `${label}: operation did not finish`);
      }
      await assertInvariants(n, confirmed, label);
    }
    assert(
      repaired >= 20,
      `Only ${repaired} half-done operations were repaired: the crash points miss`,
    );
  } finally {
    await n.close();
  }
});
