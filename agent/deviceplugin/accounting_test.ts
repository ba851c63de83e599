/**
 * What the agent's device plugin advertises as pods take ENIs kubelet counts no device
 * for: the plugin as the agent starts it (`startForAgent`), over a manager on the mock
 * cloud and fake devices, against the tests' kubelet with its pod-resources API
 * (tests/support/kubelet). Each kind of consumer: a sticky pod's hold, an ADD in
 * flight (a claim), a pod without a device, IPAM mode, an ENI being parked.
 */
import { assert, assertEquals, assertStringIncludes } from "../../lib/assert.ts";
import { Logger } from "../../lib/log.ts";
import { poll } from "../../lib/async.ts";
import { Metrics } from "../../lib/metrics.ts";
import type { NodeCapacityInput } from "../../providers/contract.ts";
import { withRunDir } from "../../tests/support/run_dir.ts";
import { FakeKubelet } from "../../tests/support/kubelet/fake_kubelet.ts";
import {
  add,
  addReq,
  delReq,
  type Node,
  type NodeOptions,
  withNode,
} from "../../tests/support/manager_fixtures.ts";
import { startForAgent } from "./mod.ts";
import type { DevicePlugin } from "./plugin.ts";
import { lessConsumers, uncountedConsumers } from "./accounting.ts";

interface Harness {
  n: Node;
  kubelet: FakeKubelet;
  plugin: DevicePlugin;
  /** The healthy count and the reasons of the rest, once the plugin has read them again. */
  advertised(): Promise<{ healthy: number; reasons: Record<string, number> }>;
  logs: string[];
}

async function withPlugin(
  fn: (h: Harness) => Promise<void>,
  o: { node?: NodeOptions; podResources?: boolean; capacity?: () => NodeCapacityInput } = {},
): Promise<void> {
  await withNode(async (n) => {
    await withRunDir(async (dir) => {
      const folder = `${dir}/device-plugins`;
      await Deno.mkdir(folder);
      await using kubelet = await FakeKubelet.start(folder, {
        podResources: o.podResources ?? true,
      });
      const logs: string[] = [];
      const provider = o.capacity
        ? { status: () => n.provider.status(), capacity: () => Promise.resolve(o.capacity!()) }
        : n.mock;
      const plugin = await startForAgent({
        enabled: true,
        dir: folder,
        resyncSeconds: 3600, // the test asks for each read (refresh)
        unreachableSeconds: 60,
        registerTimeoutSeconds: 2,
      }, {
        provider,
        consumers: () => n.mgr.attachments().map((a) => ({ pod: a.pod, state: a.state })),
        metrics: new Metrics(),
        log: new Logger((l) => logs.push(l), "debug"),
        ready: () => true,
      });
      try {
        const advertised = async () => {
          await plugin.refresh();
          const s = plugin.status();
          return {
            healthy: s.healthy,
            reasons: Object.fromEntries(s.unhealthyReasons.map((u) => [u.reason, u.devices])),
          };
        };
        await fn({ n, kubelet, plugin, advertised, logs });
      } finally {
        await plugin.close();
      }
    });
  }, { mock: { enis: 4, maxEnisPerNode: 4 }, ...o.node });
}

const pod = (name: string) => ({ namespace: "default", name });

Deno.test("a sticky pod's held ENI is off the healthy devices from its DEL until the pod is back or the hold ends", () =>
  withPlugin(async ({ n, kubelet, advertised }) => {
    await kubelet.admit("default", "db-0", ["eni-0"]);
    await add(n, "a1", { pod: pod("db-0"), sticky: true });
    assertEquals(await advertised(), { healthy: 4, reasons: {} }, "the pod's own device");
    // Deleted: kubelet frees its device; the ENI stays the pod's on this node.
    await kubelet.forget("default", "db-0");
    await n.mgr.del(delReq("a1"));
    assertEquals(await advertised(), { healthy: 3, reasons: { sticky_hold: 1 } });
    // Re-created here: admitted with a device before its ADD, which takes the hold back.
    await kubelet.admit("default", "db-0", ["eni-2"]);
    assertEquals(await advertised(), { healthy: 4, reasons: {} });
    await add(n, "a2", { pod: pod("db-0"), sticky: true });
    assertEquals(await advertised(), { healthy: 4, reasons: {} });
    // Deleted again, and not back within its hold: GC frees the ENI, the device is back.
    await kubelet.forget("default", "db-0");
    await n.mgr.del(delReq("a2"));
    assertEquals((await advertised()).healthy, 3);
    n.clock.advance(10 * 60_000);
    await n.mgr.gc({ dryRun: false });
    assertEquals(await advertised(), { healthy: 4, reasons: {} });
  }));

Deno.test("an attachment of a pod kubelet gives no enim.dev/eni device takes a healthy device, until its DEL is done", () =>
  withPlugin(async ({ n, kubelet, advertised }) => {
    await kubelet.admit("default", "pod-1", ["eni-0"]);
    await add(n, 1);
    // A namespace without the admission policy: kubelet lists the pod, with no device.
    await kubelet.admit("default", "pod-2", []);
    await add(n, 2);
    // podman, or any runtime that is not kubelet's: kubelet does not know the pod.
    await add(n, 3, { pod: { namespace: "podman", name: "web" } });
    assertEquals(await advertised(), { healthy: 2, reasons: { no_device: 2 } });
    // A pod's second interface: one device, two ENIs.
    await add(n, 4, { pod: pod("pod-1"), containerId: "c1", ifName: "eth1" });
    assertEquals(await advertised(), { healthy: 1, reasons: { no_device: 3 } });
    await n.mgr.del(delReq(2));
    await n.mgr.del(delReq(3));
    await n.mgr.del(delReq(1, { ifName: "eth1" }));
    await n.mgr.settled();
    assertEquals(await advertised(), { healthy: 4, reasons: {} });
  }));

Deno.test("an ADD in flight (a claim, an attach) takes its ENI off the healthy devices unless its pod has a device", () =>
  withPlugin(async ({ n, kubelet, advertised }) => {
    n.devices.addNetns("/run/netns/p1");
    n.devices.addNetns("/run/netns/p2");
    // Nothing pre-attached: each ADD waits for its ENI's attach.
    const first = n.mgr.add(addReq(1));
    await kubelet.admit("default", "pod-2", ["eni-1"]);
    const second = n.mgr.add(addReq(2));
    await poll(() => Promise.resolve(n.mgr.attachments().length === 2 || null), {
      timeoutMs: 5000,
      intervalMs: 5,
    });
    assertEquals(n.mgr.attachments().map((a) => a.state), ["adding", "adding"]);
    assertEquals(await advertised(), { healthy: 3, reasons: { no_device: 1 } });
    await Promise.all([first, second]);
    assertEquals(await advertised(), { healthy: 3, reasons: { no_device: 1 } });
  }, { node: { mock: { enis: 4, maxEnisPerNode: 4, preattached: 0, attachLatencyMs: 300 } } }));

Deno.test("an IPAM-mode attachment counts like any other: off the healthy devices unless its pod has a device", () =>
  withPlugin(async ({ n, kubelet, advertised }) => {
    await n.mgr.add(addReq(1, { mode: "ipam", netns: "/dev/null" }));
    assertEquals(await advertised(), { healthy: 3, reasons: { no_device: 1 } });
    await kubelet.admit("default", "pod-1", ["eni-3"]);
    assertEquals(await advertised(), { healthy: 4, reasons: {} });
  }));

Deno.test("a zone-sticky ENI being parked, as the provider reports it, is an Unhealthy device with its reason", () =>
  withPlugin(async ({ plugin, advertised }) => {
    assertEquals(await advertised(), { healthy: 3, reasons: { parking: 1 } });
    const u = plugin.status().unhealthyReasons[0];
    assertStringIncludes(u.message, 'being detached into the VPC ("eni-p1")');
  }, {
    capacity: () => ({
      limit: 4,
      forPods: 3,
      unavailable: [{ reason: "parking", count: 1, eniIds: ["eni-p1"] }],
      source: "test",
    }),
  }));

Deno.test("while kubelet's pod resources cannot be read, a pod with a live attachment counts one device, and the status says why", () =>
  withPlugin(async ({ n, plugin, advertised, logs }) => {
    await add(n, 1);
    await add(n, "a1", { pod: pod("db-0"), sticky: true });
    await n.mgr.del(delReq("a1"));
    assertEquals(await advertised(), { healthy: 3, reasons: { sticky_hold: 1 } });
    assertStringIncludes(plugin.status().reason ?? "", "pod-resources socket");
    await advertised();
    assertEquals(
      logs.filter((l) => l.includes("Cannot read kubelet's pod resources")).length,
      1,
      "logged once",
    );
  }, { podResources: false }));

Deno.test("uncountedConsumers covers a pod's live attachments first, then its hold, then older ones", () => {
  const devices = new Map([["ns/a", 1], ["ns/b", 2]]);
  assertEquals(
    uncountedConsumers([
      { pod: "ns/a", state: "recycling" },
      { pod: "ns/a", state: "ready" },
      { pod: "ns/b", state: "held" },
      { pod: "ns/c", state: "held" },
      { pod: "ns/c", state: "deleting" },
    ], devices),
    [
      { reason: "sticky_hold", count: 1, eniIds: [] },
      { reason: "no_device", count: 2, eniIds: [] },
    ],
  );
  const cap = { limit: 4, forPods: 3, unavailable: [], source: "t" };
  const less = lessConsumers(cap, [{ reason: "no_device", count: 5, eniIds: [] }]);
  assertEquals([less.forPods, less.unavailable[0].count], [0, 3], "never below 0");
  assert(less.forPods <= less.limit);
});
