import { assert, assertEquals, assertRejects, assertThrows } from "./assert.ts";
import { bodyText, encodeRequest, parseResponse, UnixHttpError, unixRoundTrip } from "./http1.ts";

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
