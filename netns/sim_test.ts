import { assertEquals } from "../lib/assert.ts";
import { BRIDGE_MAC, createBridge, createNetns, deleteNetns } from "./sim.ts";
import { ipBatch, ipJson } from "./ip.ts";
import { LinkSchema } from "./types.ts";
import * as z from "zod/mini";

Deno.test({
  name:
    "the VPC bridge keeps its own MAC when a port with a lower one joins (the gateways' MAC never changes under the machines that resolved it)",
  ignore: Deno.uid() !== 0,
  async fn() {
    const ns = `enim-br-${crypto.randomUUID().slice(0, 8)}`;
    await createNetns(ns);
    try {
      await createBridge(ns, "br0", ["10.250.0.1/24", "fd00:250::1/64"]);
      const mac = async () =>
        (await ipJson(z.array(LinkSchema), ["link", "show", "dev", "br0"], { netns: ns }))[0]
          .address;
      assertEquals(await mac(), BRIDGE_MAC);
      // Without a set MAC a bridge takes the lowest of its ports': 02:00:… < 02:fe:….
      await ipBatch([
        ["link", "add", "p1", "address", "02:00:00:00:00:01", "type", "veth", "peer", "name", "q1"],
        ["link", "set", "dev", "p1", "master", "br0", "up"],
      ], { netns: ns });
      assertEquals(await mac(), BRIDGE_MAC);
    } finally {
      await deleteNetns(ns);
    }
  },
});
