import fc from "fast-check";
import { assertEquals } from "./assert.ts";
import { isoTimestamp } from "./timestamp.ts";

const reference = (ms: number) => new Date(ms).toISOString();

Deno.test("isoTimestamp() writes what Date's toISOString() writes at the edges of days, months and years", async (t) => {
  for (
    const ms of [
      0,
      1,
      999,
      -1,
      86_399_999,
      86_400_000,
      951_782_400_000, // 2000-02-29, a leap day of a year divisible by 400
      951_868_799_999,
      4_107_542_400_000, // 2100-03-01, after a 28-day February
      1_798_761_599_999, // 2026-12-31T23:59:59.999Z
      -62_167_219_200_000, // 0000-01-01
      -62_162_035_200_001, // 0000-02-29T23:59:59.999Z
      -30_610_224_000_000, // 1000-01-01
      253_402_300_799_999, // 9999-12-31T23:59:59.999Z
    ]
  ) {
    await t.step(reference(ms), () => assertEquals(isoTimestamp(ms), reference(ms)));
  }
});

Deno.test("isoTimestamp() equals Date's toISOString() for any instant, and leaves Date the rest", () => {
  fc.assert(
    fc.property(fc.integer({ min: -62_167_219_200_000, max: 253_402_300_799_999 }), (ms) => {
      assertEquals(isoTimestamp(ms), reference(ms));
    }),
    { numRuns: 20_000 },
  );
  // Outside 0000–9999 or not an integer: Date's own answer (an expanded year, a truncated ms).
  for (const ms of [-62_167_219_200_001, 253_402_300_800_000, 1.5, 1_700_000_000_000.9]) {
    assertEquals(isoTimestamp(ms), reference(ms));
  }
});
