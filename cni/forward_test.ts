/**
 * The plugin process's logic (cni/forward.ts) with the socket and the log
 * faked: what it forwards, how it passes the agent's answer through, and what
 * it answers alone.
 */
import { FakeAgent } from "../tests/support/fake_agent.ts";
import { run as dispatched } from "../tests/support/run_dispatch.ts";
import { SPEC_CASES, specCall } from "../tests/support/spec_cases.ts";
import { CNI_CALL_PATH, EXIT_HEADER, RESTART_GRACE_SECONDS } from "../api/wire.ts";
import { VERSION } from "../lib/version.ts";
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { forward, type ForwardIo } from "./forward.ts";
import { type HttpResponse, UnixHttpError } from "../lib/http1.ts";

const CONFIG = JSON.stringify({
  cniVersion: "1.0.0",
  name: "n",
  type: "enim",
  agentSocket: "/run/enim/other.sock",
  timeoutSeconds: 3,
  logFile: "/var/log/enim/x.log",
});
/** The same config in spec 1.1.0, which GC and STATUS need. */
const CONFIG_11 = JSON.stringify({ ...JSON.parse(CONFIG), cniVersion: "1.1.0" });
const ADD_ENV = {
  CNI_COMMAND: "ADD",
  CNI_CONTAINERID: "c1",
  CNI_NETNS: "/run/netns/p",
  CNI_IFNAME: "eth0",
  CNI_PATH: "/opt/cni/bin",
};

interface Run {
  code: number;
  stdout: string;
  logs: { file: string; line: Record<string, unknown> }[];
  sent: { socket: string; timeoutMs: number; request: string }[];
}

function response(status: number, body: string, headers: Record<string, string> = {}) {
  return {
    status,
    headers: new Map(Object.entries(headers)),
    body: new TextEncoder().encode(body),
  } satisfies HttpResponse;
}

async function run(
  env: Record<string, string>,
  stdin: string,
  answer: () => HttpResponse,
  extra: Partial<ForwardIo> = {},
): Promise<Run> {
  const r: Run = { code: -1, stdout: "", logs: [], sent: [] };
  r.code = await forward({
    env,
    stdin,
    stdout: (s) => (r.stdout += s),
    log: (file, line) => r.logs.push({ file, line: JSON.parse(line) }),
    roundTrip: (socket, request, timeoutMs) => {
      r.sent.push({ socket, timeoutMs, request: new TextDecoder().decode(request) });
      return Promise.resolve().then(answer);
    },
    readFile: () => undefined,
    ...extra,
  });
  return r;
}

const unreachable = (cause: unknown = new Deno.errors.NotFound("no socket")) => () => {
  throw new UnixHttpError("connect", "/s", "Cannot connect", { cause });
};

Deno.test("forward() posts the raw call to the config's socket and prints the agent's answer", async () => {
  const result = '{"cniVersion":"1.0.0","ips":[]}';
  const r = await run(
    { ...ADD_ENV, ENIM_LOG_FILE: "/run/enim/t.log", OTHER: "x" },
    CONFIG,
    () => response(200, result, { [EXIT_HEADER]: "0" }),
  );
  assertEquals(r.code, 0);
  assertEquals(r.stdout, result);
  assertEquals(r.logs, [], "the agent writes the log line of a call it served");
  assertEquals(r.sent.length, 1);
  assertEquals(r.sent[0].socket, "/run/enim/other.sock");
  assertEquals(r.sent[0].timeoutMs, 3000);
  const [head, body] = r.sent[0].request.split("\r\n\r\n");
  assert(head.startsWith(`POST ${CNI_CALL_PATH} HTTP/1.1`));
  assertEquals(JSON.parse(body), {
    env: { ...ADD_ENV, ENIM_LOG_FILE: "/run/enim/t.log" },
    stdin: CONFIG,
  });
});

Deno.test("forward() passes an error result and its exit code through unchanged", async () => {
  const err = '{"cniVersion":"1.0.0","code":7,"msg":"Invalid network config: mtu"}';
  const r = await run(ADD_ENV, CONFIG, () => response(200, err, { [EXIT_HEADER]: "1" }));
  assertEquals([r.code, r.stdout], [1, err]);
});

Deno.test("forward() turns a refused call into a CNI error", async (t) => {
  for (
    const [status, code] of [[413, 7], [400, 7], [503, 11], [500, 110], [200, 110]] as const
  ) {
    await t.step(`HTTP ${status} → ${code}`, async () => {
      const r = await run(
        ADD_ENV,
        CONFIG,
        () => response(status, '{"error":{"code":"bad_request","message":"too big"}}'),
      );
      assertEquals(r.code, 1);
      const obj = JSON.parse(r.stdout);
      assertEquals([obj.code, obj.cniVersion], [code, "1.0.0"]);
      assertStringIncludes(obj.msg, `HTTP ${status}`);
      assertEquals(r.logs.length, 1);
    });
  }
});

Deno.test("forward() answers VERSION without the agent", async () => {
  const r = await run({ CNI_COMMAND: "VERSION" }, '{"cniVersion":"0.4.0"}', () => {
    throw new Error("not called");
  });
  assertEquals(r.code, 0);
  assertEquals(JSON.parse(r.stdout).cniVersion, "0.4.0");
  assertEquals(r.sent.length, 0);
  assertEquals(r.logs.length, 1);
  assertEquals(r.logs[0].file, "/var/log/enim/cni.log");
  const bad = await run({ CNI_COMMAND: "VERSION" }, "{x", () => response(500, ""));
  assertEquals([bad.code, JSON.parse(bad.stdout).code], [1, 6]);
});

Deno.test("without the agent forward() answers by the module's rules", async (t) => {
  const code = (r: Run) => (r.stdout ? JSON.parse(r.stdout).code : 0);
  await t.step("ADD → 11 naming the socket, logged to the config's log file", async () => {
    const r = await run(ADD_ENV, CONFIG, unreachable());
    assertEquals([r.code, code(r)], [1, 11]);
    assertStringIncludes(JSON.parse(r.stdout).msg, "/run/enim/other.sock");
    assertEquals(r.logs[0].file, "/var/log/enim/x.log");
    assertEquals(r.logs[0].line.code, 11);
    assertEquals(r.logs[0].line.containerId, "c1");
  });
  await t.step("a missing variable → 4, an unknown verb → 4, bad JSON → 6", async () => {
    const missing = await run({ CNI_COMMAND: "ADD" }, CONFIG, unreachable());
    assertEquals(code(missing), 4);
    assertStringIncludes(JSON.parse(missing.stdout).msg, "CNI_CONTAINERID is not set");
    assertEquals(code(await run({ CNI_COMMAND: "NOPE" }, CONFIG, unreachable())), 4);
    assertEquals(code(await run({}, CONFIG, unreachable())), 4);
    assertEquals(code(await run(ADD_ENV, "{", unreachable())), 6);
  });
  await t.step("STATUS → 50 naming the socket", async () => {
    const r = await run({ CNI_COMMAND: "STATUS" }, CONFIG_11, unreachable());
    assertEquals(code(r), 50);
    assertStringIncludes(JSON.parse(r.stdout).msg, "/run/enim/other.sock");
  });
  await t.step("GC and CHECK → 11", async () => {
    const withList = JSON.stringify({ ...JSON.parse(CONFIG_11), "cni.dev/valid-attachments": [] });
    const gc = await run({ CNI_COMMAND: "GC", CNI_PATH: "/opt/cni/bin" }, withList, unreachable());
    assertEquals(code(gc), 11);
    assertEquals(code(await run({ ...ADD_ENV, CNI_COMMAND: "CHECK" }, CONFIG, unreachable())), 11);
  });
  await t.step("DEL with the namespace gone → success; still there → 11", async () => {
    const del = { ...ADD_ENV, CNI_COMMAND: "DEL" };
    const gone = await run({ ...del, CNI_NETNS: "" }, CONFIG, unreachable());
    assertEquals([gone.code, gone.stdout], [0, ""]);
    assertEquals(gone.logs[0].line.level, "warn");
    const vanished = await run(del, CONFIG, unreachable(), { netnsExists: () => false });
    assertEquals(vanished.code, 0);
    const there = await run(del, CONFIG, unreachable(), { netnsExists: () => true });
    assertEquals(code(there), 11);
    const unknown = await run(del, CONFIG, unreachable(), { netnsExists: () => undefined });
    assertEquals(code(unknown), 11, "a namespace that cannot be checked counts as existing");
  });
  await t.step("a socket the permissions forbid → 11 saying so", async () => {
    const r = await run(ADD_ENV, CONFIG, unreachable(new Deno.errors.NotCapable("no")));
    assertStringIncludes(JSON.parse(r.stdout).msg, "permissions do not allow that socket");
  });
  await t.step("no answer in time → 11 saying how long it waited", async () => {
    const r = await run(ADD_ENV, CONFIG, () => {
      throw new UnixHttpError("timeout", "/s", "late");
    });
    assertEquals(code(r), 11);
    assertStringIncludes(JSON.parse(r.stdout).msg, "did not answer within 3 s");
  });
});

Deno.test("forward() falls back to the defaults when enim's section says nothing usable", async () => {
  const cfg = JSON.stringify({
    cniVersion: "1.1.0",
    name: "n",
    ipam: { type: "enim", agentSocket: "relative.sock", timeoutSeconds: "9" },
  });
  const r = await run(ADD_ENV, cfg, unreachable());
  assertEquals(r.sent[0].socket, "/run/enim/enim.sock");
  assertEquals(r.sent[0].timeoutMs, 30_000);
  assertEquals(JSON.parse(r.stdout).cniVersion, "1.1.0");
});

Deno.test("without the agent forward() answers a call wrong whatever the agent says as the agent does", async (t) => {
  const good = {
    containerId: "c1",
    ifName: "eth0",
    netns: "/run/netns/p",
    args: "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",
    config: JSON.parse(CONFIG),
  };
  for (const c of SPEC_CASES) {
    await t.step(`${c.what} → ${c.code}`, async () => {
      const { env, stdin } = specCall(c, good);
      const alone = await run(env, stdin, unreachable());
      assertEquals(alone.code, 1);
      const mine = JSON.parse(alone.stdout);
      assertEquals(mine.code, c.code, mine.msg);
      assertEquals(alone.logs[0].line.code, c.code, "logged with its code");
      // The agent's dispatcher, given the same call, answers the same without asking the manager.
      const agent = new FakeAgent();
      const theirs = await dispatched(env, stdin, agent);
      assertEquals(theirs.code, 1);
      assertEquals(JSON.parse(theirs.stdout), mine);
      assertEquals(agent.calls.length, 0, "the agent's manager was not asked");
    });
  }
  await t.step("a value echoed in the answer is clipped, the same on both sides", async () => {
    const env = { ...ADD_ENV, CNI_CONTAINERID: "x".repeat(100_000) };
    const config = JSON.stringify({ ...JSON.parse(CONFIG), cniVersion: "9".repeat(100_000) });
    for (const [e, stdin] of [[env, CONFIG], [ADD_ENV, config]] as const) {
      const mine = JSON.parse((await run(e, stdin, unreachable())).stdout);
      assert(mine.msg.length < 1000, mine.msg);
      assertStringIncludes(mine.msg, "more bytes left out");
      assertEquals(JSON.parse((await dispatched(e, stdin)).stdout), mine);
    }
  });
  await t.step(
    "with the agent up, none of them is sent to it: the answer is the same",
    async () => {
      for (const c of SPEC_CASES) {
        const { env, stdin } = specCall(c, good);
        const up = await run(env, stdin, () => response(200, "", { [EXIT_HEADER]: "0" }));
        assertEquals(up.sent.length, 0, c.what);
        const down = await run(env, stdin, unreachable());
        assertEquals([up.code, up.stdout], [down.code, down.stdout], c.what);
      }
    },
  );
  await t.step(
    "a DEL whose CNI_ARGS is malformed is no spec problem: it reaches the agent",
    async () => {
      const env = { ...ADD_ENV, CNI_COMMAND: "DEL", CNI_ARGS: "garbage" };
      const r = await run(env, CONFIG, () => response(200, "", { [EXIT_HEADER]: "0" }));
      assertEquals([r.code, r.sent.length], [0, 1]);
    },
  );
  await t.step("a call with nothing wrong still says the agent is not reachable (11)", async () => {
    const r = await run(ADD_ENV, CONFIG, unreachable());
    assertEquals(JSON.parse(r.stdout).code, 11);
  });
});

Deno.test("forward() tells the agent how long it waits (the config's timeoutSeconds)", async () => {
  const r = await run(ADD_ENV, CONFIG, () => response(200, "", { [EXIT_HEADER]: "0" }));
  assertEquals(r.sent[0].timeoutMs, 3000);
  assertStringIncludes(r.sent[0].request, "\r\nenim-cni-timeout-ms: 3000\r\n");
});

Deno.test("forward() sends the plugin's enim version with every call", async () => {
  const r = await run(ADD_ENV, CONFIG, () => response(200, "", { [EXIT_HEADER]: "0" }));
  assertStringIncludes(r.sent[0].request, `\r\nenim-plugin-version: ${VERSION}\r\n`);
});

Deno.test("while the agent is being replaced forward() answers STATUS success and holds the other verbs", async (t) => {
  const code = (r: Run) => (r.stdout ? JSON.parse(r.stdout).code : 0);
  let clock = 1_000_000;
  const record = (stoppedAt?: number) => () =>
    JSON.stringify({
      version: "0.2.0",
      pid: 7,
      servingSince: 1,
      ...(stoppedAt ? { stoppedAt } : {}),
    });
  const io = (stoppedAt?: number): Partial<ForwardIo> => ({
    readFile: (path) => path === "/run/enim/agent.json" ? record(stoppedAt)() : undefined,
    now: () => clock,
    sleep: (ms) => {
      clock += ms;
      return Promise.resolve();
    },
  });
  const status = { CNI_COMMAND: "STATUS" };
  await t.step(
    "STATUS within the grace of a graceful stop → success, logged as a warning",
    async () => {
      const r = await run(status, CONFIG_11, unreachable(), io(clock - 1000));
      assertEquals([r.code, r.stdout], [0, ""]);
      assertEquals(r.logs[0].line.level, "warn");
      assertStringIncludes(String(r.logs[0].line.warnings), "being replaced");
    },
  );
  await t.step("STATUS after the grace, or with no stop recorded, or no record → 50", async () => {
    const late = await run(
      status,
      CONFIG_11,
      unreachable(),
      io(clock - RESTART_GRACE_SECONDS * 1000),
    );
    assertEquals(code(late), 50);
    assertEquals(code(await run(status, CONFIG_11, unreachable(), io())), 50);
    assertEquals(code(await run(status, CONFIG_11, unreachable())), 50);
  });
  await t.step("an ADD waits for the new agent and gets its answer", async () => {
    let tries = 0;
    const started = clock;
    const r = await run(ADD_ENV, CONFIG, () => {
      if (++tries < 5) unreachable()();
      return response(200, '{"cniVersion":"1.0.0"}', { [EXIT_HEADER]: "0" });
    }, io(clock - 1000));
    assertEquals([r.code, r.sent.length], [0, 5]);
    assertEquals(clock - started, 400, "four waits of 100 ms");
    // Each try tells the agent how long the plugin still waits.
    assertStringIncludes(r.sent[4].request, "\r\nenim-cni-timeout-ms: 2600\r\n");
  });
  await t.step("an ADD stops waiting at the config's timeoutSeconds → 11", async () => {
    const r = await run(ADD_ENV, CONFIG, unreachable(), io(clock - 1000));
    assertEquals(code(r), 11);
    assert(r.sent.length >= 29 && r.sent.length <= 30, `${r.sent.length} tries in 3 s`);
  });
  await t.step("an ADD stops waiting when the grace ends → 11", async () => {
    const stop = clock - (RESTART_GRACE_SECONDS * 1000 - 250);
    const r = await run(ADD_ENV, CONFIG, unreachable(), io(stop));
    assertEquals(code(r), 11);
    assertEquals(r.sent.length, 4, "tried at 0, 100, 200 ms; at 300 ms the grace is over");
  });
  await t.step("a DEL whose namespace is gone does not wait", async () => {
    const r = await run(
      { ...ADD_ENV, CNI_COMMAND: "DEL", CNI_NETNS: "" },
      CONFIG,
      unreachable(),
      io(clock - 1000),
    );
    assertEquals([r.code, r.sent.length], [0, 1]);
  });
});

Deno.test("a new agent's install (the init container's replacement marker) counts as a replacement: STATUS success, an ADD waits", async () => {
  let clock = 1_000_000;
  const io = (since?: number, text?: string): Partial<ForwardIo> => ({
    // No agent record at all: the agent before was 0.1.0, which writes none.
    readFile: (path) =>
      path === "/run/enim/replacing.json"
        ? text ?? (since === undefined ? undefined : JSON.stringify({ since }))
        : undefined,
    now: () => clock,
    sleep: (ms) => {
      clock += ms;
      return Promise.resolve();
    },
  });
  const status = { CNI_COMMAND: "STATUS" };
  const code = (r: Run) => (r.stdout ? JSON.parse(r.stdout).code : 0);
  const ok = await run(status, CONFIG_11, unreachable(), io(clock - 1000));
  assertEquals([ok.code, ok.stdout], [0, ""]);
  assertStringIncludes(String(ok.logs[0].line.warnings), "being replaced");
  const late = io(clock - RESTART_GRACE_SECONDS * 1000);
  assertEquals(code(await run(status, CONFIG_11, unreachable(), late)), 50);
  assertEquals(code(await run(status, CONFIG_11, unreachable(), io(undefined, "{"))), 50);
  assertEquals(
    code(await run(status, CONFIG_11, unreachable(), io(undefined, '{"since":"x"}'))),
    50,
  );
  let tries = 0;
  const r = await run(ADD_ENV, CONFIG, () => {
    if (++tries < 3) unreachable()();
    return response(200, '{"cniVersion":"1.0.0"}', { [EXIT_HEADER]: "0" });
  }, io(clock - 1000));
  assertEquals([r.code, r.sent.length], [0, 3]);
});
