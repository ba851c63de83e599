/**
 * The two-node harness (`support/zone_cluster.ts`) that the zone-sticky end-to-end
 * test and `deno task stress --zone` share: its `settle()` must mean that the
 * kernel matches the cloud. The fake cloud answers an attach or a detach with the
 * new status before it plugs or unplugs the ENI's device (as a cloud's hot-plug
 * lags its API); here each device change is made to lag by a second, so a settle
 * that looked only at the statuses would return with the device still to come or
 * still there.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { INSTANCES, ZoneCluster } from "./support/zone_cluster.ts";
import { checkZone, readZoneViews } from "./stress/mod.ts";

const ROOT = Deno.uid() === 0;

Deno.test({
  name:
    "ZoneCluster.settle() returns once the cloud's device plugs and unplugs are done, so an out-of-band attach and delete leave no device astray",
  ignore: !ROOT,
  async fn() {
    await using cluster = await ZoneCluster.start({ logLevel: "info" });
    await cluster.fake.deviceDelay(1000);
    const onB = async (mac: string) => {
      const views = await readZoneViews(cluster);
      const b = views.nodes.find((n) => n.label === "B")!;
      return {
        views,
        onNode: b.kernel.node.links.some((l) => l.mac === mac),
        vpcEnd: b.kernel.vpcEnds.has(mac),
      };
    };

    const eniId = await cluster.fake.attachNewOutOfBand(INSTANCES.B);
    const mac = (await cluster.cloudEni(eniId))!.macAddress.toLowerCase();
    await cluster.settle();
    const plugged = await onB(mac);
    assert(plugged.onNode && plugged.vpcEnd, `The device of ${eniId} is not plugged into node B`);

    await cluster.fake.outOfBand("delete", eniId);
    await cluster.settle();
    const gone = await onB(mac);
    assertEquals(
      [gone.onNode, gone.vpcEnd],
      [false, false],
      `The device of ${eniId} is still there`,
    );
    assertEquals(checkZone(gone.views).map((v) => `${v.class} ${v.subject}`), []);
  },
});
