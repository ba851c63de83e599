import { assert, assertEquals, assertStringIncludes, assertThrows } from "../lib/assert.ts";
import { DEFAULT_SOCKET } from "../api/wire.ts";
import { DEFAULT_LOG_FILE, detectMode, parseNetworkConfig } from "./config.ts";
import { CniError } from "./errors.ts";

function failsWith(value: unknown, code: number): string {
  const err = assertThrows(() => parseNetworkConfig(value));
  assert(err instanceof CniError, String(err));
  assertEquals(err.code, code, err.message);
  return err.message;
}

Deno.test("detectMode() tells interface mode from IPAM mode", async (t) => {
  const cases: [string, Record<string, unknown>, "interface" | "ipam" | 7][] = [
    ["top-level type enim", { type: "enim" }, "interface"],
    ["top-level enim with an enim ipam", { type: "enim", ipam: { type: "enim" } }, "interface"],
    ["ipam enim under bridge", { type: "bridge", ipam: { type: "enim" } }, "ipam"],
    ["the seed's example: ipam enim, no top-level type", { ipam: { type: "enim" } }, "ipam"],
    ["neither", { type: "bridge", ipam: { type: "host-local" } }, 7],
    ["nothing", {}, 7],
    ["ipam not an object", { ipam: "enim" }, 7],
  ];
  for (const [name, cfg, want] of cases) {
    await t.step(name, () => {
      if (want === 7) {
        const err = assertThrows(() => detectMode(cfg));
        assert(err instanceof CniError);
        assertEquals(err.code, 7);
      } else {
        assertEquals(detectMode(cfg), want);
      }
    });
  }
});

Deno.test("parseNetworkConfig() accepts the seed's example and fills enim's defaults", () => {
  const p = parseNetworkConfig({
    cniVersion: "1.0.10",
    name: "examplenet",
    ipam: { type: "enim" },
  });
  assertEquals(p.mode, "ipam");
  assertEquals(p.enim.agentSocket, DEFAULT_SOCKET);
  assertEquals(p.enim.logFile, DEFAULT_LOG_FILE);
  assertEquals(p.enim.timeoutSeconds, 30);
  assertEquals(p.enim.routes, []);
  assertEquals(p.enim.mtu, undefined);
});

Deno.test("parseNetworkConfig() reads enim's fields from enim's own section", async (t) => {
  await t.step("interface mode: top level", () => {
    const p = parseNetworkConfig({
      cniVersion: "1.1.0",
      name: "n",
      type: "enim",
      agentSocket: "/run/enim/other.sock",
      mtu: 9000,
      routes: [{ dst: "10.0.0.0/8" }, { dst: "::/0", gw: "2001:db8::1" }],
    });
    assertEquals(p.mode, "interface");
    assertEquals(p.enim.agentSocket, "/run/enim/other.sock");
    assertEquals(p.enim.mtu, 9000);
    assertEquals(p.enim.routes.length, 2);
  });
  await t.step(
    "IPAM mode: under ipam, and the other plugin's top-level fields are not read",
    () => {
      const p = parseNetworkConfig({
        cniVersion: "1.1.0",
        name: "n",
        type: "bridge",
        mtu: 1400,
        routes: "the bridge's business",
        ipam: { type: "enim", timeoutSeconds: 5, routes: [{ dst: "0.0.0.0/0" }] },
      });
      assertEquals(p.mode, "ipam");
      assertEquals(p.enim.mtu, undefined);
      assertEquals(p.enim.timeoutSeconds, 5);
      assertEquals(p.enim.routes, [{ dst: "0.0.0.0/0" }]);
    },
  );
  await t.step("unknown fields are kept", () => {
    const p = parseNetworkConfig({ cniVersion: "1.1.0", name: "n", type: "enim", extra: { a: 1 } });
    assertEquals(p.config.extra, { a: 1 });
  });
});

Deno.test("parseNetworkConfig() refuses invalid configs with code 7 naming the field", async (t) => {
  const base = { cniVersion: "1.1.0", name: "n", type: "enim" };
  const cases: [string, Record<string, unknown>, string][] = [
    ["no name", { cniVersion: "1.1.0", type: "enim" }, "name"],
    ["a bad name", { ...base, name: "-x" }, "name"],
    ["no cniVersion", { name: "n", type: "enim" }, "cniVersion"],
    ["a route without CIDR", { ...base, routes: [{ dst: "10.0.0.1" }] }, "routes.0.dst"],
    ["a route with a bad gw", { ...base, routes: [{ dst: "0.0.0.0/0", gw: "x" }] }, "routes.0.gw"],
    ["an MTU too small", { ...base, mtu: 10 }, "mtu"],
    ["a relative socket", { ...base, agentSocket: "enim.sock" }, "agentSocket"],
    ["a bad args.cni.ips", { ...base, args: { cni: { ips: ["10.0.0.300"] } } }, "args.cni.ips"],
    ["a bad ipRanges", { ...base, runtimeConfig: { ipRanges: [{ subnet: "x" }] } }, "ipRanges"],
    [
      "a bad IPAM-mode field",
      { cniVersion: "1.1.0", name: "n", ipam: { type: "enim", timeoutSeconds: -1 } },
      "ipam.timeoutSeconds",
    ],
    [
      "bad valid-attachments",
      { ...base, "cni.dev/valid-attachments": [{ containerID: 1 }] },
      "cni.dev/valid-attachments",
    ],
  ];
  for (const [name, cfg, field] of cases) {
    await t.step(name, () => assertStringIncludes(failsWith(cfg, 7), field));
  }
});

Deno.test("parseNetworkConfig() refuses another IPAM under enim as interface plugin (code 2)", () => {
  const msg = failsWith(
    { cniVersion: "1.1.0", name: "n", type: "enim", ipam: { type: "host-local" } },
    2,
  );
  assertStringIncludes(msg, "ipam.type");
  assertStringIncludes(msg, "host-local");
});
