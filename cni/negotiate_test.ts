import { assert, assertEquals, assertStringIncludes, assertThrows } from "../lib/assert.ts";
import { CniError } from "./errors.ts";
import {
  type CniResult,
  convertResult,
  negotiateVersion,
  parsePrevResult,
  SUPPORTED_VERSIONS,
  versionResult,
} from "./negotiate.ts";

Deno.test("negotiateVersion() serves every supported version as itself", async (t) => {
  for (const v of SUPPORTED_VERSIONS) {
    await t.step(v, () => assertEquals(negotiateVersion(v), { requested: v, format: v }));
  }
});

Deno.test("negotiateVersion() maps unseen patch versions to their minor's format", async (t) => {
  const cases: [string, string][] = [
    ["1.0.10", "1.0.0"],
    ["1.1.3", "1.1.0"],
    ["0.4.2", "0.4.0"],
    ["0.3.7", "0.3.1"],
    ["1.0", "1.0.0"],
  ];
  for (const [req, format] of cases) {
    await t.step(`${req} → ${format}`, () => {
      assertEquals(negotiateVersion(req), { requested: req, format });
    });
  }
});

Deno.test("negotiateVersion() refuses other versions with code 1 naming the supported ones", async (t) => {
  for (const v of ["2.0.0", "0.2.0", "0.1.0", "1.2.0", "abc", "", "1.0.0-rc1", "v1.0.0"]) {
    await t.step(JSON.stringify(v), () => {
      const err = assertThrows(() => negotiateVersion(v));
      assert(err instanceof CniError);
      assertEquals(err.code, 1);
      for (const s of SUPPORTED_VERSIONS) assertStringIncludes(err.message, s);
    });
  }
});

Deno.test("versionResult() echoes the version and lists the supported ones", () => {
  assertEquals(versionResult("1.0.10"), {
    cniVersion: "1.0.10",
    supportedVersions: ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
  });
  assertEquals(versionResult(undefined).cniVersion, "1.1.0");
});

const CANONICAL: CniResult = {
  interfaces: [{ name: "eth0", mac: "02:00:00:00:00:01", mtu: 9000, sandbox: "/run/netns/p" }],
  ips: [
    { address: "10.0.1.5/24", gateway: "10.0.1.1", interface: 0 },
    { address: "2001:db8::5/64", gateway: "2001:db8::1", interface: 0 },
  ],
  routes: [{ dst: "0.0.0.0/0", gw: "10.0.1.1", priority: 10 }],
  dns: {},
};

Deno.test("convertResult() writes each version's format", async (t) => {
  for (const v of SUPPORTED_VERSIONS) {
    await t.step(v, () => {
      const out = convertResult(CANONICAL, negotiateVersion(v)) as {
        cniVersion: string;
        interfaces: Record<string, unknown>[];
        ips: Record<string, unknown>[];
        routes: Record<string, unknown>[];
        dns: unknown;
      };
      assertEquals(out.cniVersion, v);
      const old = v.startsWith("0.");
      assertEquals(out.ips.map((ip) => ip.version), old ? ["4", "6"] : [undefined, undefined]);
      assertEquals(out.ips.map((ip) => ip.interface), [0, 0]);
      assertEquals(out.ips.map((ip) => ip.address), ["10.0.1.5/24", "2001:db8::5/64"]);
      const is11 = v === "1.1.0";
      assertEquals(out.interfaces[0].mtu, is11 ? 9000 : undefined);
      assertEquals(
        out.routes[0],
        is11 ? CANONICAL.routes[0] : { dst: "0.0.0.0/0", gw: "10.0.1.1" },
      );
      assertEquals(out.interfaces[0].sandbox, "/run/netns/p");
      assertEquals(out.dns, {});
      // Round trip: what we print parses back as a prevResult of that version.
      const back = parsePrevResult(JSON.parse(JSON.stringify(out)));
      assertEquals(back.ips.map((ip) => ip.address), ["10.0.1.5/24", "2001:db8::5/64"]);
    });
  }
  await t.step("the requested string is echoed for a patch version", () => {
    assertEquals(convertResult(CANONICAL, negotiateVersion("1.0.10")).cniVersion, "1.0.10");
  });
});

Deno.test("parsePrevResult() reads results of every version", async (t) => {
  await t.step("0.3.1 with ips[].version", () => {
    const r = parsePrevResult({
      cniVersion: "0.3.1",
      interfaces: [{ name: "eth0", mac: "m", sandbox: "/x" }],
      ips: [{ version: "4", address: "10.0.0.2/24", gateway: "10.0.0.1", interface: 0 }],
    });
    assertEquals(r.ips, [{ address: "10.0.0.2/24", gateway: "10.0.0.1", interface: 0 }]);
    assertEquals(r.routes, []);
  });
  await t.step("1.1.0 with 1.1 fields and unknown ones kept", () => {
    const r = parsePrevResult({
      cniVersion: "1.1.0",
      interfaces: [{ name: "eth0", mtu: 1500, pciID: "0000:00:01.0", vendorThing: 1 }],
      ips: [],
      routes: [{ dst: "0.0.0.0/0", table: 100 }],
    });
    assertEquals(r.interfaces[0].vendorThing, 1);
    assertEquals(r.routes[0].table, 100);
  });
  await t.step("a malformed prevResult → 7", () => {
    const err = assertThrows(() => parsePrevResult({ ips: [{ address: 5 }] }));
    assert(err instanceof CniError);
    assertEquals(err.code, 7);
    assertStringIncludes(err.message, "prevResult.ips.0.address");
  });
});
