import { assert, assertEquals } from "../lib/assert.ts";
import { ipJson } from "../netns/ip.ts";
import { listNetns, vethNames } from "../netns/sim.ts";
import { LinkSchema } from "../netns/types.ts";
import { SimulatedVpc } from "./support/vpc.ts";
import { z } from "zod";

const root = Deno.uid() === 0;
const Addrs = z.array(
  z.looseObject({
    ...LinkSchema.shape,
    addr_info: z.array(z.looseObject({ local: z.string(), prefixlen: z.number() })),
  }),
);

Deno.test({
  name: "SimulatedVpc builds a node and a VPC with both gateways and removes them on dispose",
  ignore: !root,
  async fn() {
    let names: string[] = [];
    {
      await using vpc = await SimulatedVpc.create();
      names = vpc.namespaces;
      const live = await listNetns();
      for (const n of names) assert(live.includes(n), `namespace "${n}" exists`);
      const [br] = await ipJson(Addrs, ["addr", "show", "dev", vpc.bridge], {
        netns: vpc.vpc.name,
      });
      const local = br.addr_info.map((a) => `${a.local}/${a.prefixlen}`);
      assert(local.includes("10.99.0.1/24"), `bridge holds 10.99.0.1/24: ${local}`);
      assert(local.includes("fd00:99::1/64"), `bridge holds fd00:99::1/64: ${local}`);
      assertEquals(vpc.gateways, { ipv4: "10.99.0.1", ipv6: "fd00:99::1" });
    }
    const live = await listNetns();
    for (const n of names) assert(!live.includes(n), `namespace "${n}" is gone`);
  },
});

Deno.test({
  name:
    "plugEni() makes an ENI a veth with its MAC in the node, idempotently, and unplugEni() removes it",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const eni = vpc.newEni();
    await vpc.plugEni(eni);
    await vpc.plugEni(eni);
    const names = vethNames(eni.mac);
    const onNode = await ipJson(z.array(LinkSchema), ["link", "show"], { netns: vpc.node.name });
    const mine = onNode.filter((l) => l.address === eni.mac);
    assertEquals(mine.map((l) => l.ifname), [names.node]);
    const [vpcEnd] = await ipJson(z.array(LinkSchema), ["link", "show", "dev", names.vpc], {
      netns: vpc.vpc.name,
    });
    assertEquals(vpcEnd.master, vpc.bridge);
    await vpc.unplugEni(eni);
    await vpc.unplugEni(eni);
    const after = await ipJson(z.array(LinkSchema), ["link", "show"], { netns: vpc.node.name });
    assertEquals(after.filter((l) => l.address === eni.mac), []);
  },
});

Deno.test({
  name: "newEni() hands out distinct MACs and addresses in the subnets",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create({ subnets: { ipv4: "10.98.0.0/24" } });
    const a = vpc.newEni();
    const b = vpc.newEni();
    assert(a.mac !== b.mac && a.id !== b.id);
    assertEquals(a.ipv4, { address: "10.98.0.10", prefixLength: 24, gateway: "10.98.0.1" });
    assertEquals(b.ipv4?.address, "10.98.0.11");
    assertEquals(a.ipv6, null);
    assertEquals(SimulatedVpc.plugSpec(a), {
      addresses: [{ cidr: "10.98.0.10/24" }],
      routes: [{ dst: "0.0.0.0/0", gw: "10.98.0.1" }],
    });
  },
});

Deno.test({
  name: "a pod namespace can ping nothing until it has an interface, and pods are removed on close",
  ignore: !root,
  async fn() {
    const vpc = await SimulatedVpc.create();
    try {
      const pod = await vpc.pod("p1");
      assertEquals(pod.path, `/run/netns/${pod.name}`);
      assertEquals(await vpc.ping(pod, "10.99.0.1"), false);
      assert((await vpc.exec(pod, ["/usr/sbin/ip", "link", "show", "lo"])).stdout.includes("UP"));
    } finally {
      await vpc.close();
    }
    await vpc.close();
    const live = await listNetns();
    for (const n of vpc.namespaces) assert(!live.includes(n));
  },
});

Deno.test({
  name:
    "inside the node namespace, the default simulator and device layer plug and unplug (home = Deno.pid)",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const pod = await vpc.pod("a");
    const eni = vpc.newEni();
    const probe = new URL("./support/device_probe.ts", import.meta.url).pathname;
    const arg = JSON.stringify({
      vpcNetns: vpc.vpc.name,
      bridge: vpc.bridge,
      podPath: pod.path,
      eni,
    });
    const out = await vpc.exec(vpc.node, [Deno.execPath(), "run", "-A", "--quiet", probe, arg]);
    assertEquals(out.code, 0, out.stderr);
    const r = JSON.parse(out.stdout);
    const nodeName = vethNames(eni.mac).node;
    assertEquals(r.before.ifname, nodeName);
    assertEquals(r.plugged.nodeName, nodeName);
    assertEquals(r.inPod.link.address, eni.mac);
    assertEquals(r.inPod.addresses.length, 2);
    assertEquals(r.outcome, "pod");
    assertEquals(r.after.ifname, nodeName);
    assertEquals(r.gone, null);
  },
});
