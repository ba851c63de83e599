import fc from "fast-check";
import { assertEquals } from "../lib/assert.ts";
import { isIp, normalizeIp, parseIp } from "../lib/ip.ts";
import { addrKey, parseAddr, sortAddrPorts, sortAddrs } from "./_addr.ts";

Deno.test("parseAddr() agrees with lib/ip.ts on what is an address and on its canonical text", () => {
  const texts = fc.oneof(
    fc.ipV4(),
    fc.ipV6(),
    fc.ipV4Extended(),
    fc.string({ unit: fc.constantFrom(..."0123456789abcdefABCDEF:.") }),
  );
  fc.assert(
    fc.property(texts, (s) => {
      const a = parseAddr(s);
      assertEquals(a !== null, isIp(s), s);
      if (a) assertEquals(a.text, normalizeIp(s), s);
    }),
    { numRuns: 3000 },
  );
  for (
    const s of ["::", "::1", "1::", "::ffff:1.2.3.4", "1:0:0:1:0:0:0:1", "FD00:0::A", "fd00::1:2"]
  ) {
    assertEquals(parseAddr(s)?.text, normalizeIp(s), s);
  }
});

Deno.test("address sort keys order by family, then by value", () => {
  fc.assert(
    fc.property(fc.array(fc.oneof(fc.ipV4(), fc.ipV6()), { maxLength: 20 }), (list) => {
      const canon = list.map(normalizeIp);
      const byValue = [...canon].sort((a, b) => {
        const x = parseIp(a)!, y = parseIp(b)!;
        return x.family - y.family || (x.value < y.value ? -1 : x.value > y.value ? 1 : 0);
      });
      assertEquals(sortAddrs(canon), byValue);
    }),
  );
  assertEquals(
    sortAddrPorts([{ addr: "10.0.0.2", port: 1 }, { addr: "10.0.0.1", port: 80 }, {
      addr: "10.0.0.1",
      port: 9,
    }]),
    [{ addr: "10.0.0.1", port: 9 }, { addr: "10.0.0.1", port: 80 }, { addr: "10.0.0.2", port: 1 }],
  );
  assertEquals(addrKey("not an address") > addrKey("ffff::"), true);
});
