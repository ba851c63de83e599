/**
 * A list's JSON body read as it arrives, one item at a time: a list served from the API
 * server's watch cache (`resourceVersion=0`) is the whole collection in one response,
 * whatever `limit` asked (30,000 pods of ~3.5 KB are ~105 MB of JSON), and `res.json()`
 * would hold that text and every object parsed from it at once, several times the
 * agent's memory budget. Here only the item being read is held as bytes: each is
 * `JSON.parse`d when its closing brace arrives and handed on, so the caller can trim it
 * (kube/objects.ts) before the next comes.
 *
 * The body is a JSON object (`kind`, `apiVersion`, `metadata`, `items`, in any order);
 * every member other than `items` is parsed whole and returned at the end. The scanner
 * tracks only what it must to find an item's end (depth, strings and their escapes) and
 * jumps through strings with `indexOf`, as most of a pod's bytes are inside strings; it
 * does not validate JSON beyond what `JSON.parse` of each piece checks.
 *
 * @module
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;

/** A body that is not the JSON object of a list. */
export class ListBodyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ListBodyError";
  }
}

/** Whether `c` is JSON whitespace. */
function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

/** Bytes of one piece being captured, possibly over several chunks. */
class Capture {
  #parts: Uint8Array[] = [];
  #bytes = 0;

  add(part: Uint8Array): void {
    if (part.length === 0) return;
    this.#parts.push(part);
    this.#bytes += part.length;
  }

  get bytes(): number {
    return this.#bytes;
  }

  /** The piece's bytes parsed as JSON; the capture is empty again. */
  take(decoder: TextDecoder, what: string): unknown {
    const parts = this.#parts;
    let bytes: Uint8Array;
    if (parts.length === 1) bytes = parts[0];
    else {
      bytes = new Uint8Array(this.#bytes);
      let at = 0;
      for (const p of parts) {
        bytes.set(p, at);
        at += p.length;
      }
    }
    this.#parts = [];
    this.#bytes = 0;
    try {
      return JSON.parse(decoder.decode(bytes));
    } catch (err) {
      throw new ListBodyError(
        `The list's ${what} is not valid JSON: ${err instanceof Error ? err.message : err}`,
      );
    }
  }
}

// Where the scanner is in the top-level object (numbers: the hot loop compares them).
/** Before the opening brace. */
const START = 0;
/** Expecting a member's name (or the closing brace). */
const KEY = 1;
/** Inside a member's name. */
const IN_KEY = 2;
/** After a name, before its colon. */
const COLON_NEXT = 3;
/** After the colon, before the value. */
const VALUE = 4;
/** Inside a member's value other than items. */
const IN_VALUE = 5;
/** Inside the items array, between items. */
const ITEMS = 6;
/** Inside one item. */
const IN_ITEM = 7;
/** After a value, before a comma or the closing brace. */
const AFTER = 8;
/** After the closing brace. */
const END = 9;

/**
 * The items of the list `body`, each parsed as JSON, in order; the object's other
 * members go into `rest` as they end (read it once the generator is done). Calls
 * `progress` with each chunk's size. Throws {@linkcode ListBodyError} for a body that is
 * not a JSON object, an item or member that is not JSON, or a body that ends early; the
 * reader is cancelled when the caller stops early or `signal` aborts.
 */
export async function* listItems(
  body: ReadableStream<Uint8Array>,
  rest: Record<string, unknown>,
  o: { signal?: AbortSignal; progress?: (bytes: number) => void } = {},
): AsyncGenerator<unknown> {
  const reader = body.getReader();
  const onAbort = () => reader.cancel(o.signal?.reason).catch(() => {});
  o.signal?.addEventListener("abort", onAbort, { once: true });
  const decoder = new TextDecoder();
  const capture = new Capture();
  let place = START;
  let key = "";
  // Depth inside the current value or item.
  let depth = 0;
  let inString = false;
  // Whether the backslashes that ended the last chunk's string content were odd.
  let oddCarry = false;
  // Items parsed from the current chunk, handed on at its end.
  const ready: unknown[] = [];
  /** Ends the value or item being captured at `end` (exclusive) of `chunk`. */
  const finish = (chunk: Uint8Array, from: number, end: number) => {
    capture.add(chunk.subarray(from, end));
    if (place === IN_ITEM) ready.push(capture.take(decoder, "item"));
    else rest[key] = capture.take(decoder, `"${key}"`);
  };
  try {
    for (;;) {
      if (o.signal?.aborted) throw o.signal.reason;
      const { value: chunk, done } = await reader.read();
      if (o.signal?.aborted) throw o.signal.reason;
      if (done) break;
      o.progress?.(chunk.length);
      const n = chunk.length;
      // Where the piece being captured starts in this chunk (-1: none).
      let from = place === IN_KEY || place === IN_VALUE || place === IN_ITEM ? 0 : -1;
      let i = 0;
      while (i < n) {
        if (inString) {
          // Jump to the next quote; it ends the string unless an odd run of backslashes
          // stands before it (a run may have begun in the chunk before).
          const q = chunk.indexOf(QUOTE, i);
          if (q < 0) {
            let k = 0;
            while (n - 1 - k >= i && chunk[n - 1 - k] === BACKSLASH) k++;
            oddCarry = n - i === k ? (oddCarry !== (k % 2 === 1)) : k % 2 === 1;
            i = n;
            break;
          }
          let odd = false;
          if (q > i ? chunk[q - 1] === BACKSLASH : oddCarry) {
            let k = 0;
            while (q - 1 - k >= i && chunk[q - 1 - k] === BACKSLASH) k++;
            odd = q - i === k ? (oddCarry !== (k % 2 === 1)) : k % 2 === 1;
          }
          oddCarry = false;
          i = q + 1;
          if (odd) continue;
          inString = false;
          if (place === IN_KEY) {
            capture.add(chunk.subarray(from, q + 1));
            from = -1;
            const name = capture.take(decoder, "member name");
            if (typeof name !== "string") throw new ListBodyError("The list has a bad member name");
            key = name;
            place = COLON_NEXT;
          }
          continue;
        }
        if (place === IN_ITEM || place === IN_VALUE) {
          // The hot loop: the bytes between an item's strings.
          while (i < n) {
            const c = chunk[i];
            if (c === QUOTE) {
              inString = true;
              i++;
              break;
            }
            if (c === OPEN_OBJECT || c === OPEN_ARRAY) depth++;
            else if (c === CLOSE_OBJECT || c === CLOSE_ARRAY) {
              if (depth === 0) {
                // A scalar's end at its container's closing bracket.
                finish(chunk, from, i);
                from = -1;
                if (place === IN_ITEM) {
                  if (c !== CLOSE_ARRAY) throw new ListBodyError("The list's items are broken");
                  place = AFTER;
                } else {
                  if (c !== CLOSE_OBJECT) throw new ListBodyError("The list is broken");
                  place = END;
                }
                i++;
                break;
              }
              if (--depth === 0) {
                finish(chunk, from, i + 1);
                from = -1;
                place = place === IN_ITEM ? ITEMS : AFTER;
                i++;
                break;
              }
            } else if (c === COMMA && depth === 0) {
              // A scalar's end.
              finish(chunk, from, i);
              from = -1;
              place = place === IN_ITEM ? ITEMS : KEY;
              i++;
              break;
            }
            i++;
          }
          continue;
        }
        const c = chunk[i];
        switch (place) {
          case START:
            if (c === OPEN_OBJECT) place = KEY;
            else if (!isSpace(c)) throw new ListBodyError("The list is not a JSON object");
            i++;
            break;
          case KEY:
            if (c === QUOTE) {
              place = IN_KEY;
              inString = true;
              from = i;
            } else if (c === CLOSE_OBJECT) place = END;
            else if (!isSpace(c) && c !== COMMA) {
              throw new ListBodyError("The list has a member without a quoted name");
            }
            i++;
            break;
          case COLON_NEXT:
            if (c === COLON) place = VALUE;
            else if (!isSpace(c)) throw new ListBodyError(`The list's "${key}" has no colon`);
            i++;
            break;
          case VALUE:
            if (isSpace(c)) i++;
            else if (key === "items" && c === OPEN_ARRAY) {
              place = ITEMS;
              i++;
            } else {
              // The byte is read again as the value's first.
              place = IN_VALUE;
              from = i;
              depth = 0;
            }
            break;
          case ITEMS:
            if (c === CLOSE_ARRAY) {
              place = AFTER;
              i++;
            } else if (isSpace(c) || c === COMMA) i++;
            else {
              // The byte is read again as the item's first.
              place = IN_ITEM;
              from = i;
              depth = 0;
            }
            break;
          case AFTER:
            if (c === COMMA) place = KEY;
            else if (c === CLOSE_OBJECT) place = END;
            else if (!isSpace(c)) throw new ListBodyError("The list has bytes after a member");
            i++;
            break;
          default: // END
            if (!isSpace(c)) throw new ListBodyError("The list has bytes after its end");
            i++;
        }
      }
      if (from >= 0) capture.add(chunk.subarray(from));
      for (const item of ready.splice(0)) yield item;
    }
    if (place !== END) throw new ListBodyError("The list ended before its closing brace");
  } finally {
    o.signal?.removeEventListener("abort", onAbort);
    await reader.cancel().catch(() => {});
  }
}
