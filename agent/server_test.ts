import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { AddRequestSchema, API_ERROR_CODES, ApiError, HTTP_STATUS } from "../api/schema.ts";
import { createHandler } from "./server.ts";
import { FakeManager } from "../tests/support/fake_manager.ts";
import { Metrics } from "../lib/metrics.ts";
import { poolCounts } from "../manager/status.ts";

const ADD = {
  containerId: "c0ffee01",
  ifName: "eth0",
  netns: "/run/netns/pod-1",
  network: "enim-net",
  pod: { namespace: "default", name: "web-0" },
  mode: "interface",
};

function post(path: string, body: unknown, raw = false): Request {
  return new Request(`http://enim${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: raw ? String(body) : JSON.stringify(body),
  });
}
function get(path: string): Request {
  return new Request(`http://enim${path}`);
}

Deno.test("every endpoint answers with its schema's shape", async (t) => {
  const m = new FakeManager();
  const h = createHandler({ manager: m });

  await t.step("POST /v1/add returns the ENI result", async () => {
    const res = await h(post("/v1/add", { ...ADD, routes: [{ dst: "0.0.0.0/0" }] }));
    assertEquals(res.status, 200);
    const body = await res.json();
    assertEquals(body.eniId, "eni-mock-0001");
    assertEquals(body.routes, [{ dst: "0.0.0.0/0", gw: "10.0.1.1" }]);
    // Defaults from the schema reach the manager.
    const arg = m.calls.at(-1)!.arg as { ips: unknown[]; ranges: unknown[] };
    assertEquals([arg.ips, arg.ranges], [[], []]);
  });
  await t.step("POST /v1/check returns {}", async () => {
    const res = await h(
      post("/v1/check", { ...ADD, pod: undefined, expected: { addresses: ["10.0.1.10/24"] } }),
    );
    assertEquals([res.status, await res.json()], [200, {}]);
  });
  await t.step("GET /v1/status returns the Status object", async () => {
    const res = await h(get("/v1/status"));
    const body = await res.json();
    assertEquals([res.status, body.pool.owned, body.enis.length], [200, 1, 3]);
  });
  await t.step("GET /v1/attachments lists attachments", async () => {
    const body = await (await h(get("/v1/attachments"))).json();
    assertEquals(body.attachments.map((a: { pod: string }) => a.pod), ["default/web-0"]);
  });
  await t.step("GET /v1/enis lists ENIs", async () => {
    const body = await (await h(get("/v1/enis"))).json();
    assertEquals(body.enis.length, 3);
  });
  await t.step("POST /v1/gc passes dryRun through", async () => {
    m.gcPlan = [{ eniId: "eni-mock-0001", reason: "netns gone" }];
    const res = await h(post("/v1/gc", { dryRun: true }));
    const body = await res.json();
    assertEquals([res.status, body.dryRun, body.items[0].outcome], [200, true, "planned"]);
  });
  await t.step("POST /v1/del returns {} and frees the ENI", async () => {
    const res = await h(post("/v1/del", { containerId: ADD.containerId, ifName: "eth0" }));
    assertEquals([res.status, await res.json()], [200, {}]);
    assertEquals(m.atts.size, 0);
  });
  await t.step("GET /v1/healthz says ok", async () => {
    const res = await h(get("/v1/healthz"));
    assertEquals([res.status, await res.json()], [200, { ok: true }]);
  });
  await t.step("GET /metrics returns Prometheus text", async () => {
    const metrics = new Metrics();
    metrics.setPoolSource(async () => poolCounts(await m.status()));
    const res = await createHandler({ manager: m, metrics: () => metrics.text() })(get("/metrics"));
    assertEquals(res.status, 200);
    assertMatch(res.headers.get("content-type")!, /^text\/plain; version=0\.0\.4/);
    const text = await res.text();
    assertMatch(text, /^enim_agent_up 1$/m);
    assertMatch(text, /^enim_ready 1$/m);
    assertMatch(text, /^enim_pool_enis\{profile="default",state="owned"\} 0$/m);
    assertMatch(text, /^enim_pool_enis\{profile="default",state="free"\} 3$/m);
  });
  await t.step("GET /metrics without a source is a 404", async () => {
    assertEquals((await h(get("/metrics"))).status, 404);
  });
  await t.step("GET /metrics uses a pluggable source", async () => {
    const h2 = createHandler({ manager: m, metrics: () => "enim_custom 7\n" });
    assertEquals(await (await h2(get("/metrics"))).text(), "enim_custom 7\n");
  });
});

const BAD: [string, string, unknown, RegExp][] = [
  ["malformed JSON", "/v1/add", "{not json", /^Malformed JSON in the request body/],
  ["an empty body", "/v1/add", "", /^Malformed JSON/],
  ["a wrong type", "/v1/add", JSON.stringify({ ...ADD, ifName: 42 }), /ifName: /],
  ["an array body", "/v1/del", "[]", /Invalid request body/],
  [
    "an unknown owner format",
    "/v1/add",
    JSON.stringify({ ...ADD, pod: { namespace: "Not_A_Label", name: "web-0" } }),
    /pod\.namespace: Expected a DNS label/,
  ],
  [
    "an owner given as a string",
    "/v1/add",
    JSON.stringify({ ...ADD, pod: "default/web-0" }),
    /pod: /,
  ],
  [
    "netns path traversal",
    "/v1/add",
    JSON.stringify({ ...ADD, netns: "/run/netns/../../etc" }),
    /netns: Expected an absolute path without '\.' or '\.\.' components/,
  ],
  [
    "a relative netns",
    "/v1/check",
    JSON.stringify({ ...ADD, netns: "run/netns/x", expected: {} }),
    /netns: /,
  ],
  [
    "netns traversal on DEL",
    "/v1/del",
    JSON.stringify({ containerId: "c1", ifName: "eth0", netns: "/proc/1/../../etc" }),
    /netns: /,
  ],
  [
    "a bad container id",
    "/v1/del",
    JSON.stringify({ containerId: "../x", ifName: "eth0" }),
    /containerId: /,
  ],
  ["a bad ifName", "/v1/add", JSON.stringify({ ...ADD, ifName: "eth0/../x" }), /ifName: /],
  ["a wrong dryRun type", "/v1/gc", JSON.stringify({ dryRun: "yes" }), /dryRun: /],
];

Deno.test("bad requests get a 400 naming the field and never reach the manager", async (t) => {
  for (const [what, path, body, message] of BAD) {
    await t.step(what, async () => {
      const m = new FakeManager();
      await m.add(AddRequestSchema.parse(ADD));
      const before = m.dump();
      const callsBefore = m.calls.length;
      const res = await createHandler({ manager: m })(post(path, body, true));
      assertEquals(res.status, 400);
      const err = (await res.json()).error;
      assertEquals(err.code, "bad_request");
      assertMatch(err.message, message);
      assertEquals(m.calls.length, callsBefore, "the manager was called");
      assertEquals(m.dump(), before, "the state changed");
    });
  }
});

Deno.test("a body over the limit is refused with 413", async () => {
  const m = new FakeManager();
  const h = createHandler({ manager: m, maxBodyBytes: 100 });
  const res = await h(post("/v1/add", { ...ADD, network: "x".repeat(200) }));
  assertEquals(res.status, 413);
  assertStringIncludes((await res.json()).error.message, "exceeds 100");
  assertEquals(m.calls.length, 0);
});

Deno.test("an unknown path is 404 and a wrong method is 405 with Allow", async () => {
  const h = createHandler({ manager: new FakeManager() });
  const nf = await h(get("/v2/add"));
  assertEquals([nf.status, (await nf.json()).error.code], [404, "not_found"]);
  const wm = await h(get("/v1/add"));
  assertEquals(wm.status, 405);
  assertEquals(wm.headers.get("allow"), "POST");
  assertMatch((await wm.json()).error.message, /Method GET is not allowed on "\/v1\/add"/);
  const wm2 = await h(post("/v1/status", {}));
  assertEquals(wm2.status, 405);
  await wm2.body?.cancel();
});

Deno.test("an ApiError from the manager becomes its HTTP status and body", async (t) => {
  for (const code of API_ERROR_CODES) {
    await t.step(code, async () => {
      const m = new FakeManager();
      m.failWith = new ApiError(code, `Failed with ${code}`, "more");
      const res = await createHandler({ manager: m })(post("/v1/add", ADD));
      assertEquals(res.status, HTTP_STATUS[code]);
      assertEquals(await res.json(), {
        error: { code, message: `Failed with ${code}`, details: "more" },
      });
    });
  }
});

Deno.test("any other error is a logged 500 internal", async () => {
  const m = new FakeManager();
  const lines: string[] = [];
  const { Logger } = await import("../lib/log.ts");
  m.failWith = new TypeError("boom");
  const res = await createHandler({ manager: m, log: new Logger((l) => lines.push(l)) })(
    get("/v1/status"),
  );
  assertEquals(res.status, 500);
  const err = (await res.json()).error;
  assertEquals(err.code, "internal");
  assertStringIncludes(err.message, "boom");
  assert(lines.some((l) => JSON.parse(l).level === "error" && l.includes("boom")));
});

Deno.test("an ADD that outlives its deadline is answered busy", async () => {
  const m = new FakeManager();
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const realAdd = m.add.bind(m);
  m.add = async (req) => {
    await gate;
    return realAdd(req);
  };
  const res = await createHandler({ manager: m, addTimeoutMs: 20 })(post("/v1/add", ADD));
  assertEquals(res.status, 503);
  assertEquals((await res.json()).error.code, "busy");
  release();
});

Deno.test("POST /v1/cni runs the CNI dispatcher on the raw call and answers its stdout and exit", async (t) => {
  const m = new FakeManager();
  const h = createHandler({ manager: m });
  const dir = await Deno.makeTempDir({ prefix: "enim-cni-call-" });
  const logFile = `${dir}/cni.log`;
  const env = {
    CNI_COMMAND: "ADD",
    CNI_CONTAINERID: "c0ffee01",
    CNI_NETNS: "/run/netns/pod-1",
    CNI_IFNAME: "eth0",
    CNI_PATH: "/opt/cni/bin",
    CNI_ARGS: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
    ENIM_LOG_FILE: logFile,
  };
  try {
    await t.step("an ADD: the versioned CNI result, exit 0, one log line", async () => {
      const stdin = JSON.stringify({ cniVersion: "0.4.0", name: "enim-net", type: "enim" });
      const res = await h(post("/v1/cni", { env, stdin }));
      assertEquals([res.status, res.headers.get("enim-cni-exit")], [200, "0"]);
      const out = await res.json();
      assertEquals(out.cniVersion, "0.4.0");
      assertEquals(out.interfaces[0].mac, "02:00:00:00:00:01");
      assertEquals(out.ips[0].version, "4");
      const arg = m.calls.at(-1)!.arg as { pod: { name: string }; network: string };
      assertEquals([arg.pod.name, arg.network], ["web-0", "enim-net"]);
      const lines = (await Deno.readTextFile(logFile)).trim().split("\n").map((l) => JSON.parse(l));
      assertEquals([lines.length, lines[0].verb, lines[0].code], [1, "ADD", 0]);
    });
    await t.step("a bad config: the CNI error object, exit 1", async () => {
      const stdin = JSON.stringify({ cniVersion: "1.1.0", name: "n", type: "enim", mtu: 1 });
      const res = await h(post("/v1/cni", { env, stdin }));
      assertEquals([res.status, res.headers.get("enim-cni-exit")], [200, "1"]);
      const out = await res.json();
      assertEquals(out.code, 7);
      assertStringIncludes(out.msg, "mtu");
    });
    await t.step("a call of the wrong shape is refused with 400 naming the field", async () => {
      const res = await h(post("/v1/cni", { env: { ...env, HOME: "/root" }, stdin: "" }));
      assertEquals(res.status, 400);
      assertStringIncludes((await res.json()).error.message, "env");
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
