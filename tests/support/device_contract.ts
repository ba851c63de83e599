/**
 * The device-layer contract, run against every {@linkcode DeviceLayer}: the fake
 * (`fake.ts`, what the manager's unit tests stand on) and the real one
 * (`IpDeviceLayer` over the kernel, as root). What the fake promises the real
 * layer keeps, so a manager test on the fake says something about the node.
 * The model is the provider contract suite (`tests/support/provider_contract.ts`).
 *
 * @module
 */
import { assert, assertEquals, assertRejects } from "../../lib/assert.ts";
import { DeviceError, type DeviceLayer } from "../../netns/types.ts";
import { installedShaping, shapingProblems } from "../../netns/bandwidth.ts";

/** An ENI's device on the node, ready to be plugged. */
export interface HarnessEni {
  mac: string;
  /** Its addresses and routes as the manager's route policy gives them. */
  addresses: { cidr: string }[];
  routes: { dst: string; gw?: string }[];
}

/** What each layer under test provides. */
export interface DeviceHarness {
  layer: DeviceLayer;
  /** A new ENI whose device is on the node. */
  eni(): Promise<HarnessEni>;
  /** A new pod namespace; its path. */
  pod(): Promise<string>;
  /** A path that exists but is no network namespace. */
  notANetns: string;
  /** Changes the MAC of the pod's interface (what `tuning` does). */
  setPodMac(netns: string, ifName: string, mac: string): Promise<void>;
  close(): Promise<void>;
}

/** Runs the contract as steps of `t` against a fresh harness per step. */
export async function deviceLayerContract(
  t: Deno.TestContext,
  make: () => Promise<DeviceHarness>,
): Promise<void> {
  const step = (name: string, fn: (h: DeviceHarness) => Promise<void>) =>
    t.step(name, async () => {
      const h = await make();
      try {
        await fn(h);
      } finally {
        await h.close();
      }
    });

  await step("plug moves the device into the pod, renamed and configured", async (h) => {
    const eni = await h.eni();
    const pod = await h.pod();
    const before = await h.layer.findByMac(eni.mac);
    assert(before, "the device is on the node before");
    const r = await h.layer.plug({ ...eni, netns: pod, ifName: "eth0" });
    assertEquals(r.nodeName, before.ifname, "the node name is the device's name on the node");
    assertEquals(await h.layer.findByMac(eni.mac), null, "it left the node");
    assertEquals((await h.layer.findByMac(eni.mac, pod))?.ifname, "eth0");
    const state = await h.layer.inspect({ netns: pod, ifName: "eth0" });
    assertEquals(state.link?.address, eni.mac);
    assertEquals(state.link?.ifindex, r.podIfindex);
    assertEquals(state.link?.ifalias, r.nodeName, "the node name is kept as the alias");
    assertEquals(state.addresses.sort(), eni.addresses.map((a) => a.cidr).sort());
    for (const route of eni.routes) {
      assert(
        state.routes.some((x) => x.dst === route.dst && x.gw === route.gw),
        `route ${JSON.stringify(route)} in ${JSON.stringify(state.routes)}`,
      );
    }
  });

  await step("unplug brings it home scrubbed, and says where it found it", async (h) => {
    const eni = await h.eni();
    const pod = await h.pod();
    const { nodeName } = await h.layer.plug({ ...eni, netns: pod, ifName: "eth0" });
    assertEquals(await h.layer.unplug({ mac: eni.mac, nodeName, netns: pod }), "pod");
    const home = await h.layer.findByMac(eni.mac);
    assertEquals(home?.ifname, nodeName);
    assert(!home?.flags.includes("UP"), "down on the node");
    assertEquals((await h.layer.inspect({ netns: pod, ifName: "eth0" })).link, null);
    assertEquals(await h.layer.unplug({ mac: eni.mac, nodeName, netns: pod }), "node");
    assertEquals(await h.layer.unplug({ mac: eni.mac, nodeName, netns: null }), "node");
    assertEquals(
      await h.layer.unplug({ mac: "02:ee:ee:ee:ee:ee", nodeName: "enimnone", netns: pod }),
      "missing",
    );
  });

  await step(
    "unplug finds a device whose MAC a chained plugin changed, and restores it",
    async (h) => {
      const eni = await h.eni();
      const pod = await h.pod();
      const { nodeName } = await h.layer.plug({ ...eni, netns: pod, ifName: "eth0" });
      await h.setPodMac(pod, "eth0", "02:5a:00:00:00:42");
      assertEquals(
        await h.layer.unplug({ mac: eni.mac, nodeName, netns: pod, podName: "eth0" }),
        "pod",
      );
      assertEquals((await h.layer.findByMac(eni.mac))?.ifname, nodeName, "its own MAC again");
    },
  );

  await step("plug into a pod that has the name already: ifname_exists, device home", async (h) => {
    const [a, b] = [await h.eni(), await h.eni()];
    const pod = await h.pod();
    await h.layer.plug({ ...a, netns: pod, ifName: "eth0" });
    const err = await assertRejects(() => h.layer.plug({ ...b, netns: pod, ifName: "eth0" }));
    assert(err instanceof DeviceError, String(err));
    assertEquals(err.reason, "ifname_exists");
    assert(await h.layer.findByMac(b.mac), "the second device is still on the node");
  });

  await step(
    "a path that is no namespace is refused with netns_invalid, before any move",
    async (h) => {
      const eni = await h.eni();
      assertEquals(await h.layer.netnsIdentity(h.notANetns), null);
      const err = await assertRejects(() => h.layer.pin(h.notANetns));
      assert(err instanceof DeviceError && err.reason === "netns_invalid", String(err));
      assert(await h.layer.findByMac(eni.mac), "nothing moved");
    },
  );

  await step(
    "plug shapes the bandwidth it is given, CHECK's reading matches it, unplug leaves nothing",
    async (h) => {
      const eni = await h.eni();
      const pod = await h.pod();
      const bandwidth = {
        ingress: { rate: 10_000_000 },
        egress: { rate: 20_000_000, burst: 80_000 },
      };
      const r = await h.layer.plug({ ...eni, netns: pod, ifName: "eth0", bandwidth });
      assertEquals(r.shaping, installedShaping(bandwidth, 1500), "the bursts as installed");
      const live = await h.layer.inspectShaping({ netns: pod, ifName: "eth0" });
      assertEquals(
        shapingProblems(r.shaping!, live, { ifName: "eth0", netns: pod, mac: eni.mac }),
        [],
      );
      await h.layer.unplug({
        mac: eni.mac,
        nodeName: r.nodeName,
        netns: pod,
        podName: "eth0",
        shapedIngress: true,
      });
      // Plugged again without limits, the device carries none of the last pod's shaping.
      await h.layer.plug({ ...eni, netns: pod, ifName: "eth0" });
      const again = await h.layer.inspectShaping({ netns: pod, ifName: "eth0" });
      assertEquals(again.qdiscs.filter((q) => ["tbf", "ingress"].includes(q.kind)), []);
    },
  );

  await step(
    "pin holds the namespace: identity, and a plug through the pinned handle",
    async (h) => {
      const eni = await h.eni();
      const pod = await h.pod();
      const pinned = await h.layer.pin(pod);
      try {
        assertEquals(pinned.identity, await h.layer.netnsIdentity(pod));
        await h.layer.plug({ ...eni, netns: pinned, ifName: "eth0" });
        assertEquals((await h.layer.findByMac(eni.mac, pod))?.ifname, "eth0");
      } finally {
        pinned.close();
      }
    },
  );
}
