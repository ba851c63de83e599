/**
 * The host links' node side on the real kernel (issue 33 item 12): what the kernel
 * does to the node's routes over a node end when the node's address goes, what
 * `IpDeviceLayer.hostLinkNodeState` reads of it, that `restoreHostLinkNodeSide` puts it
 * back, and that `watchNodeAddresses` reports the change and ends by its PID.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { ipBatch } from "./ip.ts";
import { IpDeviceLayer } from "./mod.ts";
import { DEFAULT_MARKS, type HostLinkSpec, nodeCommands } from "./host_link.ts";
import type { AddressEvent } from "./types.ts";
import { SimulatedVpc } from "../tests/support/vpc.ts";
import { poll } from "../lib/async.ts";

const root = Deno.uid() === 0;

Deno.test({
  name:
    "the node's routes over a node end: the kernel drops them with the node's address, the layer reads that, restores them, and its address watch reports the change",
  ignore: !root,
  async fn() {
    const vpc = await SimulatedVpc.create();
    try {
      const nic = await vpc.nodeNic();
      const pod = await vpc.pod("a");
      const spec: HostLinkSpec = {
        nodeIfName: "enimhtest0",
        podIfName: "host0",
        nodeMac: "0e:00:00:00:00:01",
        podMac: "0a:00:00:00:00:01",
        alias: "enim:test",
        podAddresses: { ipv4: "10.99.0.77", ipv6: "fd00:99::77" },
        nodeSource: { ipv4: nic.ipv4, ipv6: nic.ipv6 },
        routes: [],
        table: 0x10000077,
        marks: DEFAULT_MARKS,
      };
      await ipBatch(nodeCommands(spec, pod.name), { netns: vpc.node.name });
      const devices = new IpDeviceLayer({ node: vpc.node.name });
      const events: AddressEvent[] = [];
      const watch = devices.watchNodeAddresses((e) => events.push(e));
      try {
        const before = await devices.hostLinkNodeState();
        assertEquals(before.nodeEnds, ["enimhtest0"]);
        assertEquals(before.routes, [
          { dst: "10.99.0.77/32", dev: "enimhtest0", prefsrc: nic.ipv4 },
          { dst: "fd00:99::77/128", dev: "enimhtest0", prefsrc: nic.ipv6 },
        ]);
        assertEquals(before.neighbours.map((n) => [n.dst, n.lladdr]), [
          ["10.99.0.77", "0a:00:00:00:00:01"],
          ["fd00:99::77", "0a:00:00:00:00:01"],
        ]);
        // The watch is up once it reports a change: make one until it does.
        const ready = await poll(async () => {
          await ipBatch([["addr", "replace", "10.254.0.1/32", "dev", "lo"]], {
            netns: vpc.node.name,
          });
          if (events.some((e) => e.ifName === "lo")) return true;
          await ipBatch([["addr", "del", "10.254.0.1/32", "dev", "lo"]], { netns: vpc.node.name });
          return null;
        }, { timeoutMs: 5_000, intervalMs: 50 });
        assert(ready, "the watch reports changes");
        events.length = 0;
        await ipBatch([["addr", "del", `${nic.ipv4}/24`, "dev", "eth0"], [
          "addr",
          "del",
          `${nic.ipv6}/64`,
          "dev",
          "eth0",
        ]], { netns: vpc.node.name });
        const gone = await devices.hostLinkNodeState();
        assertEquals(gone.routes, [{ dst: "fd00:99::77/128", dev: "enimhtest0" }]);
        assertEquals(gone.neighbours.length, 2, "the neighbours stay");
        await ipBatch([["addr", "add", `${nic.ipv4}/24`, "dev", "eth0"], [
          "addr",
          "add",
          `${nic.ipv6}/64`,
          "dev",
          "eth0",
          "nodad",
        ]], { netns: vpc.node.name });
        const seen = await poll(
          () => Promise.resolve(events.filter((e) => e.scope === "global").length >= 4 || null),
          { timeoutMs: 5_000, intervalMs: 20 },
        );
        assert(seen, `the watch reported ${JSON.stringify(events)}`);
        assertEquals(
          events.filter((e) => e.scope === "global").map((e) =>
            `${e.deleted ? "-" : "+"}${e.ifName} ${e.address}`
          ),
          [
            `-eth0 ${nic.ipv4}`,
            `-eth0 ${nic.ipv6}`,
            `+eth0 ${nic.ipv4}`,
            `+eth0 ${nic.ipv6}`,
          ],
        );
        assertEquals(await devices.restoreHostLinkNodeSide([spec]), []);
        assertEquals((await devices.hostLinkNodeState()).routes, before.routes);
        // A node end that is gone: its lines fail, named, and the call does not throw.
        const failed = await devices.restoreHostLinkNodeSide([{
          ...spec,
          nodeIfName: "enimhgone0",
        }]);
        assert(failed.length > 0 && failed[0].includes("enimhgone0"), failed.join("\n"));
      } finally {
        await watch.close();
      }
      assert(/exited with code/.test(await watch.ended), await watch.ended);
    } finally {
      await vpc.close();
    }
  },
});

Deno.test({
  name:
    "the node's addresses leave out kube-ipvs0's (kube-proxy's IPVS mode binds every ClusterIP there), a bridge standing in for its dummy",
  ignore: !root,
  async fn() {
    const vpc = await SimulatedVpc.create();
    try {
      const nic = await vpc.nodeNic();
      await ipBatch([
        ["link", "add", "kube-ipvs0", "type", "bridge"],
        ["addr", "add", "172.30.0.10/32", "dev", "kube-ipvs0"],
        ["addr", "add", "fd00:30::10/128", "dev", "kube-ipvs0", "nodad"],
        ["link", "add", "other0", "type", "bridge"],
        ["addr", "add", "10.250.0.1/32", "dev", "other0"],
      ], { netns: vpc.node.name });
      const devices = new IpDeviceLayer({ node: vpc.node.name });
      const got = await devices.nodeAddresses();
      assert(
        got.addresses.includes(nic.ipv4!) && got.addresses.includes(nic.ipv6!),
        got.addresses.join(),
      );
      assert(got.addresses.includes("10.250.0.1"), "another link's address is the node's");
      assertEquals(got.addresses.filter((a) => a === "172.30.0.10" || a === "fd00:30::10"), []);
    } finally {
      await vpc.close();
    }
  },
});

Deno.test({
  name:
    "readNodeFile() reads a file as the node's namespace shows it (its /proc/net), whole, and null for one that does not exist",
  ignore: !root,
  async fn() {
    const vpc = await SimulatedVpc.create();
    const dir = await Deno.makeTempDir({ prefix: "enim-read-" });
    try {
      await vpc.nodeNic();
      const devices = new IpDeviceLayer({ node: vpc.node.name });
      // The node's own /proc/net: its eth0, which the test process's namespace has not.
      const dev = await devices.readNodeFile("/proc/net/dev");
      assert(dev !== null && /^\s*eth0:/m.test(dev), String(dev));
      const text = "first line\n  -> second, indented\nno newline at the end";
      await Deno.writeTextFile(`${dir}/f`, text);
      assertEquals(await devices.readNodeFile(`${dir}/f`), text + "\n");
      assertEquals(await devices.readNodeFile(`${dir}/missing`), null);
    } finally {
      await Deno.remove(dir, { recursive: true });
      await vpc.close();
    }
  },
});
