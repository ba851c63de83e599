import { assertEquals, assertMatch } from "../lib/assert.ts";
import {
  type CheckExpected,
  type CheckLive,
  checkProblems,
  type CheckRecord,
  routeKey,
} from "./check.ts";

const RECORD: CheckRecord = {
  mode: "interface",
  mac: "02:e1:0a:00:00:01",
  nodeName: "ens5",
  addresses: ["10.99.0.2/24", "fd00:99::2/64"],
  netns: { dev: 4, ino: 4026532500 },
};
const LIVE: CheckLive = {
  netns: { dev: 4, ino: 4026532500 },
  link: { ifindex: 3, ifname: "eth0", address: "02:e1:0a:00:00:01", ifalias: "ens5", flags: [] },
  addresses: ["10.99.0.2/24", "fd00:99:0::2/64"],
  routes: [
    { dst: "0.0.0.0/0", gw: "10.99.0.1" },
    { dst: "::/0", gw: "fd00:99::1" },
    { dst: "10.99.0.0/24" },
  ],
};
const EXPECTED: CheckExpected = {
  mac: "02:E1:0A:00:00:01",
  addresses: ["10.99.0.2/24", "fd00:99::2/64"],
  routes: [{ dst: "0.0.0.0/0", gw: "10.99.0.1" }, { dst: "::/0", gw: "fd00:99::1" }],
};
const WHERE = { ifName: "eth0", netns: "/run/netns/p" };

Deno.test("checkProblems() passes a pod exactly as the prevResult says", () => {
  assertEquals(checkProblems(RECORD, EXPECTED, LIVE, WHERE), []);
});

Deno.test("checkProblems() accepts what later plugins changed and the prevResult reflects", async (t) => {
  const cases: [string, Partial<CheckExpected>, Partial<CheckLive>][] = [
    ["tuning changed the MAC", { mac: "02:5a:00:00:00:42" }, {
      link: { ...LIVE.link!, address: "02:5a:00:00:00:42" },
    }],
    ["a route removed and left out of the result", { routes: [EXPECTED.routes[0]] }, {
      routes: [LIVE.routes[0]],
    }],
    ["an address added and listed", {
      addresses: [...EXPECTED.addresses, "10.99.0.250/24"],
    }, { addresses: [...LIVE.addresses, "10.99.0.250/24"] }],
    ["an extra address the result does not list", {}, {
      addresses: [...LIVE.addresses, "192.0.2.9/32"],
    }],
    ["an address of enim removed and left out of the result", {
      addresses: ["10.99.0.2/24"],
    }, { addresses: ["10.99.0.2/24"] }],
  ];
  for (const [name, exp, live] of cases) {
    await t.step(name, () => {
      assertEquals(
        checkProblems(RECORD, { ...EXPECTED, ...exp }, { ...LIVE, ...live }, WHERE),
        [],
      );
    });
  }
});

Deno.test("checkProblems() names what the prevResult says and the pod lacks", async (t) => {
  const cases: [string, Partial<CheckExpected>, Partial<CheckLive> | null, RegExp][] = [
    ["the namespace is gone", {}, { netns: null }, /does not exist/],
    ["the namespace was replaced", {}, { netns: { dev: 4, ino: 1 } }, /not the namespace/],
    ["the interface is missing", {}, { link: null }, /"eth0" in "\/run\/netns\/p" is missing/],
    ["another device under the name", {}, {
      link: { ...LIVE.link!, address: "02:00:00:00:00:09", ifalias: undefined },
    }, /not the ENI's device/],
    ["a MAC other than the prevResult's", { mac: "02:00:00:00:00:07" }, {}, /the prevResult says/],
    ["an address of the prevResult is missing", {}, {
      addresses: ["10.99.0.2/24"],
    }, /lacks address fd00:99::2\/64/],
    ["a route of the prevResult is missing", {}, {
      routes: [LIVE.routes[1]],
    }, /lacks route 0\.0\.0\.0\/0 via 10\.99\.0\.1/],
    ["a route's gateway differs", {}, {
      routes: [{ dst: "0.0.0.0/0", gw: "10.99.0.254" }, LIVE.routes[1]],
    }, /lacks route 0\.0\.0\.0\/0/],
  ];
  for (const [name, exp, live, re] of cases) {
    await t.step(name, () => {
      const problems = checkProblems(
        RECORD,
        { ...EXPECTED, ...exp },
        live === null ? null : { ...LIVE, ...live },
        WHERE,
      );
      assertEquals(problems.length > 0, true, name);
      assertMatch(problems[0], re);
    });
  }
});

Deno.test("checkProblems() in IPAM mode: the prevResult's addresses must be the ENI's", () => {
  const ipam = { ...RECORD, mode: "ipam" as const };
  assertEquals(checkProblems(ipam, { addresses: ["10.99.0.2/24"], routes: [] }, null, WHERE), []);
  assertMatch(
    checkProblems(ipam, { addresses: ["10.99.0.9/24"], routes: [] }, null, WHERE)[0],
    /10\.99\.0\.9\/24 of the prevResult is not the ENI's/,
  );
});

Deno.test("routeKey() names both defaults by family and compares gateways canonically", () => {
  assertEquals(routeKey({ dst: "default", gw: "fd00::1" }), "default6 via fd00::1");
  assertEquals(routeKey({ dst: "::/0", gw: "fd00:0::1" }), "default6 via fd00::1");
  assertEquals(routeKey({ dst: "0.0.0.0/0" }), "default4");
  assertEquals(routeKey({ dst: "10.0.0.0/8", gw: "10.0.0.1" }), "10.0.0.0/8 via 10.0.0.1");
});
