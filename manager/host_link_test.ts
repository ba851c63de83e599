import { assert, assertEquals, assertRejects, assertStringIncludes } from "../lib/assert.ts";
import { ApiError } from "../api/schema.ts";
import { NODE } from "../netns/fake.ts";
import { HOST_LINK_GROUP } from "../netns/host_link.ts";
import { poll, withDeadline } from "../lib/async.ts";
import type { PolicyHook } from "./types.ts";
import { add, addReq, delReq, settle, withNode } from "../tests/support/manager_fixtures.ts";
import { linkMacs, nodeIfNameFor, planHostLink, tableOf } from "./host_link.ts";

const LINK = {
  podIfName: "host0",
  nodeIfPrefix: "enimh",
  serviceCidrs: ["172.30.0.0/16", "fd00:30::/108"],
  hostStackCidrs: ["169.254.20.10/32"],
};
const NODE_ADDRS = {
  addresses: ["10.99.0.2", "172.30.0.5", "fd00:99::2", "169.254.20.10"],
  primary: { ipv4: "10.99.0.2", ipv6: "fd00:99::2" },
};

Deno.test("node-end names are 15 bytes, unique per attachment, and MACs are local unicast", () => {
  const a = nodeIfNameFor("enimh", { containerId: "c1", ifName: "eth0" });
  const b = nodeIfNameFor("enimh", { containerId: "c1", ifName: "eth1" });
  assertEquals(a.length, 15);
  assert(a.startsWith("enimh") && a !== b, `${a} ${b}`);
  assertEquals(nodeIfNameFor("x", { containerId: "c1", ifName: "eth0" }).length, 15);
  const m = linkMacs({ containerId: "c1", ifName: "eth0" });
  assert(/^0e(:[0-9a-f]{2}){5}$/.test(m.nodeMac), m.nodeMac);
  assertEquals(m.podMac, `0a${m.nodeMac.slice(2)}`);
});

Deno.test("planHostLink routes Services, the node's own addresses and host-stack CIDRs, per family", async (t) => {
  const eni = {
    ipv4: { address: "10.99.0.11", prefixLength: 24, gateway: "10.99.0.1" },
    ipv6: { address: "fd00:99::11", prefixLength: 64, gateway: "fd00:99::1" },
  };
  const k = { containerId: "c1", ifName: "eth0" };
  await t.step("dual-stack: node addresses inside a listed CIDR get no route of their own", () => {
    const s = planHostLink(eni, LINK, k, NODE_ADDRS);
    assertEquals(s.routes.map((r) => r.dst), [
      "172.30.0.0/16",
      "fd00:30::/108",
      "10.99.0.2/32",
      "fd00:99::2/128",
      "169.254.20.10/32",
    ]);
    assertEquals(s.podAddresses, { ipv4: "10.99.0.11", ipv6: "fd00:99::11" });
    assertEquals(s.nodeSource, { ipv4: "10.99.0.2", ipv6: "fd00:99::2" });
    assertEquals(s.nodeIfName, nodeIfNameFor("enimh", k));
    assertEquals(s.alias, "enim:c1/eth0");
  });
  await t.step("IPv4 only: no IPv6 route", () => {
    const s = planHostLink({ ipv4: eni.ipv4, ipv6: null }, LINK, k, NODE_ADDRS);
    assertEquals(s.routes.map((r) => r.dst), ["172.30.0.0/16", "10.99.0.2/32", "169.254.20.10/32"]);
  });
});

Deno.test("ADD with a host link plugs it with the ENI, records it, and DEL removes it", async () => {
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    const res = await add(n, 1, { hostLink: LINK });
    const nodeIfName = nodeIfNameFor("enimh", { containerId: "c1", ifName: "eth0" });
    assertEquals(res.hostLink?.nodeIfName, nodeIfName);
    assertEquals(res.hostLink?.podIfName, "host0");
    // The ENI's default route, then the link's routes via the link-local gateway.
    assertEquals(res.routes, [
      { dst: "0.0.0.0/0", gw: "10.99.0.1" },
      { dst: "172.30.0.0/16", gw: "169.254.1.1" },
      { dst: "10.99.0.2/32", gw: "169.254.1.1" },
      { dst: "169.254.20.10/32", gw: "169.254.1.1" },
    ]);
    const snap = n.devices.snapshot();
    assertEquals(
      snap[NODE].links.filter((l) => l.group === HOST_LINK_GROUP).map((l) => l.ifname),
      [nodeIfName],
    );
    assert(snap["/run/netns/p1"].links.some((l) => l.ifname === "host0"));
    assertEquals(n.devices.tableLoads, 1);
    const att = n.mgr.attachments()[0];
    assertEquals(att.hostLink, {
      nodeIfName,
      podIfName: "host0",
      serviceCidrs: LINK.serviceCidrs,
      table: tableOf({ containerId: "c1", ifName: "eth0" }),
    });
    assertEquals((await n.mgr.status()).hostLinks, { links: 1, withoutServiceCidrs: [] });
    await n.mgr.check({
      containerId: "c1",
      ifName: "eth0",
      netns: "/run/netns/p1",
      network: "enim",
      mode: "interface",
      expected: { addresses: res.ips.map((i) => i.address), routes: res.routes },
    });
    await n.mgr.del(delReq(1));
    // Removed with the device's move home, which may follow the DEL's answer.
    await n.mgr.settled();
    assertEquals(await n.devices.hostLinks(), []);
    assertEquals(
      n.devices.snapshot()["/run/netns/p1"].links.some((l) => l.ifname === "host0"),
      false,
    );
  });
});

Deno.test("a DEL forgets the pod's NetworkPolicy while its device goes home, and the ENI is freed only after", async () => {
  const calls: string[] = [];
  const policy: PolicyHook = {
    reuseWait: () => null,
    whenSynced: () => null,
    prepare: () => Promise.resolve({ podRuleset: () => Promise.resolve("") }),
    committed: () => Promise.resolve(),
    removed: (key) => {
      calls.push(`removed ${key}`);
      return Promise.resolve();
    },
    restore: () => {},
  };
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    await add(n, 1, { hostLink: LINK });
    const release = n.devices.holdOn("unplug");
    try {
      await n.mgr.del(delReq(1));
      // The move home waits: the policy's removal (its edits of other pods' tables) has
      // not waited for it.
      assert(
        await poll(() => Promise.resolve(calls.length > 0 || null), {
          timeoutMs: 2_000,
          intervalMs: 5,
        }),
        "removed() while the device is on its way home",
      );
      assertEquals(calls, ["removed c1/eth0"]);
      assertEquals((await n.owned()).size, 1, "the ENI is not freed before the device is home");
    } finally {
      release();
    }
    await n.mgr.settled();
    assertEquals((await n.owned()).size, 0);
  }, { policy });
});

Deno.test("a DEL's ENI goes back to the pool only once the policy's reuse wait ends; the DEL answers before it, and an ADD on the full node waits for it", async () => {
  const waits: { addresses: string[]; end: () => void }[] = [];
  const policy: PolicyHook = {
    whenSynced: () => null,
    prepare: () => Promise.resolve({ podRuleset: () => Promise.resolve("") }),
    committed: () => Promise.resolve(),
    removed: () => Promise.resolve(),
    restore: () => {},
    reuseWait: (addresses) => {
      let end!: () => void;
      const p = new Promise<void>((r) => end = r);
      waits.push({ addresses, end });
      return p;
    },
  };
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    const first = await add(n, 1, { hostLink: LINK });
    await add(n, 2, { hostLink: LINK });
    // The DEL answers; its ENI stays its pod's while the wait lasts.
    await n.mgr.del(delReq(1));
    assert(
      await poll(() => Promise.resolve(waits.length > 0 || null), {
        timeoutMs: 2_000,
        intervalMs: 5,
      }),
      "the DEL waits",
    );
    assertEquals(waits[0].addresses, first.ips.map((i) => i.address.split("/")[0]));
    assertEquals((await n.owned()).size, 2, "not back in the pool while it waits");
    // A new pod needs that ENI (the pool has no other): its ADD waits too.
    let added: string | null = null;
    const adding = add(n, 3, { hostLink: LINK }).then((r) => added = r.eniId);
    await new Promise((ok) => setTimeout(ok, 100));
    assertEquals(added, null, "the ADD waits for the freed ENI");
    waits[0].end();
    await adding;
    assertEquals(added, first.eniId, "then it gets it");
  }, { policy, mock: { enis: 2 } });
});

Deno.test("a new sandbox of the pod whose old one's ENI waits for reuse is not held up: the same pod (same uid) takes it; another pod is", async () => {
  let waits = 0;
  const policy: PolicyHook = {
    whenSynced: () => null,
    prepare: () => Promise.resolve({ podRuleset: () => Promise.resolve("") }),
    committed: () => Promise.resolve(),
    removed: () => Promise.resolve(),
    restore: () => {},
    // Waits until told to stop (as the enforcer's does while the API shows the pod).
    reuseWait: (_addresses, signal) => {
      waits++;
      return new Promise<void>((r) => signal.addEventListener("abort", () => r(), { once: true }));
    },
  };
  const pod = (uid?: string) => ({ namespace: "default", name: "pod-1", ...(uid ? { uid } : {}) });
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    const first = await add(n, 1, { hostLink: LINK, pod: pod("u1") });
    await n.mgr.del(delReq(1));
    await poll(() => Promise.resolve(waits > 0 || null), { timeoutMs: 2_000, intervalMs: 5 });
    // Another pod of that name (another uid) waits.
    let other: string | null = null;
    const adding = add(n, 2, { hostLink: LINK, pod: pod("u2") }).then((r) => other = r.eniId);
    await new Promise((ok) => setTimeout(ok, 100));
    assertEquals(other, null, "a pod re-created under the name is another pod: it waits");
    // The same pod's next sandbox: the wait ends, and one of them gets the ENI.
    const again = await withDeadline(
      add(n, 3, { hostLink: LINK, netns: "/run/netns/p3", pod: pod("u1") }).catch((err) => err),
      10_000,
      () => new Error("the same pod's ADD is held up by its old sandbox's reuse wait"),
    );
    await withDeadline(adding.catch(() => {}), 10_000, () => new Error("held up"));
    const got = [other, again?.eniId ?? null].filter((x) => x !== null);
    assertEquals(got.length, 1, "one ENI: one of them has it, the other found none");
    assertEquals(got[0], first.eniId);
  }, { policy, mock: { enis: 1 } });
});

Deno.test("a DEL without NetworkPolicy, and a sticky pod's DEL, do not wait before the ENI goes back", async () => {
  let asked = 0;
  const policy: PolicyHook = {
    whenSynced: () => null,
    prepare: () => Promise.resolve({ podRuleset: () => Promise.resolve("") }),
    committed: () => Promise.resolve(),
    removed: () => Promise.resolve(),
    restore: () => {},
    reuseWait: () => {
      asked++;
      return null;
    },
  };
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    await add(n, 1, { hostLink: LINK });
    await n.mgr.del(delReq(1));
    await n.mgr.settled();
    assertEquals([(await n.owned()).size, asked], [0, 1], "asked, and told it may go at once");
    await add(n, 2, { hostLink: LINK, sticky: true });
    await n.mgr.del(delReq(2));
    await n.mgr.settled();
    assertEquals(asked, 1, "a sticky pod's hold keeps the ENI for that pod: nothing to ask");
  }, { policy });
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    await add(n, 1, { hostLink: LINK });
    await n.mgr.del(delReq(1));
    await n.mgr.settled();
    assertEquals((await n.owned()).size, 0);
  });
});

Deno.test("CHECK reports a host link whose node end is gone", async () => {
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    const res = await add(n, 1, { hostLink: LINK });
    await n.devices.removeHostLink(res.hostLink!.nodeIfName);
    const err = await assertRejects(
      () =>
        n.mgr.check({
          containerId: "c1",
          ifName: "eth0",
          netns: "/run/netns/p1",
          network: "enim",
          mode: "interface",
          expected: { addresses: res.ips.map((i) => i.address), routes: [] },
        }),
      ApiError,
    );
    assertEquals(err.code, "check_failed");
    assertStringIncludes(err.message, "host0");
  });
});

Deno.test("a service CIDR overlapping the subnet is refused before anything is recorded or allocated", async () => {
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    const err = await assertRejects(
      () => add(n, 1, { hostLink: { ...LINK, serviceCidrs: ["10.99.0.0/16"] } }),
      ApiError,
    );
    assertEquals(err.code, "bad_request");
    assertStringIncludes(err.message, "serviceCidrs[0] 10.99.0.0/16 overlaps");
    assertEquals(n.mgr.attachments(), []);
    assertEquals((await n.owned()).size, 0);
    assertEquals(n.devices.calls.filter((c) => c.op === "plug"), []);
  });
});

Deno.test("a failed table load or link plug leaves nothing: no record, no ENI owned, no link", async () => {
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    // The node's table cannot be loaded: a device error before anything is allocated.
    n.devices.failOn("hostLink");
    const first = await assertRejects(() => add(n, 1, { hostLink: LINK }), ApiError);
    assertEquals(first.code, "device_error");
    assertEquals(n.mgr.attachments(), []);
    assertEquals((await n.owned()).size, 0);
    const ok = await add(n, 2, { hostLink: LINK });
    // The table is loaded now; the link's plug fails: the ENI is rolled back with it.
    n.devices.failOn("hostLink");
    await assertRejects(() => add(n, 3, { hostLink: LINK }), ApiError);
    assertEquals(n.mgr.attachments().map((a) => a.containerId), ["c2"]);
    assertEquals([...(await n.owned()).values()], ["c2/eth0"]);
    assertEquals((await n.devices.hostLinks()).map((l) => l.ifname), [ok.hostLink!.nodeIfName]);
  });
});

Deno.test("GC removes a node end no attachment records, and status names networks without Services", async () => {
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    await add(n, 1, { hostLink: { ...LINK, serviceCidrs: [] }, network: "blue" });
    // A leftover node end (an ADD killed before its record), beside the live one.
    const stray = n.devices.addNodeLink("0e:00:00:00:00:99", "enimhdeadbeef00");
    stray.group = HOST_LINK_GROUP;
    await n.mgr.gc({ dryRun: false });
    const left = (await n.devices.hostLinks()).map((l) => l.ifname);
    assertEquals(left, [nodeIfNameFor("enimh", { containerId: "c1", ifName: "eth0" })]);
    assertEquals((await n.mgr.status()).hostLinks.withoutServiceCidrs, [
      { network: "blue", pods: ["default/pod-1"] },
    ]);
  });
});

Deno.test("an ADD of the same key queued behind a sticky pod's DEL with a host link finishes, and so do reads and close()", async () => {
  await withNode(async (n) => {
    n.devices.nodeAddrs = NODE_ADDRS;
    await add(n, 1, { hostLink: LINK, sticky: true });
    const open = n.devices.holdOn("unplug");
    const del = n.mgr.del(delReq(1));
    await settle();
    // The runtime sends the ADD again (a plugin timeout and retry, a podman restart) while
    // the sticky DEL holds the attachment: it queues on the attachment's lock.
    const again = n.mgr.add(addReq(1, { hostLink: LINK, sticky: true }));
    await settle();
    open();
    // A failure bound only: wedged, none of these ever settles.
    const [, res] = await withDeadline(
      Promise.all([del, again, n.mgr.settled(), n.mgr.status()]),
      2000,
      () => new Error("The DEL, the ADD queued behind it, or a read did not finish within 2 s"),
    );
    assertEquals(
      res.hostLink?.nodeIfName,
      nodeIfNameFor("enimh", { containerId: "c1", ifName: "eth0" }),
    );
    assertEquals(n.mgr.attachments().map((a) => [a.containerId, a.state]), [["c1", "ready"]]);
    assertEquals((await n.devices.hostLinks()).map((l) => l.ifname), [res.hostLink!.nodeIfName]);
    await withDeadline(
      n.mgr.close(),
      2000,
      () => new Error("close() did not return within 2 s"),
    );
  }, {});
});
