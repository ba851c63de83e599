/**
 * Assertions for tests: node:assert/strict stands in for @std/assert.
 *
 * @module
 */
import assert from "node:assert/strict";

/** Deep strict equality. */
export function assertEquals<T>(actual: unknown, expected: T, msg?: string): asserts actual is T {
  assert.deepStrictEqual(actual, expected, msg);
}
/** Strict inequality. */
export function assertNotEquals(actual: unknown, expected: unknown, msg?: string): void {
  assert.notDeepStrictEqual(actual, expected, msg);
}
/** Truthiness. */
export function assert_(value: unknown, msg?: string): asserts value {
  assert.ok(value, msg);
}
export { assert_ as assert };
/** A string matches a pattern. */
export function assertMatch(actual: string, re: RegExp, msg?: string): void {
  assert.match(actual, re, msg);
}
/** A string contains a substring. */
export function assertStringIncludes(actual: string, expected: string, msg?: string): void {
  assert.ok(
    actual.includes(expected),
    msg ?? `Expected ${JSON.stringify(actual)} to include ${JSON.stringify(expected)}`,
  );
}
/** A promise rejects; returns the error for further checks. */
export async function assertRejects(fn: () => Promise<unknown>, msg?: string): Promise<Error> {
  try {
    await fn();
  } catch (err) {
    return err as Error;
  }
  throw new assert.AssertionError({ message: msg ?? "Expected the promise to reject" });
}
/** A function throws; returns the error. */
export function assertThrows(fn: () => unknown, msg?: string): Error {
  try {
    fn();
  } catch (err) {
    return err as Error;
  }
  throw new assert.AssertionError({ message: msg ?? "Expected the function to throw" });
}
