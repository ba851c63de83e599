import { assert, assertEquals, assertThrows } from "./assert.ts";
import fc from "fast-check";
import ipaddr from "ipaddr.js";
import {
  canonicalCidr,
  contains,
  familyOf,
  formatIp,
  hasHostBits,
  inRange,
  isCidr,
  isIp,
  isIpMaybePrefix,
  normalizeIp,
  nthAddress,
  overlaps,
  parseCidr,
  parseIp,
} from "./ip.ts";

Deno.test("parseIp() takes dotted quads and every IPv6 form, nothing else", () => {
  for (
    const ok of [
      "10.0.0.1",
      "0.0.0.0",
      "255.255.255.255",
      "::",
      "::1",
      "fd00:99::2",
      "1:2:3:4:5:6:7:8",
      "::ffff:10.1.2.3",
      "FD00::A",
    ]
  ) {
    assert(isIp(ok), ok);
  }
  for (
    const bad of [
      "",
      "10.0.0",
      "10.0.0.256",
      "010.0.0.1",
      "1.2.3.4/24",
      "1:2:3:4:5:6:7:8:9",
      "1::2::3",
      ":::",
      "fe80::1%eth0",
      "12345::",
      "garbage",
      " 10.0.0.1",
    ]
  ) {
    assert(!isIp(bad), bad);
  }
});

Deno.test("formatIp() writes RFC 5952 text, as ipaddr.js does, for any IPv6 address", () => {
  fc.assert(
    fc.property(
      fc.array(fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 0xffff })), {
        minLength: 8,
        maxLength: 8,
      }),
      (groups) => {
        const text = groups.map((g) => g.toString(16)).join(":");
        const ours = normalizeIp(text);
        assertEquals(ours, ipaddr.parse(text).toString(), text);
        assertEquals(normalizeIp(ours), ours);
      },
    ),
    { seed: 20261124, numRuns: 2000 },
  );
  assertEquals(normalizeIp("FD00:0:0::0:1"), "fd00::1");
  assertEquals(normalizeIp("1:0:0:2:0:0:0:3"), "1:0:0:2::3");
  assertEquals(normalizeIp("1:0:0:2:0:0:3:4"), "1::2:0:0:3:4");
  assertEquals(normalizeIp("not an ip"), "not an ip");
  assertEquals(formatIp(parseIp("::ffff:10.1.2.3")!), "::ffff:a01:203");
});

Deno.test("prefixes: parsing, host bits, canonical form, membership, the n-th address", () => {
  assert(isCidr("10.0.0.0/8") && isCidr("::/0") && isCidr("fd00::/128"));
  for (const bad of ["10.0.0.0", "10.0.0.0/33", "::/129", "10.0.0.0/8/1", "x/8", "10.0.0.0/-1"]) {
    assert(!isCidr(bad), bad);
  }
  assert(
    isIpMaybePrefix("10.0.0.1") && isIpMaybePrefix("10.0.0.1/24") &&
      !isIpMaybePrefix("10.0.0.1/40"),
  );
  const c = parseCidr("10.99.0.5/24")!;
  assert(hasHostBits(c));
  assertEquals(canonicalCidr(c), "10.99.0.0/24");
  assert(!hasHostBits(parseCidr("fd00:99::/64")!));
  assertEquals(canonicalCidr(parseCidr("FD00:99:0:0:1::/64")!), "fd00:99::/64");
  assert(contains(c, parseIp("10.99.0.200")!));
  assert(!contains(c, parseIp("10.99.1.1")!));
  assert(!contains(c, parseIp("fd00::1")!), "another family is never in it");
  assert(contains(parseCidr("0.0.0.0/0")!, parseIp("8.8.8.8")!));
  assertEquals(formatIp(nthAddress(parseCidr("fd00:99::/64")!, 2)), "fd00:99::2");
  assertEquals(formatIp(nthAddress(parseCidr("10.99.0.0/24")!, 255)), "10.99.0.255");
  assertThrows(() => nthAddress(parseCidr("10.99.0.0/24")!, 256));
  assertEquals([familyOf("10.0.0.0/8"), familyOf("::1"), familyOf("x")], [4, 6, null]);
});

Deno.test("inRange() checks the subnet and the optional bounds", () => {
  const r = { subnet: "10.99.0.0/24", rangeStart: "10.99.0.10", rangeEnd: "10.99.0.20" };
  assert(inRange("10.99.0.10", r) && inRange("10.99.0.20", r));
  assert(!inRange("10.99.0.9", r) && !inRange("10.99.0.21", r) && !inRange("10.98.0.15", r));
  assert(inRange("fd00:99::3", { subnet: "fd00:99::/64" }));
  assert(!inRange("fd00:99::3", { subnet: "garbage" }));
});

Deno.test("overlaps() is true when two prefixes share an address", () => {
  const c = (s: string) => parseCidr(s)!;
  assertEquals(overlaps(c("10.99.0.0/24"), c("10.99.0.128/25")), true);
  assertEquals(overlaps(c("10.99.0.128/25"), c("10.99.0.0/24")), true);
  assertEquals(overlaps(c("10.98.0.0/24"), c("10.99.0.0/24")), false);
  assertEquals(overlaps(c("fd00::/64"), c("fd00::1/128")), true);
  assertEquals(overlaps(c("10.0.0.0/8"), c("fd00::/8")), false);
});
