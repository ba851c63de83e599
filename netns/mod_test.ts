import { assert, assertEquals, assertNotEquals, assertRejects } from "../lib/assert.ts";
import { inNetnsArgv, ipBatch, ipJson, NFT_BIN, runIp, spawn, spawnCounter } from "./ip.ts";
import { DEFAULT_MARKS, type HostLinkSpec } from "./host_link.ts";
import { configureCommands, DeviceError, IpDeviceLayer, netnsIdentity } from "./mod.ts";
import { vethNames } from "./sim.ts";
import { AddrInfoSchema } from "./ip.ts";
import { LinkSchema } from "./types.ts";
import { SimulatedVpc } from "../tests/support/vpc.ts";
import type { Eni } from "../providers/contract.ts";
import { z } from "zod";
import { poll } from "../lib/async.ts";

const root = Deno.uid() === 0;
const LinkAddrs = z.array(
  z.looseObject({ ...LinkSchema.shape, addr_info: z.array(AddrInfoSchema).default([]) }),
);

/** The device with `mac` in a namespace, with its addresses; null when absent. */
async function linkByMac(netns: string, mac: string) {
  const links = await ipJson(LinkAddrs, ["addr", "show"], { netns });
  return links.find((l) => l.address === mac) ?? null;
}

/** Asserts the ENI's device sits scrubbed on the node under its simulator name. */
async function assertHome(vpc: SimulatedVpc, eni: Eni) {
  const link = await linkByMac(vpc.node.name, eni.mac);
  assert(link, `device ${eni.mac} is on the node`);
  assertEquals(link.ifname, vethNames(eni.mac).node);
  assert(!link.flags.includes("UP"), `device is down: ${link.flags}`);
  assertEquals(link.addr_info, []);
}

/** A device layer on `vpc`'s node, one ENI plugged and pod "a": where most tests start. */
async function onePod(vpc: SimulatedVpc) {
  const devices = new IpDeviceLayer({ node: vpc.node.name });
  const eni = vpc.newEni();
  await vpc.plugEni(eni);
  return { devices, eni, pod: await vpc.pod("a") };
}

function plugArgs(eni: Eni, netns: string, ifName = "eth0") {
  return { mac: eni.mac, netns, ifName, ...SimulatedVpc.plugSpec(eni) };
}

Deno.test("configureCommands() adds up, addresses (IPv6 nodad) and exactly the routes given", () => {
  const cmds = configureCommands({
    ifName: "eth0",
    mtu: 1400,
    addresses: [{ cidr: "10.99.0.10/24" }, { cidr: "fd00:99:0:0::a/64" }],
    routes: [
      { dst: "0.0.0.0/0", gw: "10.99.0.1" },
      { dst: "::/0", gw: "fd00:99::1" },
      { dst: "192.168.0.0/16" },
      { dst: "172.16.0.0/12", gw: "10.99.0.254" },
    ],
  });
  assertEquals(cmds.map((c) => c.join(" ")), [
    "link set dev eth0 mtu 1400",
    "link set dev eth0 up",
    "addr add 10.99.0.10/24 dev eth0",
    "addr add fd00:99::a/64 dev eth0 nodad",
    "route add 0.0.0.0/0 via 10.99.0.1 dev eth0",
    "route add ::/0 via fd00:99::1 dev eth0",
    "route add 192.168.0.0/16 dev eth0",
    "route add 172.16.0.0/12 via 10.99.0.254 dev eth0",
  ]);
});

Deno.test("configureCommands() lets an explicit default route replace the gateway's and rejects bad input", async (t) => {
  await t.step("no address makes a route of its own", () => {
    const cmds = configureCommands({
      ifName: "eth0",
      addresses: [{ cidr: "10.0.0.5/24" }],
      routes: [],
    });
    assertEquals(cmds.filter((c) => c[0] === "route"), []);
  });
  for (
    const [name, p] of [
      ["a bad CIDR", { addresses: [{ cidr: "10.0.0.5" }], routes: [] }],
      ["a route gw of the other family", {
        addresses: [],
        routes: [{ dst: "10.1.0.0/16", gw: "fd00::1" }],
      }],
      ["a bad MTU", { addresses: [], routes: [], mtu: 10 }],
    ] as const
  ) {
    await t.step(name, () => {
      let err: unknown;
      try {
        configureCommands({
          ifName: "eth0",
          ...p,
          addresses: [...p.addresses],
          routes: [...p.routes],
        });
      } catch (e) {
        err = e;
      }
      assert(err instanceof DeviceError && err.step === "validate", String(err));
    });
  }
});

Deno.test({
  name: "plug() moves the ENI into the pod configured: name, MAC, addresses, default routes, pings",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const devices = new IpDeviceLayer({ node: vpc.node.name });
    const [a, b] = [vpc.newEni(), vpc.newEni()];
    await vpc.plugEni(a);
    await vpc.plugEni(b);
    const [pa, pb] = [await vpc.pod("a"), await vpc.pod("b")];
    const ra = await devices.plug(plugArgs(a, pa.path));
    const rb = await devices.plug({ ...plugArgs(b, pb.path, "net1"), mtu: 1400 });
    assertEquals(ra.nodeName, vethNames(a.mac).node);
    assertEquals(rb.nodeName, vethNames(b.mac).node);
    assertEquals(await linkByMac(vpc.node.name, a.mac), null);

    const sa = await devices.inspect({ netns: pa.path, ifName: "eth0" });
    assert(sa.link);
    assertEquals(sa.link.ifname, "eth0");
    assertEquals(sa.link.address, a.mac);
    assertEquals(sa.link.ifindex, ra.podIfindex);
    assertEquals(sa.link.ifalias, ra.nodeName);
    assert(sa.link.flags.includes("UP"));
    assertEquals(sa.addresses.sort(), [`${a.ipv4!.address}/24`, `${a.ipv6!.address}/64`].sort());
    assertEquals(sa.routes, [{ dst: "0.0.0.0/0", gw: "10.99.0.1" }, {
      dst: "::/0",
      gw: "fd00:99::1",
    }]);
    assertEquals((await devices.inspect({ netns: pb.path, ifName: "net1" })).link?.mtu, 1400);

    const found = await devices.findByMac(a.mac, pa.path);
    assertEquals(found?.ifname, "eth0");
    for (
      const [pod, dst] of [[pa, "10.99.0.1"], [pa, "fd00:99::1"], [pb, "10.99.0.1"], [
        pb,
        "fd00:99::1",
      ]] as const
    ) {
      assert(await vpc.ping(pod, dst), `${pod.name} pings ${dst}`);
    }
    assert(await vpc.ping(pa, b.ipv4!.address), "pod a pings pod b over IPv4");
    assert(await vpc.ping(pb, a.ipv6!.address), "pod b pings pod a over IPv6");
  },
});

Deno.test({
  name: "unplug() brings the device home scrubbed under its original name, and is idempotent",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    const { nodeName } = await devices.plug({
      ...plugArgs(eni, pod.path),
      routes: [{ dst: "192.168.0.0/16" }],
    });
    assertEquals(await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path }), "pod");
    await assertHome(vpc, eni);
    assertEquals((await devices.inspect({ netns: pod.path, ifName: "eth0" })).link, null);
    assertEquals(await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path }), "node");
    assertEquals(await devices.unplug({ mac: eni.mac, nodeName, netns: null }), "node");
    await assertHome(vpc, eni);
    // The device is reusable: plug it again.
    await devices.plug(plugArgs(eni, pod.path));
    assert(await vpc.ping(pod, "10.99.0.1"));
    assertEquals(await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path }), "pod");
    await vpc.unplugEni(eni);
    assertEquals(await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path }), "missing");
  },
});

Deno.test({
  name: "plug() fails with ifname_exists when the pod has the name, and leaves nothing behind",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    await ipBatch([["link", "add", "eth0", "type", "veth", "peer", "name", "other"]], {
      netns: pod.name,
    });
    const err = await assertRejects(() => devices.plug(plugArgs(eni, pod.path)));
    assert(err instanceof DeviceError, String(err));
    assertEquals(err.reason, "ifname_exists");
    assert(err.message.includes(`"${pod.path}"`), err.message);
    await assertHome(vpc, eni);
    assertEquals(await linkByMac(pod.name, eni.mac), null);
  },
});

Deno.test({
  name: "plug() moves the device back when configuring it in the pod fails",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    // A gateway outside every connected subnet: the kernel refuses the route.
    const err = await assertRejects(() =>
      devices.plug({
        ...plugArgs(eni, pod.path),
        routes: [{ dst: "192.168.0.0/16", gw: "172.31.0.1" }],
      })
    );
    assert(err instanceof DeviceError, String(err));
    assertEquals([err.step, err.reason], ["configure", "failed"]);
    assert(
      err.message.startsWith(`Cannot configure link "eth0" in netns "${pod.path}": `),
      err.message,
    );
    await assertHome(vpc, eni);
  },
});

/** A host link for `eni` (the node end's name is the test's own: the node is the VPC's). */
function hostLinkFor(eni: Eni): HostLinkSpec {
  return {
    nodeIfName: "enimhtest000001",
    podIfName: "host0",
    nodeMac: "0e:01:02:03:04:05",
    podMac: "0a:01:02:03:04:05",
    alias: "enim:c1/eth0",
    podAddresses: { ipv4: eni.ipv4!.address },
    nodeSource: {},
    routes: [{ dst: "172.30.0.0/16" }],
    table: 0x10000abc,
    marks: DEFAULT_MARKS,
  };
}

const POLICY_TABLE = "table inet enim_policy {\n\tchain x {\n\t}\n}\n";

Deno.test({
  name:
    "plug() with a host link makes the pod's policy text while the device moves (it stays down until that text is loaded), and loads it",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    let calls = 0;
    await devices.plug({
      ...plugArgs(eni, pod.path),
      hostLink: hostLinkFor(eni),
      policyRuleset: async () => {
        calls++;
        // The move does not wait for this text: the device reaches the pod meanwhile,
        // down (nothing configures it before its policy is loaded).
        const moved = await poll(async () => {
          const l = await linkByMac(pod.path, eni.mac);
          return l && !l.flags.includes("UP") ? l : null;
        }, { timeoutMs: 5_000, intervalMs: 5 });
        assert(moved, "the device moved into the pod while its policy's text was made");
        return POLICY_TABLE;
      },
    });
    assertEquals(calls, 1);
    const link = await linkByMac(pod.path, eni.mac);
    assert(link?.flags.includes("UP"), "configured once the text was in");
    const tables = await nftTables(pod.path);
    assert(tables.includes("enim_policy"), tables.join(", "));
  },
});

Deno.test({
  name:
    "plug() fails with the policy text's own error when making it fails once the move has started: the device is home, the host link gone",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    const link = hostLinkFor(eni);
    const own = new Error("the policy's own failure");
    const err = await assertRejects(() =>
      devices.plug({
        ...plugArgs(eni, pod.path),
        hostLink: link,
        policyRuleset: async () => {
          await poll(() => linkByMac(pod.path, eni.mac), { timeoutMs: 5_000, intervalMs: 5 });
          throw own;
        },
      })
    );
    assertEquals(err, own);
    await assertHome(vpc, eni);
    const nodeLinks = await ipJson(LinkAddrs, ["addr", "show"], { netns: vpc.node.name });
    assert(!nodeLinks.some((l) => l.ifname === link.nodeIfName), "no node end left");
    const podLinks = await ipJson(LinkAddrs, ["addr", "show"], { netns: pod.path });
    assertEquals(podLinks.map((l) => l.ifname), ["lo"]);
    assertEquals(await nftTables(pod.path), [], "no table of the plug's in the pod");
  },
});

/** The nftables tables in `netns` (a path), by name. */
async function nftTables(netns: string): Promise<string[]> {
  const { stdout } = await spawn(inNetnsArgv([NFT_BIN, "-j", "list", "tables"], netns));
  const parsed = z.object({
    nftables: z.array(z.looseObject({ table: z.optional(z.object({ name: z.string() })) })),
  }).parse(JSON.parse(stdout));
  return parsed.nftables.flatMap((e) => e.table ? [e.table.name] : []);
}

Deno.test({
  name: "plug() rejects a netns that is no namespace, and a MAC that is not on the node",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const devices = new IpDeviceLayer({ node: vpc.node.name });
    const eni = vpc.newEni();
    const pod = await vpc.pod("a");
    const e1 = await assertRejects(() => devices.plug(plugArgs(eni, "/tmp")));
    assert(e1 instanceof DeviceError && e1.reason === "netns_invalid", String(e1));
    const e2 = await assertRejects(() => devices.plug(plugArgs(eni, pod.path)));
    assert(e2 instanceof DeviceError && e2.reason === "not_found", String(e2));
  },
});

Deno.test({
  name:
    "a pod namespace deleted without unplug destroys the veth ENI; unplug() says missing and the simulator re-plugs it",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    const { nodeName } = await devices.plug(plugArgs(eni, pod.path));
    await vpc.deletePod(pod);
    // The kernel destroys the whole veth pair with the namespace (asynchronously,
    // a few ms after `ip netns del` returns): neither end survives.
    const vpcEnd = async () =>
      (await ipJson(LinkAddrs, ["addr", "show"], { netns: vpc.vpc.name }))
        .some((l) => l.ifname === vethNames(eni.mac).vpc);
    for (let i = 0; i < 100 && await vpcEnd(); i++) await new Promise((r) => setTimeout(r, 20));
    assertEquals(await vpcEnd(), false);
    assertEquals(await linkByMac(vpc.node.name, eni.mac), null);
    assertEquals(await devices.netnsIdentity(pod.path), null);
    assertEquals(await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path }), "missing");
    await vpc.plugEni(eni);
    await assertHome(vpc, eni);
    const pod2 = await vpc.pod("b");
    await devices.plug(plugArgs(eni, pod2.path));
    assert(await vpc.ping(pod2, "fd00:99::1"));
  },
});

Deno.test({
  name:
    "unplug() finds a device the kernel returned to the node under another name and restores it",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const devices = new IpDeviceLayer({ node: vpc.node.name });
    const eni = vpc.newEni();
    await vpc.plugEni(eni);
    const nodeName = vethNames(eni.mac).node;
    // What a physical ENI looks like after its pod namespace was destroyed.
    await ipBatch([
      ["link", "set", "dev", nodeName, "name", "dev7"],
      ["link", "set", "dev", "dev7", "up"],
      ["addr", "add", "10.99.0.200/24", "dev", "dev7"],
    ], { netns: vpc.node.name });
    const pod = await vpc.pod("gone");
    await vpc.deletePod(pod);
    assertEquals(await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path }), "node");
    await assertHome(vpc, eni);
  },
});

Deno.test({
  name: "inspect() reports an address removed inside the pod, and a missing interface",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    await devices.plug(plugArgs(eni, pod.path));
    await runIp(["addr", "del", `${eni.ipv4!.address}/24`, "dev", "eth0"], { netns: pod.name });
    const s = await devices.inspect({ netns: pod.path, ifName: "eth0" });
    assertEquals(s.addresses, [`${eni.ipv6!.address}/64`]);
    assertEquals(s.routes, [{ dst: "::/0", gw: "fd00:99::1" }]);
    assertEquals(await devices.inspect({ netns: pod.path, ifName: "eth9" }), {
      link: null,
      addresses: [],
      routes: [],
    });
  },
});

Deno.test({
  name: "plug(), inspect() and unplug() work on a /proc/<pid>/ns/net path",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    // `ip netns exec` execs the program: the child's pid is the sleeper in the pod.
    const sleeper = new Deno.Command("/usr/sbin/ip", {
      args: ["netns", "exec", pod.name, "/usr/bin/sleep", "30"],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    try {
      const path = `/proc/${sleeper.pid}/ns/net`;
      let id = await netnsIdentity(path);
      for (let i = 0; i < 50 && !(id && id.ino === (await netnsIdentity(pod.path))?.ino); i++) {
        await new Promise((r) => setTimeout(r, 20));
        id = await netnsIdentity(path);
      }
      assertEquals(id, await netnsIdentity(pod.path));
      const { nodeName } = await devices.plug(plugArgs(eni, path));
      assertEquals((await devices.inspect({ netns: path, ifName: "eth0" })).link?.address, eni.mac);
      assertEquals(await devices.unplug({ mac: eni.mac, nodeName, netns: path }), "pod");
      await assertHome(vpc, eni);
    } finally {
      sleeper.kill("SIGKILL");
      await sleeper.status;
    }
  },
});

Deno.test({
  name: "netnsIdentity() accepts nsfs files only, and tells a recreated namespace apart",
  ignore: !root,
  async fn(t) {
    await using vpc = await SimulatedVpc.create();
    const pod = await vpc.pod("a");
    const tmp = await Deno.makeTempFile();
    try {
      await t.step("an nsfs bind mount", async () => {
        const id = await netnsIdentity(pod.path);
        assert(id, "identity of /run/netns/…");
        assertEquals(id.dev, (await Deno.stat("/proc/self/ns/net")).dev);
      });
      await t.step("/proc/<pid>/ns/net", async () => {
        assertEquals(
          await netnsIdentity(`/proc/${Deno.pid}/ns/net`),
          await netnsIdentity("/proc/self/ns/net"),
        );
      });
      for (
        const [name, path] of [
          ["a regular file", tmp],
          ["a directory", "/tmp"],
          ["a missing path", `/run/netns/${pod.name}-missing`],
          ["a relative path", `run/netns/${pod.name}`],
          ["a path with ..", `/run/netns/../netns/${pod.name}`],
        ]
      ) {
        await t.step(name, async () => assertEquals(await netnsIdentity(path), null));
      }
      await t.step("the same path after ip netns del + add", async () => {
        const before = await netnsIdentity(pod.path);
        await runIp(["netns", "del", pod.name]);
        await runIp(["netns", "add", pod.name]);
        const after = await netnsIdentity(pod.path);
        assert(before && after);
        assertNotEquals(after, before);
      });
    } finally {
      await Deno.remove(tmp);
    }
  },
});

Deno.test({
  name: "unplug of a device an ADD placed takes one spawn, by its altname, MAC restored",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    let { nodeName } = await devices.plug(plugArgs(eni, pod.path));
    const inPod = await linkByMac(pod.name, eni.mac);
    assertEquals(
      (inPod as { altnames?: string[] }).altnames,
      [`enim${eni.mac.replaceAll(":", "")}`],
      "the ADD gave the device its altname",
    );
    // A chained plugin changed the MAC: one spawn brings it home with its own again.
    await ipBatch([["link", "set", "dev", "eth0", "address", "02:5a:00:00:00:42"]], {
      netns: pod.name,
    });
    let n0 = spawnCounter.count;
    assertEquals(
      await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path, podName: "eth0" }),
      "pod",
    );
    assertEquals(spawnCounter.count - n0, 1);
    await assertHome(vpc, eni);
    // Plugged again (the altname is still on the device: the ADD does not fail on it).
    ({ nodeName } = await devices.plug(plugArgs(eni, pod.path)));
    // Without its altname (removed by someone), the device is looked up and still comes home.
    await ipBatch([[
      "link",
      "property",
      "del",
      "dev",
      "eth0",
      "altname",
      `enim${eni.mac.replaceAll(":", "")}`,
    ]], { netns: pod.name });
    n0 = spawnCounter.count;
    assertEquals(
      await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path, podName: "eth0" }),
      "pod",
    );
    assertEquals(spawnCounter.count - n0, 3, "the direct try, a look in the pod, the move back");
    await assertHome(vpc, eni);
  },
});

Deno.test({
  name:
    "unplug through a /proc/<pid>/ns/net path never takes another pod's eth0 by its name; the ENI's device is found on the node",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    // A process of another pod (its PID reused since the ADD) in a namespace whose eth0
    // carries no mark of enim; the ENI's own device is on the node.
    await ipBatch([["link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]], {
      netns: pod.name,
    });
    const theirs = (await ipJson(z.array(LinkSchema), ["link", "show", "dev", "eth0"], {
      netns: pod.name,
    }))[0];
    const sleeper = new Deno.Command("/usr/sbin/ip", {
      args: ["netns", "exec", pod.name, "sleep", "60"],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    try {
      const path = `/proc/${sleeper.pid}/ns/net`;
      await poll(
        async () =>
          (await netnsIdentity(path))?.ino === (await netnsIdentity(pod.path))?.ino || null,
        {
          timeoutMs: 5000,
          intervalMs: 20,
        },
      );
      const nodeName = vethNames(eni.mac).node;
      assertEquals(
        await devices.unplug({ mac: eni.mac, nodeName, netns: path, podName: "eth0" }),
        "node",
      );
      const left = await linkByMac(pod.name, theirs.address!);
      assertEquals([left?.ifname, left?.address], ["eth0", theirs.address]);
      await assertHome(vpc, eni);
    } finally {
      sleeper.kill("SIGKILL");
      await sleeper.status;
    }
  },
});

Deno.test({
  name: "plug + unplug take 3 spawns once the device's name is known (median time of 20 printed)",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await onePod(vpc);
    const times: number[] = [];
    const spawns: number[] = [];
    for (let i = 0; i < 20; i++) {
      const n0 = spawnCounter.count;
      const t0 = performance.now();
      const { nodeName } = await devices.plug(plugArgs(eni, pod.path));
      await devices.unplug({ mac: eni.mac, nodeName, netns: pod.path, podName: "eth0" });
      times.push(performance.now() - t0);
      spawns.push(spawnCounter.count - n0);
    }
    times.sort((x, y) => x - y);
    // The first plug looks the device up; after that, a move, a configure and a move back
    // (by the device's altname: no look in the pod).
    assertEquals(spawns[0], 4);
    assertEquals(new Set(spawns.slice(1)), new Set([3]));
    console.log(
      `plug+unplug: ${spawns[1]} spawns, median ${times[10].toFixed(1)} ms (min ${
        times[0].toFixed(1)
      }, max ${times[19].toFixed(1)})`,
    );
    await assertHome(vpc, eni);
  },
});
