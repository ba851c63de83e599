import { assert, assertEquals, assertMatch, assertRejects } from "../lib/assert.ts";
import { ApiError } from "../api/schema.ts";
import { SocketAgentClient } from "../api/client.ts";
import { API_ROUTES, createHandler, KNOWN_METHODS, serveUnix, SocketInUseError } from "./server.ts";
import { Metrics } from "../lib/metrics.ts";
import { FakeManager } from "../tests/support/fake_manager.ts";
import { withRunDir } from "../tests/support/run_dir.ts";

Deno.test("the API over a real unix socket: modes, client, stale and live sockets", async (t) => {
  await withRunDir(async (root) => {
    const dir = `${root}/sock`;
    const path = `${dir}/enim.sock`;
    const m = new FakeManager();
    const metrics = new Metrics();
    const server = await serveUnix(
      path,
      createHandler({ manager: m, metrics: () => metrics.text() }),
    );
    try {
      await t.step("the directory is created 0700 and the socket is 0600", async () => {
        assertEquals((await Deno.stat(dir)).mode! & 0o777, 0o700);
        const st = await Deno.lstat(path);
        assert(st.isSocket);
        assertEquals(st.mode! & 0o777, 0o600);
      });

      await t.step("SocketAgentClient drives every endpoint", async () => {
        const c = new SocketAgentClient(path);
        const add = await c.add({
          containerId: "c1",
          ifName: "eth0",
          netns: "/run/netns/p1",
          network: "net",
          pod: { namespace: "default", name: "web-0" },
          mode: "interface",
        });
        assertEquals(add.eniId, "eni-mock-0001");
        await c.check({
          containerId: "c1",
          ifName: "eth0",
          netns: "/run/netns/p1",
          network: "net",
          mode: "interface",
          expected: {},
        });
        assertEquals((await c.status()).pool.owned, 1);
        assertEquals((await c.attachments()).length, 1);
        assertEquals((await c.enis()).length, 3);
        assertEquals((await c.gc({ dryRun: true })).items, []);
        assertMatch(await c.metrics(), /enim_agent_up 1/);
        await c.del({ containerId: "c1", ifName: "eth0" });
        assertEquals(m.atts.size, 0);
      });

      await t.step("errors arrive as ApiError with their code", async () => {
        const c = new SocketAgentClient(path);
        const err = await assertRejects(() =>
          c.add({
            containerId: "c1",
            ifName: "eth0",
            netns: "/run/netns/../../etc",
            network: "net",
            pod: { namespace: "default", name: "web-0" },
            mode: "interface",
          })
        );
        assert(err instanceof ApiError);
        assertEquals(err.code, "bad_request");
        assertMatch(err.message, /netns/);
      });

      await t.step("a live socket is refused", async () => {
        const err = await assertRejects(() =>
          serveUnix(path, createHandler({ manager: new FakeManager() }))
        );
        assert(err instanceof SocketInUseError, String(err));
        assertMatch(err.message, /Another enim agent is already serving/);
        // The live server still answers.
        assertEquals((await new SocketAgentClient(path).status()).ready, true);
      });
    } finally {
      await server.shutdown();
    }
    await t.step("shutdown removes the socket file", async () => {
      await assertRejects(() => Deno.lstat(path));
    });

    await t.step("a stale socket left by a dead agent is replaced", async () => {
      // A socket file nobody listens on: what an agent killed with SIGKILL leaves.
      await leaveStaleSocket(path);
      assert((await Deno.lstat(path)).isSocket, "expected a stale socket file");
      const s2 = await serveUnix(path, createHandler({ manager: new FakeManager() }));
      try {
        assertEquals((await new SocketAgentClient(path).status()).provider, "mock");
        assertEquals((await Deno.lstat(path)).mode! & 0o777, 0o600);
      } finally {
        await s2.shutdown();
      }
    });

    await t.step("a path that is not a socket is refused", async () => {
      await Deno.writeTextFile(path, "x");
      const err = await assertRejects(() =>
        serveUnix(path, createHandler({ manager: new FakeManager() }))
      );
      assertMatch(err.message, /exists and is not a socket/);
    });
  });
});

/** Starts a child that listens on `path`, then kills it with SIGKILL (by its PID). */
async function leaveStaleSocket(path: string): Promise<void> {
  const code = `Deno.listen({ transport: "unix", path: ${JSON.stringify(path)} });` +
    `console.log("ready"); setInterval(() => {}, 1000);`;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", code],
    stdout: "piped",
    stderr: "null",
    stdin: "null",
  }).spawn();
  try {
    const reader = child.stdout.getReader();
    await reader.read();
    reader.releaseLock();
  } finally {
    Deno.kill(child.pid, "SIGKILL");
    await child.status;
    await child.stdout.cancel().catch(() => {});
  }
}

/** One raw HTTP/1.1 exchange on the socket: the request line as given, the whole answer. */
async function rawExchange(
  path: string,
  method: string,
  target: string,
  extraHeaders = "",
): Promise<{ status: number; headers: Map<string, string>; body: string; raw: string }> {
  const conn = await Deno.connect({ transport: "unix", path });
  try {
    const req = `${method} ${target} HTTP/1.1\r\nHost: enim\r\nConnection: close\r\n` +
      `${extraHeaders}Content-Length: 0\r\n\r\n`;
    await conn.write(new TextEncoder().encode(req));
    const chunks: Uint8Array[] = [];
    const buf = new Uint8Array(16 * 1024);
    for (let n = await conn.read(buf); n !== null; n = await conn.read(buf)) {
      chunks.push(buf.slice(0, n));
    }
    const raw = new TextDecoder().decode(
      chunks.reduce((a, c) => {
        const out = new Uint8Array(a.length + c.length);
        out.set(a);
        out.set(c, a.length);
        return out;
      }, new Uint8Array()),
    );
    const end = raw.indexOf("\r\n\r\n");
    const [statusLine, ...lines] = raw.slice(0, Math.max(0, end)).split("\r\n");
    const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine)?.[1] ?? "0");
    const headers = new Map(lines.map((l) => {
      const i = l.indexOf(":");
      return [l.slice(0, i).toLowerCase(), l.slice(i + 1).trim()] as [string, string];
    }));
    return { status, headers, body: end < 0 ? "" : raw.slice(end + 4), raw };
  } finally {
    conn.close();
  }
}

// Issue 25 point 3: `TRACE /v1/status` was closed without an answer.
Deno.test("every method on every route gets an answer over the real socket: 405 with Allow, 501, never a silent close", async (t) => {
  await withRunDir(async (root) => {
    const path = `${root}/sock/enim.sock`;
    const metrics = new Metrics();
    const server = await serveUnix(
      path,
      createHandler({ manager: new FakeManager(), metrics: () => metrics.text() }),
    );
    try {
      const unknownMethods = ["PROPFIND", "TRACK", "FOO", "get", "M-SEARCH"];
      for (const target of [...Object.keys(API_ROUTES), "/v1/nope"]) {
        await t.step(target, async () => {
          for (const method of [...KNOWN_METHODS, ...unknownMethods]) {
            const what = `${method} ${target}`;
            const r = await rawExchange(path, method, target);
            assert(
              r.status !== 0,
              `${what}: an answer, not a silent close (got ${r.raw.length} bytes)`,
            );
            const allowed = API_ROUTES[target];
            const served = allowed?.includes(method);
            const want = !(KNOWN_METHODS as readonly string[]).includes(method)
              ? 501
              : !allowed
              ? 404
              : !served
              ? 405
              : null;
            if (want !== null) {
              assertEquals(r.status, want, `${what}: ${r.raw.slice(0, 300)}`);
              assertEquals(r.headers.get("content-type"), "application/json", what);
              if (want === 405) assertEquals(r.headers.get("allow"), allowed!.join(", "), what);
            } else {
              // Served: whatever the route says, never a routing error (an empty body is a 400).
              assert(![404, 405, 501].includes(r.status), `${what}: ${r.status}`);
            }
            if (method === "HEAD") {
              // A response to HEAD carries no content; its length is still announced.
              assertEquals(r.body, "", what);
              assert(Number(r.headers.get("content-length")) > 0, what);
            } else if (r.status >= 400) {
              const body = JSON.parse(r.body);
              assertMatch(body.error.code, /^[a-z_]+$/, what);
              assert(body.error.message.length > 0, what);
            }
          }
        });
      }
    } finally {
      await server.shutdown();
    }
  });
});

// Issue 41 item 5: a NUL in a header value was answered 501 (the Request constructor's refusal
// was taken for a method the server cannot serve), with a body that said bad_request.
Deno.test("a header with a control character or a bad name is answered 400 bad_request over the real socket", async (t) => {
  await withRunDir(async (root) => {
    const path = `${root}/sock/enim.sock`;
    const server = await serveUnix(path, createHandler({ manager: new FakeManager() }));
    try {
      const cases: [string, string][] = [
        ["a NUL in a value", "X-Trace: a\u0000b\r\n"],
        ["a NUL alone", "X-Trace: \u0000\r\n"],
        ["a DEL in a value", "X-Trace: a\u007fb\r\n"],
        ["an escape in a value", "X-Trace: \u001b[31m\r\n"],
        ["a space in a name", "X Trace: 1\r\n"],
        ["a NUL in a name", "X-\u0000: 1\r\n"],
        ["a character no header can hold", "X-Trace: \u4e2d\r\n"],
      ];
      for (const [what, header] of cases) {
        await t.step(what, async () => {
          const r = await rawExchange(path, "GET", "/v1/status", header);
          assertEquals(r.status, 400, `${what}: ${r.raw.slice(0, 300)}`);
          assertEquals(r.headers.get("content-type"), "application/json", what);
          const body = JSON.parse(r.body);
          assertEquals(body.error.code, "bad_request", what);
          assertMatch(body.error.message, /^Malformed header /, what);
        });
      }
      await t.step("a tab and obs-text in a value are still served", async () => {
        const r = await rawExchange(path, "GET", "/v1/status", "X-Trace: a\tb \u00e9\r\n");
        assertEquals(r.status, 200, r.raw.slice(0, 300));
      });
    } finally {
      await server.shutdown();
    }
  });
});
