import { assertEquals } from "../lib/assert.ts";
import { lines } from "./_lines.ts";

function stream(chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(c) {
      for (const x of chunks) c.enqueue(x);
      c.close();
    },
  });
}

async function collect(chunks: Uint8Array[]): Promise<string[]> {
  const out: string[] = [];
  for await (const l of lines(stream(chunks))) out.push(l);
  return out;
}

Deno.test("lines() joins a line split over chunks, even inside a character", async () => {
  const bytes = new TextEncoder().encode('{"a":"é€"}\n{"b":1}\r\n\n{"c":2}');
  // Every split point, one byte at a time.
  for (let cut = 1; cut < bytes.length; cut++) {
    assertEquals(await collect([bytes.slice(0, cut), bytes.slice(cut)]), [
      '{"a":"é€"}',
      '{"b":1}',
      '{"c":2}',
    ]);
  }
  assertEquals(await collect([...bytes].map((b) => new Uint8Array([b]))).then((x) => x.length), 3);
});

Deno.test("lines() releases the body when the reader stops early", async () => {
  let cancelled = false;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      c.enqueue(new TextEncoder().encode("one\ntwo\n"));
    },
    cancel() {
      cancelled = true;
    },
  });
  for await (const l of lines(body)) {
    assertEquals(l, "one");
    break;
  }
  assertEquals(cancelled, true);
});

Deno.test("lines() gives up a pending read when its signal aborts, and cancels the body", async () => {
  let cancelled: unknown = null;
  const body = new ReadableStream<Uint8Array>({
    start() {}, // never sends: the read stays pending until cancelled
    cancel(reason) {
      cancelled = reason;
    },
  });
  const ac = new AbortController();
  const reading = (async () => {
    for await (const _ of lines(body, ac.signal)) { /* none */ }
  })();
  ac.abort(new Error("stop"));
  const err = await reading.then(() => null, (e) => e);
  assertEquals(String(err), "Error: stop");
  assertEquals(String(cancelled), "Error: stop");
});
