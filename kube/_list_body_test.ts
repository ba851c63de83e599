import * as fc from "fast-check";
import { assertEquals, assertRejects } from "../lib/assert.ts";
import { ListBodyError, listItems } from "./_list_body.ts";

function stream(chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(c) {
      for (const x of chunks) c.enqueue(x);
      c.close();
    },
  });
}

async function read(chunks: Uint8Array[]): Promise<{ items: unknown[]; rest: object }> {
  const rest: Record<string, unknown> = {};
  const items: unknown[] = [];
  for await (const item of listItems(stream(chunks), rest)) items.push(item);
  return { items, rest };
}

const enc = (s: string) => new TextEncoder().encode(s);

Deno.test("listItems() reads every item and member whatever byte the chunks split at", async () => {
  const list = {
    kind: "PodList",
    apiVersion: "v1",
    metadata: { resourceVersion: "12", continue: "" },
    items: [
      { metadata: { name: 'a"b\\', labels: { 'x\\\\"': "}{][,:" } }, n: [1, [2, {}], null] },
      { metadata: { name: "é€😀", annotations: { note: "\\" } }, ok: true, z: -1.5e3 },
      {},
    ],
    extra: [{ "items": [1] }],
  };
  const text = JSON.stringify(list, null, 1);
  const bytes = enc(text);
  const want = { items: list.items, rest: { ...list, items: undefined } };
  delete (want.rest as Record<string, unknown>).items;
  for (let cut = 0; cut <= bytes.length; cut++) {
    const got = await read([bytes.slice(0, cut), bytes.slice(cut)]);
    assertEquals(got, want, `cut at ${cut}`);
  }
  const bytewise = await read([...bytes].map((b) => new Uint8Array([b])));
  assertEquals(bytewise, want);
});

Deno.test("listItems() takes scalar items, null or empty items, and any member order", async () => {
  assertEquals(await read([enc('{"items":[1, "two" ,null,{"a":[]}],"k":"v"}')]), {
    items: [1, "two", null, { a: [] }],
    rest: { k: "v" },
  });
  assertEquals(await read([enc('{"metadata":{},"items":null}')]), {
    items: [],
    rest: { metadata: {}, items: null },
  });
  assertEquals(await read([enc(' {"items":[],"n":5} \n')]), { items: [], rest: { n: 5 } });
});

Deno.test("listItems() matches JSON.parse on random lists split into random chunks", async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.jsonValue(), { maxLength: 6 }),
      fc.dictionary(fc.string().filter((k) => k !== "items"), fc.jsonValue(), { maxKeys: 3 }),
      fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 20 }),
      async (items, rest, sizes) => {
        const bytes = enc(JSON.stringify({ ...rest, items }));
        const chunks: Uint8Array[] = [];
        for (let at = 0, k = 0; at < bytes.length; k++) {
          const size = sizes[k % sizes.length];
          chunks.push(bytes.slice(at, at + size));
          at += size;
        }
        const got = await read(chunks);
        // JSON.stringify then parse: what JSON itself keeps (-0 becomes 0, …).
        assertEquals(got.items, JSON.parse(JSON.stringify(items)));
        assertEquals(got.rest, JSON.parse(JSON.stringify(rest)));
      },
    ),
    { numRuns: 300, seed: 42 },
  );
});

Deno.test("listItems() refuses what is not a whole list object", async (t) => {
  const cases: [string, RegExp][] = [
    ["[1,2]", /not a JSON object/],
    ['{"items":[{"a":1},{"b":', /ended before its closing brace/],
    ['{"items":[{"a":1}]', /ended before its closing brace/],
    ['{"items":[{"a":tru}]}', /item is not valid JSON/],
    ['{"metadata":{"a" 1}}', /"metadata" is not valid JSON/],
    ["{items:[]}", /without a quoted name/],
    ['{"items" []}', /has no colon/],
    ['{"items":[]} x', /after its end/],
    ["", /ended before its closing brace/],
  ];
  for (const [body, pattern] of cases) {
    await t.step(body || "(empty)", async () => {
      const err = await assertRejects(() => read([enc(body)]), ListBodyError);
      assertEquals(pattern.test(err.message), true, err.message);
    });
  }
});

Deno.test("listItems() cancels the body when the caller stops early or the signal aborts", async () => {
  let cancelled = 0;
  const endless = () =>
    new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(enc('{"items":[{"a":1},'));
      },
      cancel() {
        cancelled++;
      },
    });
  for await (const _ of listItems(endless(), {})) break;
  assertEquals(cancelled, 1);
  const ac = new AbortController();
  const gen = listItems(endless(), {}, { signal: ac.signal });
  assertEquals((await gen.next()).value, { a: 1 });
  const next = gen.next();
  ac.abort(new Error("stop"));
  await assertRejects(() => next, Error, "stop");
  assertEquals(cancelled, 2);
});
