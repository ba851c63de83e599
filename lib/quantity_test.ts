import { assert, assertEquals } from "./assert.ts";
import fc from "fast-check";
import { parseQuantity } from "./quantity.ts";

const value = (s: string) => {
  const r = parseQuantity(s);
  if (!r.ok) throw new Error(`"${s}" was refused: ${r.reason}`);
  return r.value;
};

Deno.test("parseQuantity() reads what kubelet reads, as apimachinery's Value() rounds it", async (t) => {
  const cases: [string, bigint][] = [
    ["10M", 10_000_000n],
    ["1G", 1_000_000_000n],
    ["500k", 500_000n],
    ["1k", 1000n],
    ["1000", 1000n],
    ["1Ki", 1024n],
    ["1Mi", 1_048_576n],
    ["1.5Gi", 1_610_612_736n],
    ["1.5M", 1_500_000n],
    ["1e3", 1000n],
    ["1E3", 1000n],
    ["1e+3", 1000n],
    ["12e6", 12_000_000n],
    ["1P", 10n ** 15n],
    ["1E", 10n ** 18n],
    ["+10M", 10_000_000n],
    ["-10M", -10_000_000n],
    [".5k", 500n],
    ["1.G", 1_000_000_000n],
    ["007k", 7000n],
    // Value() rounds up, away from zero.
    ["0.5", 1n],
    ["999.5", 1000n],
    ["1.0001k", 1001n],
    ["100m", 1n],
    ["1n", 1n],
    ["1u", 1n],
    ["1e-3", 1n],
    ["0", 0n],
    ["0.0", 0n],
    // Binary quantities are capped at 2^63 − 1.
    ["16Ei", 2n ** 63n - 1n],
    ["9223372036854775807", 2n ** 63n - 1n],
  ];
  for (const [text, want] of cases) {
    await t.step(`"${text}" is ${want}`, () => assertEquals(value(text), want));
  }
});

Deno.test("parseQuantity() refuses what apimachinery refuses, saying why", async (t) => {
  for (
    const text of [
      "",
      "10 M",
      " 10M",
      "10M ",
      "10Mb",
      "10MB",
      "1K",
      "1KB",
      "1KiB",
      "1i",
      "1e",
      "1ee3",
      "1.2.3",
      "10+5",
      "ten",
      "10Mbit",
      "0x10",
      "1_000",
      "1,5M",
    ]
  ) {
    await t.step(JSON.stringify(text), () => {
      const r = parseQuantity(text);
      assert(!r.ok, `"${text}" was accepted`);
      assert(r.reason.length > 0);
    });
  }
});

Deno.test("parseQuantity() refuses values past int64 rather than wrapping them as Go does", () => {
  for (const text of ["9223372036854775808", "1e30", "10E", "1e4294967299"]) {
    assert(!parseQuantity(text).ok, text);
  }
});

Deno.test("parseQuantity() of an integer and a decimal suffix is the exact product", () => {
  const suffixes: [string, bigint][] = [
    ["", 1n],
    ["k", 1000n],
    ["M", 10n ** 6n],
    ["G", 10n ** 9n],
    ["T", 10n ** 12n],
    ["Ki", 1024n],
    ["Mi", 1024n ** 2n],
    ["Gi", 1024n ** 3n],
  ];
  fc.assert(
    fc.property(
      fc.integer({ min: 0, max: 999_999 }),
      fc.constantFrom(...suffixes),
      (n, [suffix, mult]) => value(`${n}${suffix}`) === BigInt(n) * mult,
    ),
  );
});

Deno.test("parseQuantity() of a decimal fraction rounds up to the next integer", () => {
  fc.assert(
    fc.property(
      fc.integer({ min: 0, max: 10 ** 9 }),
      fc.integer({ min: 1, max: 999 }),
      (int, frac) => {
        const text = `${int}.${String(frac).padStart(3, "0")}`;
        return value(text) === BigInt(int) + 1n && value(`${text}k`) === BigInt(int) * 1000n +
              BigInt(frac);
      },
    ),
  );
});
