import { assertEquals } from "../lib/assert.ts";
import { SAMPLE_ADD_RESPONSE } from "../tests/support/fake_agent.ts";
import { buildAddResult } from "./result.ts";
import { convertResult, negotiateVersion, SUPPORTED_VERSIONS } from "./negotiate.ts";

const ctx = { ifName: "eth0", netns: "/run/netns/pod1" };

Deno.test("interface mode: a spec-exact result in every version", async (t) => {
  for (const v of SUPPORTED_VERSIONS) {
    await t.step(v, () => {
      const r = buildAddResult(SAMPLE_ADD_RESPONSE, { ...ctx, mode: "interface" });
      const old = v.startsWith("0.");
      assertEquals(convertResult(r, negotiateVersion(v)), {
        cniVersion: v,
        interfaces: [{ name: "eth0", mac: "02:00:00:00:00:01", sandbox: "/run/netns/pod1" }],
        ips: [
          {
            address: "10.0.1.5/24",
            gateway: "10.0.1.1",
            interface: 0,
            ...(old ? { version: "4" } : {}),
          },
          {
            address: "2001:db8::5/64",
            gateway: "2001:db8::1",
            interface: 0,
            ...(old ? { version: "6" } : {}),
          },
        ],
        routes: [{ dst: "0.0.0.0/0", gw: "10.0.1.1" }],
        dns: {},
      });
    });
  }
});

Deno.test("IPAM mode: the seed's format with an integer ifindex in every version", async (t) => {
  for (const v of SUPPORTED_VERSIONS) {
    await t.step(v, () => {
      const r = buildAddResult(SAMPLE_ADD_RESPONSE, { ...ctx, mode: "ipam" });
      const out = convertResult(r, negotiateVersion(v)) as {
        interfaces: unknown[];
        ips: { interface: unknown; version?: string }[];
      };
      assertEquals(out.interfaces, [{ mac: "02:00:00:00:00:01" }]);
      assertEquals(out.ips.map((ip) => ip.interface), [10, 10]);
      assertEquals(typeof out.ips[0].interface, "number");
      assertEquals(out.ips[0].version, v.startsWith("0.") ? "4" : undefined);
    });
  }
});

Deno.test("interface mode: the MTU is reported on the interface in 1.1.0", () => {
  const r = buildAddResult(SAMPLE_ADD_RESPONSE, { ...ctx, mode: "interface", mtu: 9000 });
  assertEquals(r.interfaces[0].mtu, 9000);
  const out = convertResult(r, negotiateVersion("1.0.0")) as { interfaces: { mtu?: number }[] };
  assertEquals(out.interfaces[0].mtu, undefined);
});

Deno.test("interface mode: chained after a prevResult, enim's entries are appended", () => {
  const r = buildAddResult(SAMPLE_ADD_RESPONSE, {
    ...ctx,
    ifName: "net1",
    mode: "interface",
    prevResult: {
      interfaces: [{ name: "eth0", sandbox: "/run/netns/pod1" }],
      ips: [{ address: "192.168.0.2/24", interface: 0 }],
      routes: [{ dst: "192.168.0.0/16" }],
      dns: { nameservers: ["10.96.0.10"] },
    },
  });
  assertEquals(r.interfaces.map((i) => i.name), ["eth0", "net1"]);
  assertEquals(r.ips.map((ip) => ip.interface), [0, 1, 1]);
  assertEquals(r.routes.length, 2);
  assertEquals(r.dns, { nameservers: ["10.96.0.10"] });
});
