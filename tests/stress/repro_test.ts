/**
 * Deterministic reproductions of what the stress run found, one kill-free
 * sequence each (root), kept as regression tests once fixed.
 *
 * 1. A namespace deleted and created again at the same path can get the same nsfs
 *    inode (the kernel reuses proc inode numbers), so the identity recorded at ADD
 *    (device and inode) matches a different namespace. A DEL of the older
 *    container, with that path, then takes the newer container's `eth0` (found by
 *    name, its MAC "restored" to the older ENI's) out of the live pod. Fixed: a
 *    device found only by its pod name must carry no mark of another ENI (its
 *    alias, its `enim<MAC>` altname; `netns/commands.ts` pickDevice).
 */
import { z } from "zod";
import { assertEquals } from "../../lib/assert.ts";
import { ipJson } from "../../netns/ip.ts";
import { SimulatedNode } from "../support/node.ts";

const AS_ROOT = Deno.uid() === 0;

const Links = z.array(z.looseObject({ ifname: z.string(), address: z.string().optional() }));

Deno.test({
  name: "a DEL through a path re-created with the same inode leaves the newer pod's eth0 alone",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 3 }, gc: { graceSeconds: 3600 } });
    const add = (containerId: string, netns: string) =>
      node.client.add({
        containerId,
        ifName: "eth0",
        netns,
        network: "repro",
        pod: { namespace: "repro", name: "p" },
        mode: "interface",
      });
    let pod = await node.vpc.pod("p");
    const inode = (await Deno.stat(pod.path)).ino;
    const old = await add("c-old", pod.path);
    // Re-create the namespace at the same path until the kernel hands it the same inode
    // (it reuses the lowest free proc inode number; other namespaces created on the
    // machine meanwhile can take it, so this may need many tries or not happen).
    let same = false;
    for (let i = 0; i < 400 && !same; i++) {
      await node.vpc.deletePod(pod);
      await new Promise((r) => setTimeout(r, 20));
      pod = await node.vpc.pod("p");
      same = (await Deno.stat(pod.path)).ino === inode;
    }
    if (!same) {
      console.warn("the kernel did not reuse the namespace's inode in 400 tries: nothing shown");
      return;
    }
    const current = await add("c-new", pod.path);
    await node.client.del({ containerId: "c-old", ifName: "eth0", netns: pod.path });
    const inPod = await ipJson(Links, ["link", "show"], { netns: pod.name });
    assertEquals(
      inPod.filter((l) => l.ifname !== "lo").map((l) => [l.ifname, l.address]),
      [["eth0", current.mac]],
      `the newer container's device stays in its pod (the older one had ${old.mac})`,
    );
    const atts = await node.client.attachments();
    assertEquals(atts.map((a) => [a.containerId, a.state]), [["c-new", "ready"]]);
  },
});
