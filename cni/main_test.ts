/**
 * The plugin as a real subprocess, without an agent: the shipped bundle under
 * the `enim` permission set, environment and stdin as a runtime passes them.
 * What the process answers alone (cni/forward.ts); with an agent, the e2e tests.
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import {
  runEnim as runEnimRaw,
  type RunEnimOptions,
  type RunEnimResult,
} from "../tests/support/enim.ts";
import { CniErrorObjectSchema } from "./errors.ts";

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

Deno.test("the plugin process logs one JSON line per invocation to ENIM_LOG_FILE", async () => {
  const dir = "/var/log/enim";
  let created = false;
  try {
    await Deno.stat(dir);
  } catch {
    await Deno.mkdir(dir, { recursive: true });
    created = true;
  }
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
