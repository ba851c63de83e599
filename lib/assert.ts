/**
 * Assertions for tests: node:assert/strict stands in for @std/assert.
 *
 * @module
 */
import assert from "node:assert/strict";

/** Deep strict equality. */
export function assertEquals<T>(actual: unknown, expected: T, msg?: string): asserts actual is T {
  if (msg === undefined) assert.deepStrictEqual(actual, expected);
  else assert.deepStrictEqual(actual, expected, msg);
}
/** Strict inequality. */
export function assertNotEquals(actual: unknown, expected: unknown, msg?: string): void {
  if (msg === undefined) assert.notDeepStrictEqual(actual, expected);
  else assert.notDeepStrictEqual(actual, expected, msg);
}
/** Truthiness. */
export function assert_(value: unknown, msg?: string): asserts value {
  if (msg === undefined) assert.ok(value);
  else assert.ok(value, msg);
}
export { assert_ as assert };
/** A string matches a pattern. */
export function assertMatch(actual: string, re: RegExp, msg?: string): void {
  if (msg === undefined) assert.match(actual, re);
  else assert.match(actual, re, msg);
}
/** A string contains a substring. */
export function assertStringIncludes(actual: string, expected: string, msg?: string): void {
  assert.ok(
    actual.includes(expected),
    msg ?? `Expected ${JSON.stringify(actual)} to include ${JSON.stringify(expected)}`,
  );
}
/** A promise rejects (with an instance of `ErrorClass`, when given); returns the error. */
export async function assertRejects<E extends Error = Error>(
  fn: () => Promise<unknown>,
  // deno-lint-ignore no-explicit-any
  errorClassOrMsg?: (new (...args: any[]) => E) | string,
  msg?: string,
): Promise<E> {
  const cls = typeof errorClassOrMsg === "function" ? errorClassOrMsg : undefined;
  const message = typeof errorClassOrMsg === "string" ? errorClassOrMsg : msg;
  try {
    await fn();
  } catch (err) {
    if (cls && !(err instanceof cls)) {
      throw new assert.AssertionError({
        message: message ?? `Expected a ${cls.name}, got ${String(err)}`,
      });
    }
    return err as E;
  }
  throw new assert.AssertionError({ message: message ?? "Expected the promise to reject" });
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
