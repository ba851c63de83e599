import { FakeDeviceLayer, NODE } from "./fake.ts";
import { DeviceError } from "./types.ts";
import { assert, assertEquals, assertRejects } from "../lib/assert.ts";

const MAC = "02:e1:0a:00:00:01";

Deno.test("FakeDeviceLayer plugs a node device into a pod and unplugs it back", async () => {
  const d = new FakeDeviceLayer();
  d.addNodeLink(MAC, "eth1");
  const id = d.addNetns("/run/netns/p1");
  assertEquals(await d.netnsIdentity("/run/netns/p1"), id);
  assertEquals(await d.netnsIdentity("/run/netns/none"), null);
  const r = await d.plug({
    mac: MAC,
    netns: "/run/netns/p1",
    ifName: "eth0",
    addresses: [{ cidr: "10.0.0.2/24" }],
    routes: [{ dst: "0.0.0.0/0", gw: "10.0.0.1" }],
  });
  assertEquals(r.nodeName, "eth1");
  const st = await d.inspect({ netns: "/run/netns/p1", ifName: "eth0" });
  assertEquals(st.link?.address, MAC);
  assertEquals(st.link?.ifalias, "eth1");
  assertEquals(st.addresses, ["10.0.0.2/24"]);
  assertEquals(await d.findByMac(MAC), null);
  assertEquals(await d.unplug({ mac: MAC, nodeName: "eth1", netns: "/run/netns/p1" }), "pod");
  assertEquals(d.where(MAC)?.ns, NODE);
  assertEquals(d.where(MAC)?.link.addresses, []);
  assertEquals(await d.unplug({ mac: MAC, nodeName: "eth1", netns: "/run/netns/p1" }), "node");
  assertEquals(await d.unplug({ mac: "02:00:00:00:00:09", nodeName: "x" }), "missing");
  assertEquals(d.calls.map((c) => c.op), [
    "netnsIdentity",
    "netnsIdentity",
    "plug",
    "inspect",
    "findByMac",
    "unplug",
    "unplug",
    "unplug",
  ]);
});

Deno.test("FakeDeviceLayer refuses a taken ifName and a missing netns", async () => {
  const d = new FakeDeviceLayer();
  d.addNodeLink(MAC, "eth1");
  d.addNodeLink("02:e1:0a:00:00:02", "eth2");
  d.addNetns("/run/netns/p1");
  const base = { netns: "/run/netns/p1", ifName: "eth0", addresses: [], routes: [] };
  await d.plug({ ...base, mac: MAC });
  const e = await assertRejects(() => d.plug({ ...base, mac: "02:e1:0a:00:00:02" }));
  assert(e instanceof DeviceError && e.reason === "ifname_exists");
  const e2 = await assertRejects(() => d.plug({ ...base, netns: "/x", mac: "02:e1:0a:00:00:02" }));
  assert(e2 instanceof DeviceError && e2.reason === "netns_invalid");
});

Deno.test("FakeDeviceLayer returns a deleted namespace's links to the node", async () => {
  const d = new FakeDeviceLayer();
  d.addNodeLink(MAC, "eth1");
  const id1 = d.addNetns("/run/netns/p1");
  await d.plug({ mac: MAC, netns: "/run/netns/p1", ifName: "eth0", addresses: [], routes: [] });
  const id2 = d.replaceNetns("/run/netns/p1");
  assert(id1.ino !== id2.ino);
  assertEquals(d.where(MAC)?.ns, NODE);
  assertEquals(d.where(MAC)?.link.ifname, "eth0");
});

Deno.test("FakeDeviceLayer injects faults once and rolls a failed plug back", async () => {
  const d = new FakeDeviceLayer();
  d.addNodeLink(MAC, "eth1");
  d.addNetns("/run/netns/p1");
  const before = d.snapshot();
  d.failOn("plug:after-move");
  const p = { mac: MAC, netns: "/run/netns/p1", ifName: "eth0", addresses: [], routes: [] };
  await assertRejects(() => d.plug(p));
  assertEquals(d.snapshot(), before);
  await d.plug(p);
  assertEquals(d.where(MAC)?.ns, "/run/netns/p1");
});
