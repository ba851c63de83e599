import { addReq, delReq, type Node, settle, withNode } from "../tests/support/manager_fixtures.ts";
import { ApiError, AttachmentSchema, CheckRequestSchema, StatusSchema } from "../api/schema.ts";
import { NODE } from "../netns/fake.ts";
import { DeviceError } from "../netns/types.ts";
import { ProviderError } from "../providers/contract.ts";
import { assert, assertEquals, assertRejects, assertStringIncludes } from "../lib/assert.ts";
import type { AddInput } from "./types.ts";

async function add(n: Node, i: number | string, over: Record<string, unknown> = {}) {
  const req = addReq(i, over);
  if (req.mode === "interface" && !n.devices.snapshot()[req.netns]) n.devices.addNetns(req.netns);
  return await n.mgr.add(req);
}

async function rejectsWith(fn: () => Promise<unknown>, code: string): Promise<ApiError> {
  const e = await assertRejects(fn);
  assert(e instanceof ApiError, `Expected an ApiError, got ${e}`);
  assertEquals(e.code, code, e.message);
  return e;
}

/** The invariants after any operation: rows, provider ownership and devices agree. */
async function assertConsistent(n: Node): Promise<void> {
  const rows = n.mgr.state.all();
  const owned = await n.owned();
  for (const r of rows) {
    assert(r.state === "ready" || r.state === "recycling", `Row ${r.containerId} is ${r.state}`);
    assertEquals(owned.get(r.eniId!), `${r.containerId}/${r.ifName}`, `ENI of ${r.containerId}`);
    const where = n.devices.where(r.mac!);
    if (r.mode === "interface") assertEquals(where?.ns, r.netns);
  }
  assertEquals(owned.size, rows.length, "Every owned ENI has exactly one live attachment");
  for (const e of await n.mock.list()) {
    if (!e.owner) assertEquals(n.devices.where(e.mac)?.ns, NODE, `Free ${e.id} is on the node`);
  }
}

Deno.test("add() plugs an ENI into the pod and returns the seed's result", () =>
  withNode(async (n) => {
    const res = await add(n, 1, { routes: [{ dst: "192.168.0.0/16" }], mtu: 9000 });
    assertEquals(res.eniId, "eni-mock-0001");
    assertEquals(res.mac, "02:e1:0a:00:00:01");
    assertEquals(res.ips, [{ address: "10.99.0.2/24", gateway: "10.99.0.1" }]);
    assertEquals(res.routes, [
      { dst: "0.0.0.0/0", gw: "10.99.0.1" },
      { dst: "192.168.0.0/16", gw: "10.99.0.1" },
    ]);
    const where = n.devices.where(res.mac)!;
    assertEquals(where.ns, "/run/netns/p1");
    assertEquals(where.link.ifname, "eth0");
    assertEquals(where.link.alias, res.nodeName);
    assertEquals(where.link.mtu, 9000);
    assertEquals(res.ifindex, where.link.ifindex);
    const [att] = n.mgr.attachments();
    AttachmentSchema.parse(att);
    assertEquals([att.state, att.pod, att.eniId], ["ready", "default/pod-1", res.eniId]);
    await assertConsistent(n);
  }));

Deno.test("add() returns the same ENI for a retried ADD", () =>
  withNode(async (n) => {
    const a = await add(n, 1);
    const b = await add(n, 1);
    const [c, d] = await Promise.all([add(n, 1), add(n, 1)]);
    for (const x of [b, c, d]) assertEquals(x, a);
    assertEquals(n.provider.allocations, 1, "no second allocation");
    assertEquals(n.devices.calls.filter((c) => c.op === "plug").length, 1);
    await assertConsistent(n);
  }));

Deno.test("add() for a pod's new container gets a new ENI and recycles the old one", () =>
  withNode(async (n) => {
    const old = await add(n, 1);
    n.clock.advance(1000);
    const neu = await add(n, 1, { containerId: "c1-new", netns: "/run/netns/p1-new" });
    assert(neu.eniId !== old.eniId);
    const byC = new Map(n.mgr.attachments().map((a) => [a.containerId, a]));
    assertEquals(byC.get("c1")?.state, "recycling");
    assertEquals(byC.get("c1-new")?.state, "ready");
    assertEquals((await n.mgr.status()).pool.recycling, 1);
    // The old container's own DEL releases only its ENI (answered before the move home).
    await n.mgr.del(delReq(1));
    assertEquals(n.mgr.state.get({ containerId: "c1", ifName: "eth0" })?.state, "deleting");
    await n.mgr.settled();
    assertEquals(n.mgr.attachments().map((a) => a.containerId), ["c1-new"]);
    assertEquals([...(await n.owned()).keys()], [neu.eniId]);
    assertEquals(n.devices.where(old.mac)?.ns, NODE);
    assertEquals(n.devices.where(neu.mac)?.ns, "/run/netns/p1-new");
    await assertConsistent(n);
  }));

Deno.test("del() releases the ENI, is idempotent and succeeds for an unknown key", () =>
  withNode(async (n) => {
    const before = n.devices.snapshot()[NODE];
    const a = await add(n, 1);
    await n.mgr.del(delReq(1));
    await n.mgr.del(delReq(1));
    await n.mgr.del(delReq("never", { netns: "" }));
    await n.mgr.settled();
    assertEquals(n.mgr.attachments(), []);
    assertEquals((await n.owned()).size, 0);
    assertEquals(n.devices.snapshot()[NODE], before, "device back on the node, renamed, scrubbed");
    assertEquals(n.devices.where(a.mac)?.link.addresses, []);
    // The ENI is reusable.
    assertEquals((await add(n, 2)).eniId, a.eniId);
  }));

Deno.test("a plain pod's DEL answers once its intent is recorded and its namespace held; the move home follows, an ADD and reads wait for it, a second DEL answers at once", () =>
  withNode(async (n) => {
    const a = await add(n, 1);
    const open = n.devices.holdOn("unplug");
    await n.mgr.del(delReq(1));
    // Answered: recorded as deleting, the device still in the pod (its move held back).
    assertEquals(n.mgr.state.all().map((r) => r.state), ["deleting"]);
    assertEquals(n.devices.where(a.mac)?.ns, "/run/netns/p1");
    const order: string[] = [];
    n.devices.addNetns("/run/netns/p2");
    const next = n.mgr.add(addReq(2)).then((r) => (order.push("add"), r));
    const again = n.mgr.del(delReq(1)).then(() => order.push("del again"));
    const settled = n.mgr.settled().then(() => order.push("settled"));
    await settle();
    // containerd's second DEL (RemovePodSandbox) has nothing left to do; the rest waits.
    assertEquals(order, ["del again"], "the ADD and reads wait for the move home");
    open();
    const b = await next;
    await Promise.all([again, settled]);
    // The one ENI went home and to the next pod: neither a new ENI nor no_eni_available.
    assertEquals(b.eniId, a.eniId);
    assertEquals(n.devices.where(a.mac)?.ns, "/run/netns/p2");
    assertEquals(order.sort(), ["add", "del again", "settled"]);
    assertEquals(n.mgr.attachments().map((x) => x.containerId), ["c2"]);
    await assertConsistent(n);
  }, { mock: { enis: 1 } }));

Deno.test("an ADD in another namespace with a free ENI goes on beside a DEL that is still bringing its device home; one in the same namespace waits", () =>
  withNode(async (n) => {
    const a = await add(n, 1);
    const open = n.devices.holdOn("unplug");
    await n.mgr.del(delReq(1));
    const b = await add(n, 2);
    assert(b.eniId !== a.eniId, "the free ENI, not the one on its way home");
    assertEquals(n.devices.where(a.mac)?.ns, "/run/netns/p1", "that one is still in the pod");
    let same = false;
    const again = n.mgr.add(addReq(1, { containerId: "c1-new" })).then((r) => (same = true, r));
    await settle();
    assertEquals(same, false, "an ADD in the same namespace waits for the move home");
    open();
    assertEquals((await again).eniId, a.eniId);
    await n.mgr.settled();
    await assertConsistent(n);
  }, { mock: { enis: 2 } }));

Deno.test("a DEL answers after its work where nothing is left to hold: a sticky pod's hold, a namespace already gone", () =>
  withNode(async (n) => {
    await add(n, 1, { sticky: true });
    const open = n.devices.holdOn("unplug");
    let done = false;
    const del = n.mgr.del(delReq(1)).then(() => (done = true));
    await settle();
    assertEquals(done, false, "a sticky pod's DEL answers once its hold is recorded");
    open();
    await del;
    assertEquals(n.mgr.state.all().map((r) => r.state), ["held"]);

    const c = await add(n, 2);
    n.devices.deleteNetns("/run/netns/p2");
    await n.mgr.del(delReq(2));
    assertEquals(n.devices.where(c.mac)?.ns, NODE, "home when the DEL answered");
    assertEquals(n.mgr.state.all().map((r) => r.state), ["held"]);
  }, { mock: { enis: 2 } }));

Deno.test("a DEL of a pod named by /proc/<pid>/ns/net answers only once its device is home: nothing holds that namespace open", () =>
  withNode(async (n) => {
    const netns = "/proc/4242/ns/net";
    const a = await add(n, 1, { netns });
    const open = n.devices.holdOn("unplug");
    let done = false;
    const del = n.mgr.del(delReq(1, { netns })).then(() => (done = true));
    await settle();
    assertEquals(done, false, "no early answer: the runtime may stop the sandbox right after it");
    open();
    await del;
    assertEquals(n.devices.where(a.mac)?.ns, NODE, "home when the DEL answered");
    assertEquals(n.mgr.state.all(), []);
  }, {}));

Deno.test("a DEL whose /proc/<pid>/ns/net path names another pod's namespace by then leaves that pod's eth0 alone", () =>
  withNode(async (n) => {
    const netns = "/proc/4242/ns/net";
    const a = await add(n, 1, { netns });
    // The sandbox's process exits (its namespace goes, the ENI's device back on the node);
    // PID 4242 is reused by a process of another pod whose namespace got the freed inode,
    // with an eth0 of its own that carries no mark of enim.
    n.devices.replaceNetns(netns, { reuseInode: true });
    const theirs = "02:00:00:00:99:01";
    n.devices.addNodeLink(theirs, "theirs");
    n.devices.moveIntoNetns(theirs, netns, "eth0");
    n.devices.editPodLink(netns, "eth0", (l) => delete l.alias);
    await n.mgr.del(delReq(1, { netns }));
    const left = n.devices.where(theirs);
    assertEquals([left?.ns, left?.link.ifname, left?.link.mac], [netns, "eth0", theirs]);
    const home = n.devices.where(a.mac);
    assertEquals([home?.ns, home?.link.ifname], [NODE, a.nodeName]);
    assertEquals(n.mgr.state.all(), []);
  }));

Deno.test("a state write that fails after a DEL answered early is counted and retried until it is written", async () => {
  let failures = 0;
  const metrics = {
    phase() {},
    operation() {},
    gcReclaim() {},
    answeredDelStateFailed: () => void failures++,
  };
  await withNode(async (n) => {
    const a = await add(n, 1);
    // The disk is full for the row's last write, twice (the runtime was told success).
    const full = Object.assign(new Error("database or disk is full"), { code: "ERR_SQLITE_ERROR" });
    const write = n.mgr.state.delete.bind(n.mgr.state);
    let left = 2;
    n.mgr.state.delete = (k) => {
      if (left-- > 0) throw full;
      write(k);
    };
    await n.mgr.del(delReq(1));
    await n.mgr.settled();
    assertEquals(failures, 2, "each failed write counted");
    assertEquals(n.mgr.state.all(), [], "written at the third try");
    assertEquals(n.devices.where(a.mac)?.ns, NODE);
    assertEquals((await n.owned()).size, 0);
    assertEquals((await add(n, 2)).eniId, a.eniId, "the ENI is the next pod's");
  }, { mock: { enis: 1 }, metrics });
});

Deno.test("del() brings the device back when the pod's netns is already gone", () =>
  withNode(async (n) => {
    const a = await add(n, 1);
    n.devices.deleteNetns("/run/netns/p1");
    await n.mgr.del(delReq(1));
    const w = n.devices.where(a.mac)!;
    assertEquals([w.ns, w.link.ifname], [NODE, a.nodeName]);
    assertEquals((await n.owned()).size, 0);
  }));

Deno.test("del() that fails half way leaves the row deleting for GC", () =>
  withNode(async (n) => {
    await add(n, 1);
    n.devices.failOn("unplug");
    // Answered before the move home: the move's failure comes after the answer.
    await n.mgr.del(delReq(1));
    await n.mgr.settled();
    const [row] = n.mgr.state.all();
    assertEquals([row.state, row.gcFailures], ["deleting", 1]);
    assertStringIncludes(row.lastError!, "Injected failure");
    const rep = await n.mgr.gc({ dryRun: false });
    assertEquals(rep.items.map((i) => i.outcome), ["reclaimed"]);
    assertEquals(n.mgr.state.all(), []);
    await assertConsistent(n);
  }));

Deno.test("add() rolls back every step that fails", async (t) => {
  const cases: [string, (n: Node, req: AddInput) => void, string][] = [
    ["netns missing", (n, req) => n.devices.deleteNetns(req.netns), "netns_invalid"],
    ["provider error", (n) => {
      n.provider.failNext = new ProviderError("throttled", "Slow down");
    }, "provider_error"],
    ["the device is not on the node, nor found by a lookup", (n) => {
      n.devices.failOn("plug", new DeviceError("find", "not_found", "No device"));
      n.devices.failOn("findByMac");
    }, "device_error"],
    ["plug fails", (n) => n.devices.failOn("plug"), "device_error"],
    ["plug fails after moving", (n) => n.devices.failOn("plug:after-move"), "device_error"],
    ["ifname taken in the pod", (n, req) => {
      n.devices.addNodeLink("02:00:00:00:00:99", "eth0");
      n.devices.plug({
        mac: "02:00:00:00:00:99",
        netns: req.netns,
        ifName: "eth0",
        addresses: [],
        routes: [],
      });
    }, "ifname_exists"],
    ["netns lookup fails", (n) => {
      n.devices.failOn("netnsIdentity", new DeviceError("netns", "netns_invalid", "Bad netns"));
    }, "netns_invalid"],
  ];
  for (const [name, inject, code] of cases) {
    await t.step(name, () =>
      withNode(async (n) => {
        const req = addReq(1);
        n.devices.addNetns(req.netns);
        const freeBefore = (await n.mock.status()).free;
        const nodeBefore = n.devices.snapshot()[NODE].links.filter((l) =>
          l.mac.startsWith("02:e1")
        );
        inject(n, req);
        await settle();
        const e = await rejectsWith(() => n.mgr.add(req), code);
        assert(e.message.length > 5);
        assertEquals(n.mgr.state.all(), [], "no row left");
        assertEquals((await n.mock.status()).free, freeBefore, "ENI free again");
        assertEquals(
          n.devices.snapshot()[NODE].links.filter((l) => l.mac.startsWith("02:e1")),
          nodeBefore,
          "devices back on the node as they were",
        );
      }));
  }
  await t.step("no ENI available", () =>
    withNode(async (n) => {
      await add(n, 1);
      await rejectsWith(() => add(n, 2), "no_eni_available");
      assertEquals(n.mgr.attachments().length, 1);
    }, { mock: { enis: 1 } }));
  await t.step("requested IP unavailable", () =>
    withNode(async (n) => {
      await rejectsWith(() => add(n, 2, { ips: ["10.1.2.3"] }), "requested_ip_unavailable");
      const ok = await add(n, 3, { ips: ["10.99.0.4"] });
      assertEquals(ok.ips[0].address, "10.99.0.4/24");
      assertEquals(n.mgr.attachments().length, 1);
    }));
});

Deno.test("add() in IPAM mode leaves the device on the node and returns its node ifindex", () =>
  withNode(async (n) => {
    const res = await n.mgr.add(addReq(1, { mode: "ipam", netns: "/dev/null" }));
    const w = n.devices.where(res.mac)!;
    assertEquals(w.ns, NODE);
    assertEquals(res.ifindex, w.link.ifindex);
    assertEquals(res.nodeName, w.link.ifname);
    assertEquals(n.devices.calls.filter((c) => c.op === "plug").length, 0);
    const [row] = n.mgr.state.all();
    assertEquals([row.netnsDev, row.netnsIno], [null, null]);
    await n.mgr.check(CheckRequestSchema.parse({
      containerId: "c1",
      ifName: "eth0",
      netns: "/dev/null",
      network: "enim",
      mode: "ipam",
      expected: { mac: res.mac, addresses: [res.ips[0].address] },
    }));
    // GC does not treat /dev/null as a dead netns.
    n.clock.advance(3_600_000);
    assertEquals((await n.mgr.gc({ dryRun: true })).items, []);
    await n.mgr.del(delReq(1, { netns: "" }));
    assertEquals((await n.owned()).size, 0);
  }));

Deno.test("IPAM mode under a plugin that moves the device first (host-device): ADD finds it in the pod, DEL leaves it to that plugin", () =>
  withNode(async (n) => {
    const netns = "/run/netns/p1";
    n.devices.addNetns(netns);
    // host-device: finds the ENI's device by hwaddr, moves it in as eth0, then calls IPAM.
    const eni = (await n.mock.list())[0];
    const nodeName = n.devices.where(eni.mac)!.link.ifname;
    const moved = n.devices.moveIntoNetns(eni.mac, netns, "eth0");
    const res = await n.mgr.add(addReq(1, { mode: "ipam", netns, ips: [eni.ipv4!.address] }));
    assertEquals([res.eniId, res.mac], [eni.id, eni.mac]);
    assertEquals(res.ifindex, moved.ifindex, "the pod-side ifindex");
    assertEquals(res.nodeName, nodeName, "the node-side name, from the alias");
    assertEquals(n.devices.calls.filter((c) => c.op === "plug").length, 0);
    await n.mgr.check(CheckRequestSchema.parse({
      containerId: "c1",
      ifName: "eth0",
      netns,
      network: "enim",
      mode: "ipam",
      expected: { mac: res.mac, addresses: [res.ips[0].address] },
    }));
    // host-device's DEL: IPAM DEL first (the ENI is released, the device stays for it)...
    await n.mgr.del(delReq(1));
    assertEquals(n.devices.where(eni.mac)!.ns, netns, "enim left the device in the pod");
    assertEquals((await n.owned()).size, 0);
    assertEquals(n.mgr.state.all(), []);
    // ...then it moves the device out under its node name, and the ENI is usable again.
    n.devices.moveOutOfNetns(netns, "eth0");
    assertEquals(n.devices.where(eni.mac)!.link.ifname, nodeName);
    const again = await add(n, 2);
    assertEquals(again.eniId, eni.id);
    await assertConsistent(n);
  }));

Deno.test("IPAM mode: DEL still moves back a device left in the pod under another name", () =>
  withNode(async (n) => {
    const netns = "/run/netns/p1";
    n.devices.addNetns(netns);
    const res = await n.mgr.add(addReq(1, { mode: "ipam", netns }));
    assertEquals(n.devices.where(res.mac)!.ns, NODE, "IPAM ADD leaves the device on the node");
    // A device plugin moved it in under a name other than CNI_IFNAME, and does not move it out.
    n.devices.moveIntoNetns(res.mac, netns, "net1");
    await n.mgr.del(delReq(1));
    const w = n.devices.where(res.mac)!;
    assertEquals([w.ns, w.link.ifname], [NODE, res.nodeName]);
    assertEquals((await n.owned()).size, 0);
  }));

Deno.test("check() passes for a healthy attachment and names each difference", async (t) => {
  const checkReq = (over: Record<string, unknown> = {}) =>
    CheckRequestSchema.parse({
      containerId: "c1",
      ifName: "eth0",
      netns: "/run/netns/p1",
      network: "enim",
      mode: "interface",
      expected: { mac: "02:e1:0a:00:00:01", addresses: ["10.99.0.2/24"] },
      ...over,
    });
  const cases: [string, (n: Node) => void, Record<string, unknown>, RegExp][] = [
    ["unknown attachment", () => {}, { containerId: "zzz" }, /not known/],
    ["wrong expected MAC", () => {}, {
      expected: { mac: "02:00:00:00:00:01", addresses: [] },
    }, /MAC/],
    ["address not the ENI's", () => {}, {
      expected: { addresses: ["10.99.0.77/24"] },
    }, /10\.99\.0\.77/],
    [
      "interface missing",
      (n) =>
        n.devices.editPodLink("/run/netns/p1", "eth0", (l) => {
          l.ifname = "eth9";
        }),
      {},
      /missing/,
    ],
    [
      "address removed",
      (n) =>
        n.devices.editPodLink("/run/netns/p1", "eth0", (l) => {
          l.addresses = [];
        }),
      {},
      /lacks address 10\.99\.0\.2\/24/,
    ],
    [
      "a route of the prevResult removed",
      (n) =>
        n.devices.editPodLink("/run/netns/p1", "eth0", (l) => {
          l.routes = [];
        }),
      { expected: { addresses: [], routes: [{ dst: "0.0.0.0/0", gw: "10.99.0.1" }] } },
      /lacks route 0\.0\.0\.0\/0 via 10\.99\.0\.1/,
    ],
    [
      "the interface is another device",
      (n) =>
        n.devices.editPodLink("/run/netns/p1", "eth0", (l) => {
          l.mac = "02:aa:00:00:00:01";
          delete l.alias;
        }),
      { expected: { addresses: [] } },
      /not the ENI's device/,
    ],
    ["expected route missing", () => {}, {
      expected: { addresses: [], routes: [{ dst: "172.16.0.0/12" }] },
    }, /lacks route 172\.16/],
    [
      "netns replaced",
      (n) => {
        n.devices.replaceNetns("/run/netns/p1");
      },
      {},
      /not the namespace/,
    ],
  ];
  await t.step("healthy", () =>
    withNode(async (n) => {
      await add(n, 1);
      await n.mgr.check(checkReq());
    }));
  // What later plugins in the chain may change, as long as the prevResult says so.
  const passing: [string, (n: Node) => void, Record<string, unknown>][] = [
    [
      "a later plugin changed the MAC (tuning)",
      (n) =>
        n.devices.editPodLink("/run/netns/p1", "eth0", (l) => {
          l.mac = "02:5a:00:00:00:42";
        }),
      { expected: { mac: "02:5a:00:00:00:42", addresses: ["10.99.0.2/24"] } },
    ],
    [
      "a later plugin added an address the result lists",
      (n) =>
        n.devices.editPodLink("/run/netns/p1", "eth0", (l) => {
          l.addresses.push("10.99.0.250/24");
        }),
      {
        expected: { mac: "02:e1:0a:00:00:01", addresses: ["10.99.0.2/24", "10.99.0.250/24"] },
      },
    ],
    [
      "a later plugin removed a default route the result omits",
      (n) =>
        n.devices.editPodLink("/run/netns/p1", "eth0", (l) => {
          l.routes = l.routes.filter((r) => !r.dst.includes(":"));
        }),
      { expected: { addresses: [], routes: [{ dst: "0.0.0.0/0", gw: "10.99.0.1" }] } },
    ],
  ];
  for (const [name, edit, over] of passing) {
    await t.step(`passes: ${name}`, () =>
      withNode(async (n) => {
        await add(n, 1);
        edit(n);
        await n.mgr.check(checkReq(over));
      }));
  }
  for (const [name, edit, over, re] of cases) {
    await t.step(name, () =>
      withNode(async (n) => {
        await add(n, 1);
        edit(n);
        const e = await rejectsWith(() => n.mgr.check(checkReq(over)), "check_failed");
        assert(re.test(e.message), `"${e.message}" should match ${re}`);
      }));
  }
});

Deno.test("32 parallel ADDs against 24 ENIs: 24 distinct ENIs, 8 no_eni_available", () =>
  withNode(async (n) => {
    const results = await Promise.allSettled(
      Array.from({ length: 32 }, (_, i) => add(n, i)),
    );
    const ok = results.filter((r) => r.status === "fulfilled").map((r) => r.value);
    const failed = results.filter((r) => r.status === "rejected").map((r) => r.reason);
    assertEquals(ok.length, 24);
    assertEquals(new Set(ok.map((r) => r.eniId)).size, 24);
    assertEquals(failed.length, 8);
    for (const e of failed) assert(e instanceof ApiError && e.code === "no_eni_available", `${e}`);
    assertEquals((await n.mgr.status()).canAllocate, false);
    await assertConsistent(n);
    await Promise.all(Array.from({ length: 32 }, (_, i) => n.mgr.del(delReq(i))));
    await n.mgr.settled();
    assertEquals(n.mgr.attachments(), []);
    const st = await n.mgr.status();
    assertEquals([st.pool.free, st.pool.owned, st.canAllocate], [24, 0, true]);
  }, { mock: { enis: 24, preattached: 12, attachLatencyMs: 1 } }));

Deno.test("status() reports pool counts, readiness and ENIs with devices and attachments", () =>
  withNode(async (n) => {
    const a = await add(n, 1);
    const st = StatusSchema.parse(await n.mgr.status());
    assertEquals(st.ready, true);
    assertEquals(st.provider, "mock");
    assertEquals(st.pool, {
      exhausted: false,
      free: 1,
      owned: 1,
      recycling: 0,
      held: 0,
      attachable: 1,
      profiles: { default: { free: 1, owned: 1, recycling: 0, held: 0 } },
    });
    assertEquals(st.canAllocate, true);
    const e = st.enis.find((x) => x.id === a.eniId)!;
    assertEquals([e.device, e.attachment?.containerId], [a.nodeName, "c1"]);
    assert(st.enis.find((x) => x.id !== a.eniId)?.device?.startsWith("sim"));
    assertEquals((await n.mgr.enis()).length, 2);
  }, { mock: { enis: 3, preattached: 2 } }));

Deno.test("reconcile() fixes every half-done state a crash leaves", async (t) => {
  type Crash = (n: Node) => Promise<void>;
  const hangAdd = (setup: (n: Node) => void): Crash => async (n) => {
    setup(n);
    n.devices.addNetns("/run/netns/p2");
    void n.mgr.add(addReq(2)).catch(() => {});
    await settle();
    await settle();
  };
  const hangDel = (setup: (n: Node) => void): Crash => async (n) => {
    setup(n);
    void n.mgr.del(delReq(1)).catch(() => {});
    await settle();
    await settle();
  };
  const cases: [string, Crash, { rolledBack: number; finished: number; kept: string[] }][] = [
    [
      "ADD: intent recorded, provider not called",
      hangAdd((n) => {
        n.provider.hang = "before-allocate";
      }),
      { rolledBack: 1, finished: 0, kept: ["c1"] },
    ],
    [
      "ADD: allocated, ENI not recorded",
      hangAdd((n) => {
        n.provider.hang = "after-allocate";
      }),
      { rolledBack: 1, finished: 0, kept: ["c1"] },
    ],
    ["ADD: ENI allocated, device not moved yet", hangAdd((n) => n.devices.hangOn("plug")), {
      rolledBack: 1,
      finished: 0,
      kept: ["c1"],
    }],
    [
      "ADD: device moved into the pod, not configured",
      hangAdd((n) => {
        n.devices.hangOn("plug:after-move");
      }),
      { rolledBack: 1, finished: 0, kept: ["c1"] },
    ],
    ["DEL: intent recorded, device still in the pod", hangDel((n) => n.devices.hangOn("unplug")), {
      rolledBack: 0,
      finished: 1,
      kept: [],
    }],
    [
      "DEL: device back, ENI freed, row not deleted",
      hangDel((n) => {
        n.provider.hang = "after-deallocate";
      }),
      { rolledBack: 0, finished: 1, kept: [] },
    ],
  ];
  for (const [name, crash, want] of cases) {
    await t.step(name, () =>
      withNode(async (n) => {
        const kept = await add(n, 1);
        await crash(n);
        assert(n.mgr.state.all().some((r) => r.state === "adding" || r.state === "deleting"));
        await n.restart();
        const rep = await n.mgr.reconcile();
        assertEquals(
          { rolledBack: rep.rolledBack, finished: rep.finished, errors: rep.errors },
          { rolledBack: want.rolledBack, finished: want.finished, errors: [] },
        );
        assertEquals(n.mgr.state.all().map((r) => r.containerId), want.kept);
        await assertConsistent(n);
        if (want.kept.length) {
          // The attachment the client was told succeeded is intact; a retried ADD returns it.
          assertEquals(await n.mgr.add(addReq(1)), kept);
        }
        // Every ENI not kept is allocatable again.
        const free = (await n.mock.status()).free;
        assertEquals(free, 4 - want.kept.length);
      }));
  }
  await t.step(
    "an ENI owned by an attachment the state never recorded is freed",
    () =>
      withNode(async (n) => {
        await n.mock.allocateNextENI(
          { pod: "default/ghost", containerId: "ghost", ifName: "eth0" },
          { ips: [], ranges: [] },
        );
        const rep = await n.mgr.reconcile();
        assertEquals(rep.orphansFreed, 1);
        assertEquals((await n.owned()).size, 0);
      }),
  );
  // Issue 17.0's first hole: an ENI the provider shows free while the state holds it
  // could go to a second owner. Reconcile used to report it only; it claims it back.
  await t.step(
    "a ready attachment whose ENI the provider shows free gets it back",
    () =>
      withNode(async (n) => {
        const r = await add(n, 1);
        await n.mock.deallocateENI({ pod: "default/pod-1", containerId: "c1", ifName: "eth0" });
        const rep = await n.mgr.reconcile();
        assertEquals({ repaired: rep.repaired, errors: rep.errors }, { repaired: 1, errors: [] });
        assertEquals([...(await n.owned())], [[r.eniId, "c1/eth0"]]);
        assert((await add(n, 2)).eniId !== r.eniId, "the next pod gets another ENI");
        await assertConsistent(n);
      }),
  );
  await t.step(
    "a ready attachment whose ENI the provider shows held by an unknown key gets it back",
    () =>
      withNode(async (n) => {
        const r = await add(n, 1);
        await n.mock.deallocateENI({ pod: "default/pod-1", containerId: "c1", ifName: "eth0" });
        const ghost = { pod: "default/ghost", containerId: "ghost", ifName: "eth0" };
        await n.mock.allocateNextENI(ghost, { eniId: r.eniId });
        const rep = await n.mgr.reconcile();
        assertEquals({ repaired: rep.repaired, errors: rep.errors }, { repaired: 1, errors: [] });
        assertEquals([...(await n.owned())], [[r.eniId, "c1/eth0"]]);
        await assertConsistent(n);
      }),
  );
  await t.step(
    "a ready attachment whose ENI the provider lost is reported and kept",
    () =>
      withNode(async (n) => {
        const r = await add(n, 1);
        // Deleted out of band: the cloud lists it no more.
        const list = n.mock.list.bind(n.mock);
        n.mock.list = async () => (await list()).filter((e) => e.id !== r.eniId);
        const rep = await n.mgr.reconcile();
        assertEquals(rep.errors.length, 1);
        assertStringIncludes(rep.errors[0], "missing");
        assertEquals(n.mgr.attachments().length, 1, "reconcile never drops a ready attachment");
      }),
  );
  // Issue 17.0's second hole: an attachment whose device exists nowhere while its pod
  // namespace still exists. Its device is asked back from the provider, on the node,
  // where the attachment's DEL (or GC) finds it.
  await t.step(
    "an attachment whose device is nowhere gets it back on the node",
    () =>
      withNode(async (n) => {
        const r = await add(n, 1);
        n.devices.removeLink(r.mac);
        const rep = await n.mgr.reconcile();
        assertEquals({ repaired: rep.repaired, errors: rep.errors }, { repaired: 1, errors: [] });
        assertEquals(n.devices.where(r.mac)?.ns, NODE);
        await n.mgr.del(delReq(1));
        await n.mgr.settled();
        assertEquals((await n.owned()).size, 0);
        await assertConsistent(n);
      }),
  );
  await t.step(
    "a free ENI whose device is not on the node gets it back",
    () =>
      withNode(async (n) => {
        const free = (await n.mock.list()).find((e) => !e.owner && e.state === "free")!;
        n.devices.removeLink(free.mac);
        const rep = await n.mgr.reconcile();
        assertEquals({ repaired: rep.repaired, errors: rep.errors }, { repaired: 1, errors: [] });
        assertEquals(n.devices.where(free.mac)?.ns, NODE);
      }),
  );
});

Deno.test("operations on one attachment are serialized while other pods proceed", () =>
  withNode(async (n) => {
    n.devices.addNetns("/run/netns/p1");
    n.devices.addNetns("/run/netns/p2");
    // A slow attach for pod 1 (its requested IP is on a detached ENI) does not hold up pod 2.
    let slowDone = false;
    const slow = n.mgr.add(addReq(1, { ips: ["10.99.0.3"] })).then((r) => (slowDone = true, r));
    const del1 = n.mgr.del(delReq(1));
    const fast = await n.mgr.add(addReq(2));
    assertEquals([fast.eniId, slowDone], ["eni-mock-0001", false]);
    assertEquals((await slow).eniId, "eni-mock-0002");
    await del1;
    await n.mgr.settled();
    assertEquals(n.mgr.attachments().map((a) => a.containerId), ["c2"], "DEL ran after the ADD");
    await assertConsistent(n);
  }, { mock: { enis: 2, preattached: 1, attachLatencyMs: 50 } }));
