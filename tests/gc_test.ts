/**
 * Garbage collection end to end on the real kernel: the agent (mock provider) in a
 * simulated node and VPC, pods in real namespaces, the plugin and `enim gc` exec'd
 * as a runtime and an operator would.
 *
 * A simulated ENI is a veth pair: the kernel destroys it when the pod namespace
 * holding one end is deleted, and the reclaim re-plugs it (the mock's repairDevice).
 * A physical ENI instead returns to the node, possibly as `dev<N>`: one test moves
 * the device out of the pod under such a name to show it is found by MAC.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { type CniOutcome, SimulatedNode } from "./support/node.ts";
import type { NetnsHandle } from "./support/vpc.ts";
import { ipJson, runIp } from "../netns/ip.ts";
import { vethNames } from "../netns/sim.ts";
import { GcReportSchema } from "../api/schema.ts";
import { shortId } from "../cli/_table.ts";
import { z } from "zod";

const AS_ROOT = Deno.uid() === 0;

const AddrLinks = z.array(z.looseObject({
  ifname: z.string(),
  address: z.string().optional(),
  flags: z.array(z.string()).default([]),
  addr_info: z.array(z.looseObject({ local: z.string(), prefixlen: z.number() })).default([]),
}));

function podArgs(name: string): string {
  return `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1`;
}

/** ADDs `containerId` for pod `name` in `pod` and returns the result (asserting success). */
async function add(
  node: SimulatedNode,
  pod: NetnsHandle,
  name: string,
  containerId: string,
  network = "enim-test",
): Promise<{ mac: string; ips: string[]; out: CniOutcome }> {
  const out = await node.cni("ADD", {
    containerId,
    ifName: "eth0",
    netns: pod.path,
    args: podArgs(name),
    config: node.netconf("1.1.0", { name: network }),
  });
  assertEquals(out.code, 0, out.stdout + out.stderr);
  const mac = (out.json!.interfaces as { mac: string }[])[0].mac;
  const ips = (out.json!.ips as { address: string }[]).map((i) => i.address);
  return { mac, ips, out };
}

/** The link with `mac` in `netns` (a name under /run/netns), with its addresses. */
async function linkByMac(netns: string, mac: string) {
  const links = await ipJson(AddrLinks, ["addr", "show"], { netns });
  return links.find((l) => l.address === mac) ?? null;
}

/** Asserts the ENI's device is on the node as `nodeName`, down, without addresses or routes. */
async function assertScrubbedOnNode(node: SimulatedNode, mac: string, nodeName: string) {
  const link = await linkByMac(node.vpc.node.name, mac);
  assert(link, `the device with MAC ${mac} is on the node`);
  assertEquals(link.ifname, nodeName, "renamed to its node-side name");
  assert(!link.flags.includes("UP"), `"${nodeName}" is down`);
  assertEquals(link.addr_info, [], `"${nodeName}" has no addresses`);
  const routes = await ipJson(z.array(z.unknown()), ["route", "show", "dev", nodeName], {
    netns: node.vpc.node.name,
  });
  assertEquals(routes, [], `no routes via "${nodeName}"`);
}

/** Polls `fn` until it returns a truthy value (at most `ms`), then returns it. */
async function poll<T>(
  what: string,
  fn: () => Promise<T>,
  ms = 30_000,
): Promise<NonNullable<T>> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Waits until the kernel has destroyed the veth of `mac` (its VPC end is gone). */
async function vethGone(node: SimulatedNode, mac: string): Promise<void> {
  await poll(`the kernel to destroy the veth of ${mac}`, async () => {
    const links = await ipJson(AddrLinks, ["link", "show"], { netns: node.vpc.vpc.name });
    return !links.some((l) => l.ifname === vethNames(mac).vpc);
  });
}

/** The node-side name the agent recorded for `containerId`. */
async function nodeNameOf(node: SimulatedNode, containerId: string): Promise<string> {
  const a = (await node.client.attachments()).find((x) => x.containerId === containerId);
  assert(a?.nodeName, `attachment ${containerId} has a node-side name`);
  return a.nodeName;
}

Deno.test({
  name: "GC recovers the ENI of a pod namespace deleted without DEL, and a new ADD gets it",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 1 }, gc: { graceSeconds: 0 } });

    await t.step("the veth died with the namespace: re-plugged, renamed, scrubbed", async () => {
      const pod = await node.vpc.pod("dead");
      const { mac } = await add(node, pod, "dead", "c-dead");
      const nodeName = await nodeNameOf(node, "c-dead");
      await node.vpc.deletePod(pod);
      const report = await node.client.gc({ dryRun: false });
      assertEquals(report.items.map((i) => [i.containerId, i.mac, i.outcome]), [[
        "c-dead",
        mac,
        "reclaimed",
      ]]);
      assertStringIncludes(report.items[0].reason, "no longer exists");
      await assertScrubbedOnNode(node, mac, nodeName);
      assertEquals(await node.client.attachments(), []);
      assertEquals((await node.client.enis()).map((e) => e.owner), [null]);

      const next = await node.vpc.pod("next");
      const again = await add(node, next, "next", "c-next");
      assertEquals(again.mac, mac, "the only ENI is allocatable again");
      assert(await node.vpc.ping(next, node.vpc.gateways.ipv4!), "the new pod pings its gateway");
      assert(await node.vpc.ping(next, node.vpc.gateways.ipv6!), "and its IPv6 gateway");
      await node.vpc.deletePod(next);
      await node.client.gc({ dryRun: false });
    });

    await t.step(
      "a device returned to the node as dev<N>, up and addressed: found by MAC",
      async () => {
        const pod = await node.vpc.pod("phys");
        const { mac, ips } = await add(node, pod, "phys", "c-phys");
        const nodeName = await nodeNameOf(node, "c-phys");
        // What the kernel does with a physical ENI: back to the node under another name.
        await runIp(["link", "set", "dev", "eth0", "netns", node.vpc.node.path, "name", "dev77"], {
          netns: pod.name,
        });
        await runIp(["link", "set", "dev", "dev77", "up"], { netns: node.vpc.node.name });
        await runIp(["addr", "add", ips.find((a) => a.includes("."))!, "dev", "dev77"], {
          netns: node.vpc.node.name,
        });
        await node.vpc.deletePod(pod);
        const report = await node.client.gc({ dryRun: false });
        assertEquals(report.items.map((i) => [i.containerId, i.outcome]), [[
          "c-phys",
          "reclaimed",
        ]]);
        await assertScrubbedOnNode(node, mac, nodeName);
        const next = await node.vpc.pod("next2");
        assertEquals((await add(node, next, "next2", "c-next2")).mac, mac);
        assert(await node.vpc.ping(next, node.vpc.gateways.ipv4!));
      },
    );
  },
});

Deno.test({
  name: "GC reclaims the ENI of a namespace path deleted and recreated (same path, new inode)",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 }, gc: { graceSeconds: 0 } });
    const pod = await node.vpc.pod("reborn");
    const live = await node.vpc.pod("live");
    const { mac } = await add(node, pod, "reborn", "c-reborn");
    await add(node, live, "live", "c-live");
    const nodeName = await nodeNameOf(node, "c-reborn");
    const inode = async () => (await Deno.stat(pod.path)).ino;
    const before = await inode();
    // Hold the old namespace open while the path is recreated, so the new one cannot
    // get its inode (the kernel reuses freed ones; the device check covers that case).
    const held = await Deno.open(pod.path, { read: true });
    try {
      await node.vpc.deletePod(pod);
      const again = await node.vpc.pod("reborn");
      assertEquals(again.path, pod.path);
    } finally {
      held.close();
    }
    assert((await inode()) !== before, "the path names a new namespace");
    await vethGone(node, mac);
    const dry = await node.client.gc({ dryRun: true });
    assertEquals(dry.items.map((i) => i.containerId), ["c-reborn"]);
    assertStringIncludes(dry.items[0].reason, "was replaced");
    const report = await node.client.gc({ dryRun: false });
    assertEquals(report.items.map((i) => [i.containerId, i.outcome]), [["c-reborn", "reclaimed"]]);
    await assertScrubbedOnNode(node, mac, nodeName);
    assertEquals((await node.client.attachments()).map((a) => a.containerId), ["c-live"]);
    assert(await node.vpc.ping(live, node.vpc.gateways.ipv4!), "the live pod is untouched");
  },
});

Deno.test({
  name: "GC reclaims a recycling ENI (owner ADDed again) after the grace period, not before",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 }, gc: { graceSeconds: 3 } });
    const oldNs = await node.vpc.pod("web-old");
    const newNs = await node.vpc.pod("web-new");
    const old = await add(node, oldNs, "web", "c-web-old");
    const oldName = await nodeNameOf(node, "c-web-old");
    const fresh = await add(node, newNs, "web", "c-web-new");
    const states = async () =>
      Object.fromEntries((await node.client.attachments()).map((a) => [a.containerId, a.state]));
    assertEquals(await states(), { "c-web-old": "recycling", "c-web-new": "ready" });

    // Right away (inside the grace period) neither a dry run nor a real pass touches it.
    assertEquals((await node.client.gc({ dryRun: true })).items, []);
    assertEquals((await node.client.gc({ dryRun: false })).items, []);
    assertEquals(await states(), { "c-web-old": "recycling", "c-web-new": "ready" });
    assert(await linkByMac(oldNs.name, old.mac), "the old ENI is still in the old sandbox");

    // Once the grace has passed, a pass reclaims it (polled, never timed).
    const report = await poll("GC to reclaim the recycling ENI", async () => {
      const r = await node.client.gc({ dryRun: false });
      return r.items.length > 0 ? r : null;
    });
    assertEquals(report.items.map((i) => [i.containerId, i.outcome]), [["c-web-old", "reclaimed"]]);
    assertStringIncludes(report.items[0].reason, "newer container");
    assertEquals(await states(), { "c-web-new": "ready" });
    assertEquals(await linkByMac(oldNs.name, old.mac), null, "moved out of the old sandbox");
    await assertScrubbedOnNode(node, old.mac, oldName);
    assert(await linkByMac(newNs.name, fresh.mac), "the new container keeps its ENI");
    assert(await node.vpc.ping(newNs, node.vpc.gateways.ipv4!));
  },
});

Deno.test({
  name: "a CNI GC call reclaims exactly the attachments of its network not in valid-attachments",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 5 }, gc: { graceSeconds: 0 } });
    const pods: Record<string, NetnsHandle> = {};
    const macs: Record<string, string> = {};
    for (const [n, net] of [["a1", "net-a"], ["a2", "net-a"], ["a3", "net-a"], ["b1", "net-b"]]) {
      pods[n] = await node.vpc.pod(n);
      macs[n] = (await add(node, pods[n], n, `c-${n}`, net)).mac;
    }
    const names = Object.fromEntries(
      (await node.client.attachments()).map((a) => [a.containerId, a.nodeName]),
    );
    const gcConfig = (version: string) => ({
      cniVersion: version,
      name: "net-a",
      type: "enim",
      "cni.dev/valid-attachments": [{ containerID: "c-a1", ifname: "eth0" }],
    });
    // GC does not exist before spec 1.1.0: refused, nothing reclaimed.
    const old = await node.cni("GC", { config: gcConfig("1.0.0") });
    assertEquals(old.code, 1);
    assertEquals(old.json?.code, 1);
    assertEquals((await node.client.attachments()).length, 4);

    const out = await node.cni("GC", { config: gcConfig("1.1.0") });
    assertEquals(out.code, 0, out.stdout + out.stderr);
    assertEquals(out.stdout.trim(), "");
    assertEquals(
      (await node.client.attachments()).map((a) => a.containerId).sort(),
      ["c-a1", "c-b1"],
    );
    for (const n of ["a2", "a3"]) {
      assertEquals(await linkByMac(pods[n].name, macs[n]), null);
      await assertScrubbedOnNode(node, macs[n], names[`c-${n}`]!);
    }
    for (const n of ["a1", "b1"]) {
      assert(await linkByMac(pods[n].name, macs[n]), `${n} keeps its ENI`);
      assert(await node.vpc.ping(pods[n], node.vpc.gateways.ipv4!));
    }
    const owned = (await node.client.enis()).filter((e) => e.owner).map((e) => e.mac).sort();
    assertEquals(owned, [macs.a1, macs.b1].sort());
  },
});

/** State, devices and provider, for before/after comparisons. */
async function snapshot(node: SimulatedNode, pods: NetnsHandle[]) {
  const ip = (netns: string, what: string) => ipJson(z.unknown(), [what, "show"], { netns });
  const devices: Record<string, unknown> = {};
  for (const ns of [node.vpc.node.name, ...pods.map((p) => p.name)]) {
    devices[ns] = { link: await ip(ns, "link"), addr: await ip(ns, "addr") };
  }
  return {
    attachments: await node.client.attachments(),
    enis: await node.client.enis(),
    devices,
  };
}

Deno.test({
  name:
    "enim gc --dry-run lists exactly the 3 dead of 5 and changes nothing; enim gc reclaims them",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 5 }, gc: { graceSeconds: 0 } });
    const gone = await node.vpc.pod("gone");
    const reborn = await node.vpc.pod("reborn");
    const webOld = await node.vpc.pod("web-old");
    const webNew = await node.vpc.pod("web-new");
    const live = await node.vpc.pod("live");
    const dead = {
      "c-gone": await add(node, gone, "gone", "c-gone"),
      "c-reborn": await add(node, reborn, "reborn", "c-reborn"),
      "c-web-old": await add(node, webOld, "web", "c-web-old"),
    };
    await add(node, webNew, "web", "c-web-new");
    await add(node, live, "live", "c-live");
    const rows = Object.fromEntries(
      (await node.client.attachments()).map((a) => [a.containerId, a]),
    );
    await node.vpc.deletePod(gone);
    await node.vpc.deletePod(reborn);
    await node.vpc.pod("reborn");
    await vethGone(node, dead["c-gone"].mac);
    await vethGone(node, dead["c-reborn"].mac);
    const pods = [reborn, webOld, webNew, live];
    // Let the kernel settle (IPv6 DAD flags) so that only enim could change a snapshot: two
    // equal snapshots in a row are not enough on a loaded machine, where DAD may not have
    // started yet; no address may still be tentative either.
    let before = await snapshot(node, pods);
    await poll("the devices to settle", async () => {
      const s = await snapshot(node, pods);
      const text = JSON.stringify(s);
      const same = text === JSON.stringify(before) && !text.includes('"tentative":true');
      before = s;
      return same;
    });

    const text = await node.enim(["gc", "--dry-run"]);
    assertEquals(text.code, 0, text.stdout + text.stderr);
    const json = await node.enim(["gc", "--dry-run", "--json"]);
    assertEquals(json.code, 0, json.stdout + json.stderr);
    assertEquals(await snapshot(node, pods), before, "state, devices and provider untouched");

    const plan = GcReportSchema.parse(JSON.parse(json.stdout));
    assertEquals(plan.dryRun, true);
    assertEquals(plan.items.map((i) => i.containerId).sort(), Object.keys(dead).sort());
    // A recreated path gets a new inode, or the freed one back (then its device is missing).
    const reasons: Record<string, RegExp> = {
      "c-gone": /no longer exists/,
      "c-reborn": /was replaced|no longer holds the ENI's device/,
      "c-web-old": /newer container/,
    };
    for (const i of plan.items) {
      const row = rows[i.containerId];
      assertEquals(i.outcome, "planned");
      assertEquals([i.eniId, i.mac, i.device, i.pod, i.netns], [
        row.eniId,
        row.mac,
        row.nodeName,
        row.pod,
        row.netns,
      ]);
      assertMatch(i.reason, reasons[i.containerId]);
      assertStringIncludes(i.action, `free ${row.eniId}`);
      // The two runs are apart in time: a recycling reason says how long it has waited.
      const reason = i.reason.replace(/ in \d+s$/, "");
      const line = text.stdout.split("\n").find((l) => l.startsWith(`${i.eniId} `));
      assert(line, `the text lists ${i.eniId}`);
      for (
        const cell of [i.mac, i.device, i.pod, shortId(i.containerId), i.netns, reason, i.action]
      ) {
        assertStringIncludes(line, cell);
      }
    }
    assertStringIncludes(text.stdout, "dry run: 3 ENIs would be reclaimed; nothing was changed");
    for (const c of ["c-web-new", "c-live"]) {
      assert(!text.stdout.includes(rows[c].eniId!), `the live ${c} is not listed`);
    }
    assertEquals(text.stdout.split("\n")[0].split(/\s{2,}/), [
      "ENI",
      "MAC",
      "DEVICE",
      "OWNER",
      "CONTAINER",
      "NETNS",
      "REASON",
      "ACTION",
    ]);

    const real = await node.enim(["gc"]);
    assertEquals(real.code, 0, real.stdout + real.stderr);
    assertStringIncludes(real.stdout, "reclaimed 3 of 3 ENIs");
    assertEquals(
      (await node.client.attachments()).map((a) => a.containerId).sort(),
      ["c-live", "c-web-new"],
    );
    for (const [c, r] of Object.entries(dead)) {
      await assertScrubbedOnNode(node, r.mac, rows[c].nodeName!);
    }
    assert(await node.vpc.ping(live, node.vpc.gateways.ipv4!));
    assert(await node.vpc.ping(webNew, node.vpc.gateways.ipv4!));

    const after = await node.enim(["gc", "--json"]);
    assertEquals(after.code, 0, after.stdout + after.stderr);
    assertEquals(GcReportSchema.parse(JSON.parse(after.stdout)), {
      dryRun: false,
      items: [],
      unfinishedDels: [],
    });
    const none = await node.enim(["gc", "--dry-run"]);
    assertEquals([none.code, none.stdout], [0, "dry run: nothing to reclaim\n"]);

    await node.stopAgent();
    for (const args of [["gc", "--dry-run"], ["gc"], ["gc", "--json"]]) {
      const down = await node.enim(args);
      assertEquals(down.code, 1, `${args.join(" ")} exits 1 when the agent is unreachable`);
      assertStringIncludes(down.stderr, "/run/enim/enim.sock");
    }
  },
});

Deno.test({
  name: "the agent GCs once at start-up after reconcile and then every interval",
  ignore: !AS_ROOT,
  async fn(t) {
    await t.step("at start-up: a pod that died while the agent was down", async () => {
      await using node = await SimulatedNode.start({
        mock: { enis: 2 },
        gc: { graceSeconds: 0, intervalSeconds: 3600 },
      });
      const pod = await node.vpc.pod("died");
      const live = await node.vpc.pod("live");
      const { mac } = await add(node, pod, "died", "c-died");
      await add(node, live, "live", "c-live");
      const nodeName = await nodeNameOf(node, "c-died");
      await node.stopAgent();
      await node.vpc.deletePod(pod);
      await node.startAgent();
      await poll("the start-up GC pass", async () => {
        const ids = (await node.client.attachments()).map((a) => a.containerId);
        return ids.length === 1 && ids[0] === "c-live";
      });
      await assertScrubbedOnNode(node, mac, nodeName);
      assertStringIncludes(await node.agentLog(), "GC reclaimed an ENI");
    });

    await t.step("periodically: no manual trigger", async () => {
      await using node = await SimulatedNode.start({
        mock: { enis: 2 },
        gc: { graceSeconds: 0, intervalSeconds: 1 },
      });
      const pod = await node.vpc.pod("dies");
      const { mac } = await add(node, pod, "dies", "c-dies");
      const nodeName = await nodeNameOf(node, "c-dies");
      await node.vpc.deletePod(pod);
      await poll("a periodic GC pass", async () => (await node.client.attachments()).length === 0);
      await assertScrubbedOnNode(node, mac, nodeName);
      const next = await node.vpc.pod("next");
      assertEquals((await add(node, next, "next", "c-next")).mac, mac);
      assert(await node.vpc.ping(next, node.vpc.gateways.ipv4!));
    });
  },
});
