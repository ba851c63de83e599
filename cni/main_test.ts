/**
 * The plugin as a real subprocess, without an agent: the shipped bundle under
 * the `enim` permission set, environment and stdin as a runtime passes them, and
 * the plugin entry the launcher runs (`dist/bundle/cni/main.js`, the `enim-plugin`
 * set), which must answer and log as `main.js` does. What the process answers alone
 * (cni/forward.ts); with an agent, the e2e tests.
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import {
  runEnim as runEnimRaw,
  type RunEnimOptions,
  type RunEnimResult,
} from "../tests/support/enim.ts";
import { CniErrorObjectSchema } from "./errors.ts";
import { bundleArgv, ensureBuiltSync, pluginEntry } from "../scripts/build.ts";

/** A path the permission set cannot write: logging fails, silently, and the host log stays clean. */
const NO_LOG = "/nonexistent/enim/cni.log";

/** Runs the plugin process, logging nowhere unless the test says where. */
function runEnim(args: string[], opts: RunEnimOptions): Promise<RunEnimResult> {
  return runEnimRaw(args, { ...opts, env: { ENIM_LOG_FILE: NO_LOG, ...opts.env } });
}

const SEED_CONFIG = '{ "cniVersion": "1.0.10", "name": "examplenet", "ipam": { "type": "enim"} }';
const ADD_ENV = {
  CNI_COMMAND: "ADD",
  CNI_CONTAINERID: "example",
  CNI_NETNS: "/run/netns/example",
  CNI_IFNAME: "eth0",
  CNI_PATH: "/opt/cni/bin",
};

function errorOf(res: RunEnimResult, code: number): { msg: string; cniVersion: string } {
  assertEquals(res.code, 1, `exit code; stderr: ${res.stderr}`);
  const obj = CniErrorObjectSchema.parse(JSON.parse(res.stdout));
  assertEquals(obj.code, code, obj.msg);
  assertEquals(res.stdout.trim(), JSON.stringify(obj), "nothing but the error object");
  return obj;
}

Deno.test("the plugin process answers VERSION for the seed's config", async () => {
  const res = await runEnim([], { env: { CNI_COMMAND: "VERSION" }, stdin: SEED_CONFIG });
  assertEquals(res.code, 0, res.stderr);
  assertEquals(res.stderr, "");
  assertEquals(JSON.parse(res.stdout), {
    cniVersion: "1.0.10",
    supportedVersions: ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
  });
});

Deno.test("without an agent the plugin process refuses malformed JSON with 6", async () => {
  assertStringIncludes(
    errorOf(await runEnim([], { env: ADD_ENV, stdin: "{nope" }), 6).msg,
    "Cannot decode the network config",
  );
  errorOf(await runEnim([], { env: ADD_ENV, stdin: "[1]" }), 6);
});

Deno.test("without an agent the plugin process answers STATUS with 50", async () => {
  const cfg = JSON.stringify({
    cniVersion: "1.1.0",
    name: "n",
    type: "enim",
    agentSocket: "/run/enim/none.sock",
  });
  const obj = errorOf(
    await runEnim([], { env: { CNI_COMMAND: "STATUS", CNI_PATH: "/opt/cni/bin" }, stdin: cfg }),
    50,
  );
  assertStringIncludes(obj.msg, "/run/enim/none.sock");
});

Deno.test("the plugin process names missing variables", async () => {
  const res = await runEnim([], { env: { CNI_COMMAND: "ADD" }, stdin: SEED_CONFIG });
  const msg = errorOf(res, 4).msg;
  for (const n of ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"]) assertStringIncludes(msg, n);
});

Deno.test("the seed's example ADD without an agent fails with 11 naming the socket", async (t) => {
  await t.step("a socket path under /run/enim that does not exist", async () => {
    const socket = `/run/enim/missing-${crypto.randomUUID()}.sock`;
    const cfg = JSON.stringify({
      cniVersion: "1.0.10",
      name: "examplenet",
      ipam: { type: "enim", agentSocket: socket, timeoutSeconds: 2 },
    });
    const obj = errorOf(await runEnim([], { env: ADD_ENV, stdin: cfg }), 11);
    assertStringIncludes(obj.msg, socket);
    assertEquals(obj.cniVersion, "1.0.10");
  });
  let defaultSocketExists = true;
  try {
    await Deno.lstat("/run/enim/enim.sock");
  } catch {
    defaultSocketExists = false;
  }
  await t.step({
    name: "the default socket, absent",
    ignore: defaultSocketExists,
    fn: async () => {
      const obj = errorOf(await runEnim([], { env: ADD_ENV, stdin: SEED_CONFIG }), 11);
      assertStringIncludes(obj.msg, "/run/enim/enim.sock");
    },
  });
});

Deno.test("the plugin process: DEL without an agent and without a netns succeeds", async () => {
  const res = await runEnim([], {
    env: { ...ADD_ENV, CNI_COMMAND: "DEL", CNI_NETNS: "" },
    stdin: SEED_CONFIG.replace('"enim"}', '"enim", "agentSocket": "/run/enim/none.sock"}'),
  });
  assertEquals(res.code, 0, res.stdout + res.stderr);
  assertEquals(res.stdout, "");
});

/** The plugin's log folder, made if missing (`created`: the test removes it again). */
async function ensureLogDir(): Promise<{ dir: string; created: boolean }> {
  const dir = "/var/log/enim";
  try {
    await Deno.stat(dir);
    return { dir, created: false };
  } catch {
    await Deno.mkdir(dir, { recursive: true });
    return { dir, created: true };
  }
}

Deno.test("the plugin process logs one JSON line per invocation to ENIM_LOG_FILE", async () => {
  const { dir, created } = await ensureLogDir();
  const logFile = `${dir}/cni-test-${crypto.randomUUID()}.log`;
  try {
    const env = { ...ADD_ENV, CNI_ARGS: "K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web-0" };
    await runEnim([], { env: { ...env, ENIM_LOG_FILE: logFile }, stdin: '{"cniVersion":"1.1.0"' });
    await runEnim([], {
      env: { ...env, CNI_COMMAND: "VERSION", ENIM_LOG_FILE: logFile },
      stdin: "",
    });
    const lines = (await Deno.readTextFile(logFile)).trim().split("\n").map((l) => JSON.parse(l));
    assertEquals(lines.length, 2);
    assertEquals([lines[0].verb, lines[0].code, lines[0].containerId], ["ADD", 6, "example"]);
    assertEquals([lines[1].verb, lines[1].code], ["VERSION", 0]);
    assert(typeof lines[0].durationMs === "number");
  } finally {
    await Deno.remove(logFile).catch(() => {});
    if (created) await Deno.remove(dir).catch(() => {});
  }
});

Deno.test("the plugin entry the launcher runs answers and logs each call it answers alone as main.js does", async (t) => {
  const { dir, created } = await ensureLogDir();
  // What the launcher execs for a CNI call: the one-file entry, the plugin's set, no code cache.
  const plugin = bundleArgv(pluginEntry(ensureBuiltSync()));
  const cases: [string, Record<string, string>, string][] = [
    ["VERSION", { CNI_COMMAND: "VERSION" }, '{"cniVersion":"1.1.0"}'],
    ["VERSION, stdin empty", { CNI_COMMAND: "VERSION" }, ""],
    ["VERSION, stdin not JSON", { CNI_COMMAND: "VERSION" }, "{"],
    ["VERSION, non-ASCII stdin", { CNI_COMMAND: "VERSION" }, '{"cniVersion":"0.4.0","x":"é😀"}'],
    ["no CNI_COMMAND", { CNI_COMMAND: "" }, SEED_CONFIG],
    ["an unknown verb", { ...ADD_ENV, CNI_COMMAND: "FOO" }, SEED_CONFIG],
    ["ADD without CNI_NETNS", { ...ADD_ENV, CNI_NETNS: "" }, SEED_CONFIG],
    ["ADD, malformed JSON", ADD_ENV, '{"cniVersion":"1.1.0"'],
    ["ADD, a cniVersion enim does not speak", ADD_ENV, SEED_CONFIG.replace("1.0.10", "9.9.9")],
    ["ADD, a malformed name", ADD_ENV, SEED_CONFIG.replace("examplenet", "bad name é")],
    ["ADD without an agent", ADD_ENV, SEED_CONFIG],
    ["STATUS without an agent", { ...ADD_ENV, CNI_COMMAND: "STATUS" }, '{"cniVersion":"1.1.0"}'],
    [
      "DEL without an agent or a netns",
      { ...ADD_ENV, CNI_COMMAND: "DEL", CNI_NETNS: "" },
      SEED_CONFIG,
    ],
  ];
  try {
    for (const [name, env, stdin] of cases) {
      await t.step(name, async () => {
        const logs = [0, 1].map(() => `${dir}/cni-test-${crypto.randomUUID()}.log`);
        try {
          const [viaMain, viaPlugin] = await Promise.all([
            runEnimRaw([], { env: { ...env, ENIM_LOG_FILE: logs[0] }, stdin }),
            runEnimRaw([], { env: { ...env, ENIM_LOG_FILE: logs[1] }, stdin, argv: plugin }),
          ]);
          assertEquals([viaPlugin.code, viaPlugin.stdout], [viaMain.code, viaMain.stdout]);
          assertEquals(viaPlugin.stderr, "");
          // The same log line but for its time and duration; its time as Date writes one.
          const [a, b] = await Promise.all(logs.map(async (f) => {
            const lines = (await Deno.readTextFile(f)).trim().split("\n");
            assertEquals(lines.length, 1, f);
            const { ts, durationMs, ...rest } = JSON.parse(lines[0]);
            assertEquals(new Date(ts).toISOString(), ts);
            assert(typeof durationMs === "number");
            return rest;
          }));
          assertEquals(b, a);
        } finally {
          for (const f of logs) await Deno.remove(f).catch(() => {});
        }
      });
    }
  } finally {
    if (created) await Deno.remove(dir).catch(() => {});
  }
});
