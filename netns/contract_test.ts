import { type DeviceHarness, deviceLayerContract } from "../tests/support/device_contract.ts";
import { FakeDeviceLayer } from "./fake.ts";
import { IpDeviceLayer } from "./mod.ts";
import { ipBatch } from "./ip.ts";
import { SimulatedVpc } from "../tests/support/vpc.ts";

Deno.test("the fake device layer keeps the device-layer contract", async (t) => {
  await deviceLayerContract(t, () => {
    const layer = new FakeDeviceLayer();
    let n = 0;
    const h: DeviceHarness = {
      layer,
      eni: () => {
        n++;
        const mac = `02:fa:00:00:00:${n.toString(16).padStart(2, "0")}`;
        layer.addNodeLink(mac, `ens${n}`);
        return Promise.resolve({
          mac,
          addresses: [{ cidr: `10.99.0.${n + 1}/24` }],
          routes: [{ dst: "0.0.0.0/0", gw: "10.99.0.1" }],
        });
      },
      pod: () => {
        const path = `/run/netns/fake-pod-${++n}`;
        layer.addNetns(path);
        return Promise.resolve(path);
      },
      notANetns: "/etc/hostname",
      setPodMac: (netns, ifName, mac) => {
        layer.editPodLink(netns, ifName, (l) => (l.mac = mac));
        return Promise.resolve();
      },
      close: () => Promise.resolve(),
    };
    return Promise.resolve(h);
  });
});

Deno.test({
  name: "the real device layer (ip, the kernel) keeps the device-layer contract",
  ignore: Deno.uid() !== 0,
  async fn(t) {
    await deviceLayerContract(t, async () => {
      const vpc = await SimulatedVpc.create();
      let n = 0;
      return {
        layer: new IpDeviceLayer({ node: vpc.node.name }),
        async eni() {
          const eni = vpc.newEni();
          await vpc.plugEni(eni);
          return { mac: eni.mac, ...SimulatedVpc.plugSpec(eni) };
        },
        async pod() {
          return (await vpc.pod(`c${++n}`)).path;
        },
        notANetns: "/etc/hostname",
        async setPodMac(netns, ifName, mac) {
          await ipBatch([["link", "set", "dev", ifName, "address", mac]], { netns });
        },
        close: () => vpc.close(),
      };
    });
  },
});
