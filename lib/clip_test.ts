import { assertEquals } from "./assert.ts";
import { clip, listOf, quote } from "./clip.ts";

Deno.test("clip() keeps a short value and says how many bytes of a long one were left out", () => {
  assertEquals(clip("abc", 3), "abc");
  assertEquals(clip("abcdef", 3), "abc… (3 more bytes left out)");
  // Bytes, not characters: "é" is two bytes in UTF-8.
  assertEquals(clip("abééé", 2), "ab… (6 more bytes left out)");
  // A surrogate pair is never split.
  assertEquals(clip("a😀b", 2), "a… (5 more bytes left out)");
});

Deno.test("quote() quotes a value as JSON and clips it outside the quotes", () => {
  assertEquals(quote('a"b'), '"a\\"b"');
  assertEquals(quote("x".repeat(65536), 4), '"xxxx"… (65532 more bytes left out)');
});

Deno.test("listOf() names the first items and counts the rest", () => {
  assertEquals(listOf(["a", "b"]), "a, b");
  assertEquals(listOf(["a", "b", "c", "d"], 2), "a, b and 2 more");
  assertEquals(listOf(["a", "b", "c"], 1, "; "), "a and 2 more");
});
