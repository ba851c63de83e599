/**
 * The manager's side of zone-wide sticky pods (issue 26), over the mock with a
 * provider wrapper that reports zone scope and records parks: when a DEL parks
 * at once, when it holds the ENI on the node first, when the GC parks it after
 * the node hold, and that nothing else changes.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { NODE } from "../netns/fake.ts";
import { add, delReq, type NodeOptions, withNode } from "../tests/support/manager_fixtures.ts";

const HOLD = 120_000;
const pod = { namespace: "default", name: "db-0" };
const zone = (nodeHoldSeconds: number): NodeOptions => ({
  stickyHoldMs: HOLD,
  zone: { nodeHoldSeconds },
});

Deno.test("a zone-sticky pod's ADD asks the provider for its sticky ENI; a plain pod's does not", () =>
  withNode(async (n) => {
    await add(n, "a1", { pod, sticky: true });
    await add(n, "p1", {});
    assertEquals(n.provider.requests.map((r) => r.sticky ?? false), [true, false]);
  }, zone(0)));

Deno.test("with no node hold, a zone-sticky pod's DEL parks its ENI until the hold's end and leaves no record", () =>
  withNode(async (n) => {
    const first = await add(n, "a1", { pod, sticky: true });
    const t0 = n.clock.now();
    await n.mgr.del(delReq("a1"));
    assertEquals(n.provider.parks.map((p) => [p.owner.pod, p.owner.containerId, p.until]), [[
      "default/db-0",
      "ca1",
      t0 + HOLD,
    ]]);
    assertEquals(n.mgr.state.all(), [], "nothing held on this node");
    assertEquals(n.devices.where(first.mac)?.ns, NODE, "the device came home before the park");
    await n.mgr.del(delReq("a1")); // a retried DEL parks nothing more
    assertEquals(n.provider.parks.length, 1);
  }, zone(0)));

Deno.test("with a node hold, the DEL holds the ENI on the node (a re-create there is instant) and GC parks it when the node hold ends", () =>
  withNode(async (n) => {
    const first = await add(n, "a1", { pod, sticky: true });
    const t0 = n.clock.now();
    await n.mgr.del(delReq("a1"));
    const row = n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })!;
    assertEquals([row.state, row.holdUntil, row.parkUntil], ["held", t0 + 30_000, t0 + HOLD]);
    assertEquals(n.provider.parks.length, 0);
    // Re-created on this node within the node hold: the same ENI, no park.
    const back = await add(n, "a2", { pod, sticky: true });
    assertEquals(back.eniId, first.eniId);
    assertEquals(n.provider.parks.length, 0);

    await n.mgr.del(delReq("a2"));
    n.devices.deleteNetns("/run/netns/pa2");
    n.clock.advance(20_000);
    assertEquals((await n.mgr.gc({ dryRun: false })).items, [], "inside the node hold");
    n.clock.advance(11_000);
    const plan = await n.mgr.gc({ dryRun: true });
    assertEquals(plan.items.map((i) => [i.kind, i.eniId]), [["park", first.eniId]]);
    assert(plan.items[0].action.endsWith(`park ${first.eniId} in the VPC`), plan.items[0].action);
    const report = await n.mgr.gc({ dryRun: false });
    assertEquals(report.items.map((i) => [i.kind, i.outcome]), [["park", "reclaimed"]]);
    // The park lasts until the hold's end, counted from the DEL.
    assertEquals(n.provider.parks.map((p) => [p.owner.containerId, p.until]), [["ca2", t0 + HOLD]]);
    assertEquals(n.mgr.state.all(), []);
  }, zone(30)));

Deno.test("a held ENI whose whole hold ended while the agent was away is freed, not parked", () =>
  withNode(async (n) => {
    await add(n, "a1", { pod, sticky: true });
    await n.mgr.del(delReq("a1"));
    n.clock.advance(HOLD + 1);
    const report = await n.mgr.gc({ dryRun: false });
    assertEquals(report.items.map((i) => [i.kind, i.outcome]), [["hold", "reclaimed"]]);
    assertEquals(n.provider.parks.length, 0);
    assertEquals((await n.owned()).size, 0);
  }, zone(30)));

Deno.test("a plain pod of a zone profile is released exactly as before: no hold, no park", () =>
  withNode(async (n) => {
    const p = await add(n, "p1", {});
    await n.mgr.del(delReq("p1"));
    await n.mgr.settled();
    assertEquals(n.provider.parks.length, 0);
    assertEquals(n.mgr.state.all(), []);
    assert(!(await n.owned()).has(p.eniId));
  }, zone(0)));

Deno.test("a node-scope profile keeps today's holds: the DEL holds, the GC frees", () =>
  withNode(async (n) => {
    await add(n, "a1", { pod, sticky: true });
    await n.mgr.del(delReq("a1"));
    assertEquals(n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })?.parkUntil, null);
    n.clock.advance(HOLD + 1);
    const report = await n.mgr.gc({ dryRun: false });
    assertEquals(report.items.map((i) => i.kind), ["hold"]);
    assertEquals(n.provider.parks.length, 0);
  }, { stickyHoldMs: HOLD }));

Deno.test("a zone-sticky pod's failed ADD parks its ENI for it again: never pooled for another pod", () =>
  withNode(async (n) => {
    n.devices.failOn("plug");
    const t0 = n.clock.now();
    const err = await add(n, "a1", { pod, sticky: true }).then(() => null, (e) => e);
    assertEquals(err?.code, "device_error");
    assertEquals(n.provider.parks.map((p) => [p.owner.containerId, p.until]), [["ca1", t0 + HOLD]]);
    assertEquals(n.mgr.state.all(), []);
    // A plain pod's failed ADD frees its ENI as before.
    n.devices.failOn("plug");
    await add(n, "p1", {}).then(() => null, (e) => e);
    assertEquals(n.provider.parks.length, 1);
  }, zone(0)));

Deno.test("a zone-sticky pod's DEL left half done is finished by parking its ENI at restart", () =>
  withNode(async (n) => {
    // A DEL left half done (the device could not be moved home): the restart's
    // reconcile finishes it with a park, not a free.
    await add(n, "a1", { pod, sticky: true });
    n.devices.failOn("unplug");
    await n.mgr.del(delReq("a1")).catch(() => {});
    assertEquals(n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })?.state, "deleting");
    await n.restart();
    const rep = await n.mgr.reconcile();
    assertEquals(rep.finished, 1);
    assertEquals(n.provider.parks.map((p) => p.owner.containerId), ["ca1"]);
    assertEquals(n.mgr.state.all(), []);
  }, zone(0)));
