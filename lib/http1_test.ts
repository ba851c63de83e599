import {
  assert,
  assertEquals,
  assertRejects,
  assertStringIncludes,
  assertThrows,
} from "./assert.ts";
import { bodyText, encodeRequest, parseResponse, UnixHttpError, unixRoundTrip } from "./http1.ts";
import { serveHttp1 } from "./http1_server.ts";

const enc = (s: string) => new TextEncoder().encode(s);

Deno.test("parseResponse() cuts a Content-Length body by bytes, multi-byte text included", () => {
  const body = enc('{"msg":"Größe ✓"}');
  const head = enc(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\nX-A: b\r\n\r\n`);
  const res = parseResponse(new Uint8Array([...head, ...body, ...enc("trailing junk")]));
  assertEquals(res.status, 200);
  assertEquals(res.headers.get("x-a"), "b");
  assertEquals(bodyText(res), '{"msg":"Größe ✓"}');
});

Deno.test("parseResponse() decodes a chunked body by byte counts", () => {
  const a = enc("héllo "), b = enc("wörld ✓");
  const raw = new Uint8Array([
    ...enc("HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"),
    ...enc(`${a.length.toString(16)};ext=1\r\n`),
    ...a,
    ...enc(`\r\n${b.length.toString(16)}\r\n`),
    ...b,
    ...enc("\r\n0\r\n\r\n"),
  ]);
  const res = parseResponse(raw);
  assertEquals(res.status, 404);
  assertEquals(bodyText(res), "héllo wörld ✓");
});

Deno.test("parseResponse() reads to the end without a length and refuses what is cut short", () => {
  assertEquals(bodyText(parseResponse(enc("HTTP/1.0 200 OK\r\n\r\nall of it"))), "all of it");
  assertThrows(() => parseResponse(enc("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")));
  assertThrows(() => parseResponse(enc("HTTP/1.1 200 OK\r\nContent-Length: 1")));
  assertThrows(() => parseResponse(enc("SMTP 200\r\n\r\n")));
  assertThrows(() =>
    parseResponse(enc("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"))
  );
});

Deno.test("encodeRequest() frames a body by its byte length", () => {
  const req = new TextDecoder().decode(encodeRequest("POST", "/v1/cni", enc("ä")));
  assert(req.startsWith("POST /v1/cni HTTP/1.1\r\n"));
  assert(req.includes("Content-Length: 2\r\n"));
  assert(req.endsWith("\r\n\r\nä"));
  assert(
    new TextDecoder().decode(encodeRequest("GET", "/x")).includes("Content-Length: 0\r\n"),
  );
});

Deno.test("unixRoundTrip() talks to a real unix socket server and tells the phases of failure", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "enim-http1-" });
  const path = `${dir}/s.sock`;
  let hang: (() => void) | undefined;
  const server = Deno.serve({ path, onListen() {} }, async (req) => {
    const text = await req.text();
    if (req.url.endsWith("/slow")) await new Promise<void>((r) => (hang = r));
    return new Response(`echo ${text} ✓`, { headers: { "x-exit": "1" } });
  });
  try {
    await t.step("a complete exchange", async () => {
      const res = await unixRoundTrip(path, encodeRequest("POST", "/e", enc("ü")), 5000);
      assertEquals(res.status, 200);
      assertEquals(res.headers.get("x-exit"), "1");
      assertEquals(bodyText(res), "echo ü ✓");
    });
    await t.step("nobody at the path: connect", async () => {
      const err = await assertRejects(
        () => unixRoundTrip(`${dir}/none.sock`, encodeRequest("GET", "/"), 1000),
        UnixHttpError,
      );
      assertEquals(err.phase, "connect");
    });
    await t.step("no answer in time: timeout", async () => {
      const err = await assertRejects(
        () => unixRoundTrip(path, encodeRequest("GET", "/slow"), 200),
        UnixHttpError,
      );
      assertEquals(err.phase, "timeout");
      hang?.();
    });
  } finally {
    hang?.();
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("serveHttp1() bounds what a client can hold: a deadline, a connection cap, sizes", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "enim-http1-srv-" });
  const path = `${dir}/s.sock`;
  const listener = Deno.listen({ transport: "unix", path });
  const server = serveHttp1(listener, async (req) => {
    const body = await req.text();
    return new Response(JSON.stringify({ path: new URL(req.url).pathname, body }), {
      headers: { "content-type": "application/json" },
    });
  }, { maxConnections: 3, requestTimeoutMs: 300, maxBodyBytes: 100 });
  const held: Deno.Conn[] = [];
  const raw = async (text: string) => {
    const c = await Deno.connect({ transport: "unix", path });
    held.push(c);
    await c.write(enc(text));
    return c;
  };
  const readAll = async (c: Deno.Conn) => {
    const parts: number[] = [];
    const buf = new Uint8Array(4096);
    for (let n = await c.read(buf); n !== null; n = await c.read(buf)) {
      parts.push(...buf.subarray(0, n));
    }
    return parseResponse(new Uint8Array(parts));
  };
  try {
    await t.step("a whole request is served, multi-byte body intact", async () => {
      const res = await unixRoundTrip(path, encodeRequest("POST", "/v1/x", enc("ü✓")), 2000);
      assertEquals(JSON.parse(bodyText(res)), { path: "/v1/x", body: "ü✓" });
    });
    await t.step("half a request is answered 408 after the deadline and closed", async () => {
      const c = await raw("POST /v1/x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");
      const res = await readAll(c).catch(() => null);
      // The deadline closes the connection; it may or may not get the 408 written first.
      assert(res === null || res.status === 408, `status ${res?.status}`);
      assertEquals(server.connections, 0);
    });
    await t.step("beyond the cap a connection gets 503 at once; slots come back", async () => {
      const slow = [await raw("GET /a"), await raw("GET /b"), await raw("GET /c")];
      await new Promise((r) => setTimeout(r, 30));
      assertEquals(server.connections, 3);
      const res = await unixRoundTrip(path, encodeRequest("GET", "/d"), 2000);
      assertEquals(res.status, 503);
      assertStringIncludes(bodyText(res), "Too many connections");
      for (const c of slow) await readAll(c).catch(() => {});
      assertEquals(server.connections, 0, "every slow connection was closed by the deadline");
      const ok = await unixRoundTrip(path, encodeRequest("GET", "/e"), 2000);
      assertEquals(ok.status, 200);
    });
    await t.step("a body over the limit → 413, a bad request line → 400", async () => {
      const big = await unixRoundTrip(path, encodeRequest("POST", "/x", new Uint8Array(101)), 2000);
      assertEquals(big.status, 413);
      const bad = await readAll(await raw("HELLO\r\n\r\n"));
      assertEquals(bad.status, 400);
    });
    await t.step(
      "shutdown closes connections still reading and waits for none of them",
      async () => {
        await raw("GET /never-finished");
        await new Promise((r) => setTimeout(r, 30));
        await server.shutdown();
        assertEquals(server.connections, 0);
      },
    );
  } finally {
    for (const c of held) {
      try {
        c.close();
      } catch { /* closed */ }
    }
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
});
