import fc from "fast-check";
import { assertEquals } from "./assert.ts";
import { ASCII_SCAN_BYTES, decodeUtf8 } from "./utf8.ts";

const reference = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
const utf8 = (text: string) => new TextEncoder().encode(text);

Deno.test("decodeUtf8() reads what TextDecoder reads: ASCII, UTF-8, invalid bytes and a BOM", async (t) => {
  for (
    const [name, bytes] of [
      ["empty", new Uint8Array()],
      ["ASCII", utf8('{"cniVersion":"1.0.0"}\n')],
      ["every ASCII byte", Uint8Array.from({ length: 128 }, (_, i) => i)],
      ["two-byte UTF-8", utf8("héllo")],
      ["a surrogate pair", utf8("a😀b")],
      ["a byte order mark", utf8("\uFEFF{}")],
      ["an invalid byte", new Uint8Array([0x61, 0xff, 0x62])],
      ["a truncated sequence", new Uint8Array([0x61, 0xe2, 0x82])],
      ["ASCII across chunks", utf8("x".repeat(20_000))],
      ["non-ASCII past the first chunk", utf8("x".repeat(9000) + "é")],
      ["at the scan bound", utf8("y".repeat(ASCII_SCAN_BYTES))],
      ["past the scan bound", utf8("z".repeat(ASCII_SCAN_BYTES + 1))],
    ] as const
  ) {
    await t.step(name, () => assertEquals(decodeUtf8(bytes), reference(bytes)));
  }
});

Deno.test("decodeUtf8() equals TextDecoder on any bytes and any text", () => {
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 300 }), (bytes) => {
      assertEquals(decodeUtf8(bytes), reference(bytes));
    }),
    { numRuns: 2000 },
  );
  fc.assert(
    fc.property(fc.string({ unit: "binary", maxLength: 200 }), (text) => {
      const bytes = utf8(text);
      assertEquals(decodeUtf8(bytes), reference(bytes));
    }),
    { numRuns: 2000 },
  );
});
