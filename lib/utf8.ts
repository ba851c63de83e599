/**
 * UTF-8 decoding for the plugin process, which decodes two small texts per call (its
 * stdin, and the agent's answer): ASCII, which they nearly always are, is read without
 * a `TextDecoder`. A process's first `TextDecoder` (its construction and first decode)
 * costs about 0.2–0.3 ms (measured with `performance.now()` in a fresh `deno run
 * --v8-flags=--lite-mode`, Deno 2.9.6), against about 0.03 ms for the same bytes
 * through `String.fromCharCode`; the plugin's whole start-up beyond an empty `deno run`
 * is a few ms (docs/performance.md). Non-ASCII input, and input past
 * {@linkcode ASCII_SCAN_BYTES}, goes to a `TextDecoder` as before.
 *
 * No imports: the plugin process loads it.
 *
 * @example
 * ```ts
 * import { decodeUtf8 } from "./utf8.ts";
 * decodeUtf8(new Uint8Array([0x68, 0x69])); // "hi"
 * ```
 *
 * @module
 */

/** Inputs up to this many bytes are tried as ASCII first; longer ones go to `TextDecoder`. */
export const ASCII_SCAN_BYTES = 64 * 1024;

/** Bytes per `String.fromCharCode` call (each byte is one argument). */
const CHUNK = 8192;

const NON_ASCII = /[\u0080-\uffff]/;

let decoder: TextDecoder | undefined;

/**
 * `bytes` as text, exactly as `new TextDecoder().decode(bytes)` reads them (UTF-8, an
 * invalid sequence as U+FFFD, a leading byte order mark dropped).
 */
export function decodeUtf8(bytes: Uint8Array): string {
  if (bytes.length <= ASCII_SCAN_BYTES) {
    let text = "";
    for (let at = 0; at < bytes.length; at += CHUNK) {
      text += String.fromCharCode.apply(
        null,
        bytes.subarray(at, at + CHUNK) as unknown as number[],
      );
    }
    // Each byte became one character: none at or above 0x80 means every byte was ASCII.
    if (!NON_ASCII.test(text)) return text;
  }
  decoder ??= new TextDecoder();
  return decoder.decode(bytes);
}
