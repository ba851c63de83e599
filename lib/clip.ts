/**
 * Echoed values, clipped. Error messages and log lines quote what enim was given,
 * and a value can be anything up to megabytes (an annotation, a `CNI_ARGS` pair, a
 * path, a list of groups). Runtimes and kubelet events cut long messages short, so a
 * message puts its reason first and shows only the head of a value, saying how many
 * bytes were left out.
 *
 * No imports: the plugin process loads it (through `log.ts`).
 *
 * @example
 * ```ts
 * import { quote } from "./clip.ts";
 * const value = "g-aaaaaaaa,".repeat(6000);
 * const msg = `Expected at most 10 security groups; got ${quote(value, 24)}`;
 * // Expected at most 10 security groups; got "g-aaaaaaaa,g-aaaaaaaa,g-"… (65976 more bytes left out)
 * ```
 *
 * @module
 */

const encoder = new TextEncoder();

/** How many characters of an echoed value a message shows. */
export const ECHO_CHARS = 120;

/** The longest message or log string kept whole (a last guard at each boundary). */
export const MESSAGE_CHARS = 4096;

/** The first `max` characters of `text`, never splitting a surrogate pair. */
function head(text: string, max: number): string {
  const h = text.slice(0, max);
  return /[\uD800-\uDBFF]$/.test(h) ? h.slice(0, -1) : h;
}

function leftOut(text: string, kept: number): string {
  return `(${encoder.encode(text.slice(kept)).length} more bytes left out)`;
}

/** `text` itself when it has at most `max` characters; else its head, "…" and the bytes left out. */
export function clip(text: string, max: number = ECHO_CHARS): string {
  if (text.length <= max) return text;
  const h = head(text, max);
  return `${h}… ${leftOut(text, h.length)}`;
}

/** `value` quoted as JSON for a message, clipped like {@linkcode clip}. */
export function quote(value: string, max: number = ECHO_CHARS): string {
  if (value.length <= max) return JSON.stringify(value);
  const h = head(value, max);
  return `${JSON.stringify(h)}… ${leftOut(value, h.length)}`;
}

/** The first `n` items joined by `sep`, then how many more there are ("a, b and 3 more"). */
export function listOf(items: readonly string[], n = 5, sep = ", "): string {
  if (items.length <= n) return items.join(sep);
  return `${items.slice(0, n).join(sep)} and ${items.length - n} more`;
}
