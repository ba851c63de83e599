/**
 * The manager's side of bandwidth limits, on the fake device layer: the ADD passes
 * them to the plug and records what was installed, CHECK compares the pod's shaping
 * with that record, DEL and GC take the ifb away with the device.
 */
import { add, addReq, delReq, type Node, withNode } from "../tests/support/manager_fixtures.ts";
import { ApiError, CheckRequestSchema } from "../api/schema.ts";
import { assert, assertEquals, assertRejects, assertStringIncludes } from "../lib/assert.ts";

const LIMITS = { ingress: { rate: 10_000_000 }, egress: { rate: 20_000_000, burst: 80_000 } };

function checkReq(i: number, res: { mac: string; ips: { address: string }[] }) {
  return CheckRequestSchema.parse({
    containerId: `c${i}`,
    ifName: "eth0",
    netns: `/run/netns/p${i}`,
    network: "enim",
    mode: "interface",
    expected: { mac: res.mac, addresses: res.ips.map((ip) => ip.address) },
  });
}

async function rejectsWith(fn: () => Promise<unknown>, code: string): Promise<ApiError> {
  const e = await assertRejects(fn);
  assert(e instanceof ApiError, `Expected an ApiError, got ${e}`);
  assertEquals(e.code, code, e.message);
  return e;
}

const unplugs = (n: Node) =>
  n.devices.calls.filter((c) => c.op === "unplug").map((c) => c.args as Record<string, unknown>);

Deno.test("add() shapes the pod's ENI and records the shaping installed, bursts resolved", () =>
  withNode(async (n) => {
    const res = await add(n, 1, { bandwidth: LIMITS });
    // 25 ms of 10 Mbit/s is 250 000 bits; the explicit burst is kept.
    const installed = {
      ingress: { rate: 10_000_000, burst: 250_000 },
      egress: { rate: 20_000_000, burst: 80_000 },
    };
    assertEquals(res.bandwidth, installed);
    const plug = n.devices.calls.find((c) => c.op === "plug")!.args as Record<string, unknown>;
    assertEquals(plug.bandwidth, LIMITS);
    // A retried ADD answers the same record.
    assertEquals((await n.mgr.add(addReq(1, { bandwidth: LIMITS }))).bandwidth, installed);
    // Without limits nothing is shaped or recorded.
    assertEquals((await add(n, 2)).bandwidth, undefined);
  }));

Deno.test("check() passes while the shaping holds and names what changed", () =>
  withNode(async (n) => {
    const res = await add(n, 1, { bandwidth: LIMITS });
    await n.mgr.check(checkReq(1, res));
    n.devices.editPodLink("/run/netns/p1", "eth0", (l) => {
      l.shaping = { ...l.shaping, egress: { rate: 1_000_000, burst: 80_000 } };
    });
    const e = await rejectsWith(() => n.mgr.check(checkReq(1, res)), "check_failed");
    assertStringIncludes(e.message, "egress shaping at 1000000 bit/s, not 20000000 bit/s");
    n.devices.editPodLink("/run/netns/p1", "eth0", (l) => delete l.shaping);
    const gone = await rejectsWith(() => n.mgr.check(checkReq(1, res)), "check_failed");
    assertStringIncludes(gone.message, "lacks its egress shaping");
  }));

Deno.test("del() takes the ifb of a shaped ingress away with the device", () =>
  withNode(async (n) => {
    await add(n, 1, { bandwidth: LIMITS });
    await add(n, 2, { bandwidth: { egress: { rate: 1_000_000 } } });
    await n.mgr.del(delReq(1));
    await n.mgr.del(delReq(2));
    // Both answered before their device's move home: what the moves took, once done.
    await n.mgr.settled();
    assertEquals(unplugs(n).map((u) => u.shapedIngress), [true, false]);
    assertEquals((await n.owned()).size, 0);
  }));

Deno.test("add() refuses limits in IPAM mode before anything is allocated", () =>
  withNode(async (n) => {
    const e = await rejectsWith(
      () => n.mgr.add(addReq(1, { mode: "ipam", netns: "/dev/null", bandwidth: LIMITS })),
      "bad_request",
    );
    assertStringIncludes(e.message, "interface mode");
    assertEquals(n.mgr.state.all(), []);
    assertEquals((await n.owned()).size, 0);
  }));
