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
 * 2. A CNI GC whose valid list was taken before an ADD answered (sent beside ADDs, as
 *    `deno task stress --stale-gc` does; issue 25 point 1) took the attachment of a pod
 *    that had just started: its CHECK then answered "not known to the agent" while the
 *    pod kept its device. Fixed: the list alone never takes an attachment younger than
 *    the grace period (`manager/gc.ts`).
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

Deno.test({
  name: "a CNI GC whose list predates an ADD leaves the pod that has just started its ENI",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({
      mock: { enis: 3 },
      gc: { graceSeconds: 60 },
    });
    const older = await node.vpc.pod("older");
    await node.add(older);
    // The runtime's list names the attachments it knew when it took it: only "older".
    const stale = node.netconf("1.1.0", {
      "cni.dev/valid-attachments": [{ containerID: "c-older", ifname: "eth0" }],
    });
    // Then a pod starts and its ADD answers, and then the GC with that list arrives.
    const young = await node.vpc.pod("young");
    const added = await node.add(young);
    const gc = await node.cni("GC", { config: stale });
    assertEquals(gc.code, 0, gc.stdout + gc.stderr);
    const check = await node.cni("CHECK", {
      ...node.podCall(young),
      config: node.netconf("1.1.0", { prevResult: added }),
    });
    assertEquals(
      check.code,
      0,
      `CHECK of the young pod: ${check.stdout}${check.stderr}`,
    );
    assertEquals(
      (await node.client.attachments()).map((a) => [a.containerId, a.state])
        .sort(),
      [["c-older", "ready"], ["c-young", "ready"]],
    );
    const log = await node.agentLog();
    assertEquals(
      log.includes("GC leaves a young attachment a CNI GC did not list"),
      true,
      "the agent logs what it left and why",
    );
  },
});
