import {
  add,
  addReq,
  type Node,
  type NodeOptions,
  withNode,
} from "../tests/support/manager_fixtures.ts";
import { NODE } from "../netns/fake.ts";
import type { LivenessSource } from "./gc.ts";
import { GcReportSchema } from "../api/schema.ts";
import { keyOf } from "../providers/schema.ts";
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { Logger } from "../lib/log.ts";

const GRACE = 60_000;

const withDefaults = (fn: (n: Node) => Promise<void>, opts: NodeOptions = {}) =>
  withNode(fn, { graceMs: GRACE, mock: { enis: 8 }, ...opts });

/** State, devices and provider, for before/after comparisons. */
async function snapshot(n: Node) {
  return {
    state: n.mgr.state.dump(),
    devices: n.devices.snapshot(),
    provider: await n.mock.list(),
    mockTable: n.db.prepare("SELECT * FROM mock_enis ORDER BY id").all(),
  };
}

/** Three dead attachments (netns gone, netns replaced, recycled past grace) and two live ones. */
async function threeDeadTwoLive(n: Node) {
  const gone = await add(n, "gone");
  const replaced = await add(n, "replaced");
  const old = await add(n, "web", { containerId: "web-old", netns: "/run/netns/web-old" });
  await add(n, "live1");
  n.clock.advance(1000);
  await add(n, "web", { containerId: "web-new", netns: "/run/netns/web-new" });
  n.devices.deleteNetns("/run/netns/pgone");
  n.devices.replaceNetns("/run/netns/preplaced");
  n.clock.advance(GRACE + 1);
  return { gone, replaced, old };
}

Deno.test("gc() dry run lists exactly the dead attachments and changes nothing", () =>
  withDefaults(async (n) => {
    const { gone, replaced, old } = await threeDeadTwoLive(n);
    const before = await snapshot(n);
    const callsBefore = n.devices.calls.length;
    const rep = GcReportSchema.parse(await n.mgr.gc({ dryRun: true }));
    assertEquals(rep.dryRun, true);
    const byC = new Map(rep.items.map((i) => [i.containerId, i]));
    assertEquals([...byC.keys()].sort(), ["cgone", "creplaced", "web-old"]);
    for (const i of rep.items) assertEquals(i.outcome, "planned");
    assertStringIncludes(byC.get("cgone")!.reason, "no longer exists");
    assertStringIncludes(byC.get("creplaced")!.reason, "was replaced");
    assertStringIncludes(byC.get("web-old")!.reason, "newer container");
    assertEquals(byC.get("cgone")!.eniId, gone.eniId);
    assertEquals(byC.get("cgone")!.device, gone.nodeName);
    assertEquals(byC.get("creplaced")!.mac, replaced.mac);
    assertStringIncludes(byC.get("web-old")!.action, 'move "eth0" from /run/netns/web-old');
    assertStringIncludes(byC.get("cgone")!.action, `find ${gone.mac} on the node`);
    assertEquals(byC.get("web-old")!.pod, "default/pod-web");
    assertEquals(byC.get("web-old")!.eniId, old.eniId);
    assertEquals(await snapshot(n), before, "state, devices and provider untouched");
    const ops = new Set(n.devices.calls.slice(callsBefore).map((c) => c.op));
    assert(
      [...ops].every((op) => op === "netnsIdentity" || op === "findByMac"),
      `Only reads: ${[...ops]}`,
    );
  }));

Deno.test("gc() reclaims the dead attachments and leaves the live ones", () =>
  withDefaults(async (n) => {
    const { gone, replaced, old } = await threeDeadTwoLive(n);
    const rep = await n.mgr.gc({ dryRun: false });
    assertEquals(rep.items.map((i) => [i.containerId, i.outcome]).sort(), [
      ["cgone", "reclaimed"],
      ["creplaced", "reclaimed"],
      ["web-old", "reclaimed"],
    ]);
    assertEquals(n.mgr.attachments().map((a) => a.containerId).sort(), ["clive1", "web-new"]);
    const owned = await n.owned();
    assertEquals([...owned.values()].sort(), ["clive1/eth0", "web-new/eth0"]);
    for (const r of [gone, replaced, old]) {
      const w = n.devices.where(r.mac)!;
      assertEquals([w.ns, w.link.ifname, w.link.up, w.link.addresses], [
        NODE,
        r.nodeName,
        false,
        [],
      ]);
    }
    // A second pass finds nothing.
    assertEquals((await n.mgr.gc({ dryRun: false })).items, []);
  }));

Deno.test("gc() reclaims a netns recreated at the same path even when the kernel reused its inode", () =>
  withDefaults(async (n) => {
    const reused = await add(n, "reused");
    const live = await add(n, "live");
    const before = n.devices.snapshot()["/run/netns/preused"].identity;
    const after = n.devices.replaceNetns("/run/netns/preused", { reuseInode: true });
    assertEquals(after, before, "the recreated namespace shows the recorded identity");
    n.clock.advance(GRACE);
    const rep = await n.mgr.gc({ dryRun: false });
    assertEquals(rep.items.map((i) => [i.containerId, i.outcome]), [["creused", "reclaimed"]]);
    assertStringIncludes(rep.items[0].reason, "no longer holds the ENI's device");
    const w = n.devices.where(reused.mac)!;
    assertEquals([w.ns, w.link.ifname, w.link.up, w.link.addresses], [
      NODE,
      reused.nodeName,
      false,
      [],
    ]);
    assertEquals(n.devices.where(live.mac)?.ns, "/run/netns/plive");
    assertEquals(n.mgr.attachments().map((a) => a.containerId), ["clive"]);
  }));

Deno.test("gc() keeps a pod whose interface a chained plugin gave another MAC", () =>
  withDefaults(async (n) => {
    const tuned = await add(n, "tuned");
    n.devices.editPodLink("/run/netns/ptuned", "eth0", (l) => l.mac = "02:00:00:00:00:99");
    n.clock.advance(GRACE);
    assertEquals((await n.mgr.gc({ dryRun: false })).items, []);
    assertEquals(n.mgr.attachments().map((a) => [a.containerId, a.eniId]), [[
      "ctuned",
      tuned.eniId,
    ]]);
  }));

Deno.test("gc() renames and scrubs a vanished device the provider brings back under another name", () =>
  withDefaults(async (n) => {
    const dead = await add(n, "dead");
    // A veth dies with its namespace; the provider's repair plugs it back as sim<N>.
    n.devices.removeLink(dead.mac);
    n.devices.deleteNetns("/run/netns/pdead");
    n.clock.advance(GRACE);
    const rep = await n.mgr.gc({ dryRun: false });
    assertEquals(rep.items.map((i) => [i.containerId, i.outcome]), [["cdead", "reclaimed"]]);
    const w = n.devices.where(dead.mac)!;
    assertEquals([w.ns, w.link.ifname, w.link.up, w.link.addresses], [
      NODE,
      dead.nodeName,
      false,
      [],
    ]);
    assertEquals((await n.owned()).size, 0);
  }));

Deno.test("gc() never reclaims inside the grace period", () =>
  withDefaults(async (n) => {
    await add(n, 1);
    await add(n, "web", { containerId: "web-old", netns: "/run/netns/web-old" });
    await add(n, "web", { containerId: "web-new", netns: "/run/netns/web-new" });
    n.devices.deleteNetns("/run/netns/p1");
    n.clock.advance(GRACE - 1);
    assertEquals((await n.mgr.gc({ dryRun: false })).items, []);
    assertEquals(n.mgr.attachments().length, 3);
    n.clock.advance(1);
    const rep = await n.mgr.gc({ dryRun: false });
    assertEquals(rep.items.map((i) => i.containerId).sort(), ["c1", "web-old"]);
  }));

Deno.test("gc() for a CNI GC call reclaims exactly the attachments not listed", () =>
  withDefaults(async (n) => {
    for (const i of [1, 2, 3]) await add(n, i);
    await add(n, 4, { network: "other" });
    n.clock.advance(GRACE);
    const rep = await n.mgr.gc({
      dryRun: false,
      network: "enim",
      validAttachments: [{ containerId: "c2", ifName: "eth0" }],
    });
    assertEquals(rep.items.map((i) => i.containerId).sort(), ["c1", "c3"]);
    for (const i of rep.items) assertStringIncludes(i.reason, "valid-attachments");
    assertEquals(n.mgr.attachments().map((a) => a.containerId).sort(), ["c2", "c4"]);
  }));

Deno.test("a CNI GC call removes only its network's unlisted attachments past the grace period, and no orphans", () =>
  withDefaults(async (n) => {
    for (const i of [1, 2]) await add(n, i);
    await add(n, 3, { network: "other" });
    // An ENI owned in the provider by an attachment nobody recorded: not this network's.
    const ghost = { pod: "default/ghost", containerId: "ghost", ifName: "eth0" };
    await n.mock.allocateNextENI(ghost, { ips: [], ranges: [] });
    n.clock.advance(GRACE);
    const rep = await n.mgr.gc({
      dryRun: false,
      network: "enim",
      validAttachments: [{ containerId: "c2", ifName: "eth0" }],
    });
    assertEquals(rep.items.map((i) => i.containerId), ["c1"]);
    assertEquals(n.mgr.attachments().map((a) => a.containerId).sort(), ["c2", "c3"]);
    assertEquals((await n.owned()).size, 3, "c2, c3 and the orphan keep their ENIs");
    // The agent's own pass still covers the orphan.
    const own = await n.mgr.gc({ dryRun: false });
    assertEquals(own.items.map((i) => i.containerId), ["ghost"]);
  }));

// Issue 25 point 1: a CNI GC whose valid list was taken before an ADD answered (a runtime
// that does not keep GC exclusive of ADD, a restarted kubelet, a second tool on the node)
// must not tear the network out of a pod that has just started.
Deno.test("a CNI GC's list alone leaves an attachment younger than the grace period, logged with the reason", async () => {
  const lines: string[] = [];
  await withDefaults(async (n) => {
    const old = await add(n, 1);
    n.clock.advance(GRACE);
    const young = await add(n, 2);
    n.clock.advance(GRACE - 1);
    // A stale list: taken before c2's ADD answered, so it names neither c2 nor (rightly) c1.
    const rep = await n.mgr.gc({ dryRun: false, network: "enim", validAttachments: [] });
    assertEquals(rep.items.map((i) => [i.containerId, i.outcome]), [["c1", "reclaimed"]]);
    assertEquals(n.mgr.attachments().map((a) => [a.containerId, a.state, a.eniId]), [
      ["c2", "ready", young.eniId],
    ]);
    assertEquals(n.devices.where(young.mac)?.ns, "/run/netns/p2", "its device stays in its pod");
    assertEquals(n.devices.where(old.mac)?.ns, NODE);
    const left = lines.map((l) => JSON.parse(l)).filter((l) =>
      l.msg === "GC leaves a young attachment a CNI GC did not list"
    );
    assertEquals(left.map((l) => [l.key, l.eniId, l.graceSeconds]), [[
      "c2/eth0",
      young.eniId,
      GRACE / 1000,
    ]]);
    assertStringIncludes(left[0].reason, "not in cni.dev/valid-attachments");
    assertStringIncludes(left[0].reason, "left for the next pass");
    // The next pass, once it is past the grace period, takes it.
    n.clock.advance(1);
    const next = await n.mgr.gc({ dryRun: false, network: "enim", validAttachments: [] });
    assertEquals(next.items.map((i) => [i.containerId, i.outcome]), [["c2", "reclaimed"]]);
  }, { log: new Logger((l) => lines.push(l)) });
});

Deno.test("a retried ADD makes an attachment young again for a CNI GC's list", () =>
  withDefaults(async (n) => {
    const first = await add(n, 1);
    n.clock.advance(GRACE);
    const retry = await n.mgr.add(addReq(1));
    assertEquals(retry.eniId, first.eniId);
    n.clock.advance(GRACE - 1);
    assertEquals(
      (await n.mgr.gc({ dryRun: false, network: "enim", validAttachments: [] })).items,
      [],
    );
    assertEquals(n.mgr.attachments().map((a) => a.containerId), ["c1"]);
  }));

Deno.test("a CNI GC still takes a young attachment whose netns is gone", () =>
  withDefaults(async (n) => {
    await add(n, 1);
    n.devices.deleteNetns("/run/netns/p1");
    const rep = await n.mgr.gc({ dryRun: false, network: "enim", validAttachments: [] });
    assertEquals(rep.items.map((i) => [i.containerId, i.outcome]), [["c1", "reclaimed"]]);
    assertStringIncludes(rep.items[0].reason, "no longer exists");
  }));

Deno.test("gc() records a failed reclaim, goes on with the pass and retries next time", () =>
  withDefaults(async (n) => {
    await add(n, 1);
    await add(n, 2);
    n.devices.deleteNetns("/run/netns/p1");
    n.devices.deleteNetns("/run/netns/p2");
    n.clock.advance(GRACE);
    n.devices.failOn("unplug");
    const rep = await n.mgr.gc({ dryRun: false });
    assertEquals(rep.items.map((i) => i.outcome).sort(), ["failed", "reclaimed"]);
    const failed = rep.items.find((i) => i.outcome === "failed")!;
    assertStringIncludes(failed.error!, "Injected failure");
    const [row] = n.mgr.state.all();
    assertEquals([row.containerId, row.state, row.gcFailures], [failed.containerId, "deleting", 1]);
    const again = await n.mgr.gc({ dryRun: false });
    assertEquals(again.items.map((i) => [i.containerId, i.outcome]), [[
      failed.containerId,
      "reclaimed",
    ]]);
    assertEquals(n.mgr.state.all(), []);
    assertEquals((await n.owned()).size, 0);
  }));

Deno.test("gc() frees ENIs the provider shows owned by attachments the agent does not know", () =>
  withDefaults(async (n) => {
    const ghost = { pod: "default/ghost", containerId: "ghost", ifName: "eth0" };
    const e = await n.mock.allocateNextENI(ghost, { ips: [], ranges: [] });
    const dry = await n.mgr.gc({ dryRun: true });
    assertEquals(dry.items.map((i) => [i.eniId, i.containerId]), [[e.id, "ghost"]]);
    assertEquals((await n.owned()).size, 1);
    const rep = await n.mgr.gc({ dryRun: false });
    assertEquals(rep.items.map((i) => i.outcome), ["reclaimed"]);
    assertEquals((await n.owned()).size, 0);
  }));

Deno.test("gc() takes further liveness sources (e.g. Kubernetes) without other changes", async () => {
  const k8s: LivenessSource = {
    name: "kubernetes",
    dead(rows) {
      return Promise.resolve(
        new Map(
          rows.filter((r) => r.pod === "default/pod-2").map((r) => [keyOf(r), {
            reason: "pod default/pod-2 no longer exists in the API server",
          }]),
        ),
      );
    },
  };
  await withDefaults(async (n) => {
    await add(n, 1);
    await add(n, 2);
    n.clock.advance(GRACE);
    const rep = await n.mgr.gc({ dryRun: false });
    assertEquals(rep.items.map((i) => [i.containerId, i.reason]), [[
      "c2",
      "pod default/pod-2 no longer exists in the API server",
    ]]);
  }, { livenessSources: [k8s] });
});

Deno.test("gc() leaves an ADD in flight alone, even past the grace period", () =>
  withDefaults(async (n) => {
    n.devices.addNetns("/run/netns/p1");
    const pending = n.mgr.add(addReq(1));
    await new Promise((r) => setTimeout(r, 5));
    n.clock.advance(10 * GRACE);
    assertEquals(n.mgr.state.all().map((r) => r.state), ["adding"]);
    assertEquals((await n.mgr.gc({ dryRun: false })).items, []);
    const res = await pending;
    assertEquals(n.devices.where(res.mac)?.ns, "/run/netns/p1");
    assertEquals(n.mgr.state.all().map((r) => r.state), ["ready"]);
  }, { mock: { enis: 2, preattached: 0, attachLatencyMs: 40 } }));

// Found by `deno task stress` (seed 1702): a CNI GC whose plugin process was killed goes
// on in the agent; the runtime's ADD retry answered success meanwhile, and the pass then
// took the attachment away. An ADD answered after a pass began outranks the pass's facts.
Deno.test("a GC pass leaves an attachment that an ADD confirmed after the pass began", () =>
  // No grace period: only the order of the ADD's answer and the pass protects it.
  withDefaults(async (n) => {
    const first = await add(n, 1);
    const gc = n.mgr.gc({ dryRun: false, network: "enim", validAttachments: [] });
    const retry = await n.mgr.add(addReq(1));
    assertEquals(retry.eniId, first.eniId);
    assertEquals((await gc).items, []);
    assertEquals(n.mgr.attachments().map((a) => [a.containerId, a.state]), [["c1", "ready"]]);
    // The next pass, begun after that ADD, works from newer facts: it reclaims.
    const next = await n.mgr.gc({ dryRun: false, network: "enim", validAttachments: [] });
    assertEquals(next.items.map((i) => i.containerId), ["c1"]);
  }, { graceMs: 0 }));
