import { z } from "zod";
import { assert, assertEquals, assertMatch, assertThrows } from "../lib/assert.ts";
import { ConfigError, loadConfig, resolveConfig, validateProviderConfig } from "./config.ts";
import type { ProviderModule } from "../providers/contract.ts";
import { withRunDir } from "../tests/support/run_dir.ts";

const FILE = `// The agent's config
{
  /* block comment */
  "socket": "/run/enim/a.sock",
  "provider": {
    "name": "mock",
    "mock": { "enis": 4 }, // trailing comma next
  },
  "gc": { "intervalSeconds": 10 },
}
`;

function file(text: string) {
  return { path: "/etc/enim/agent.jsonc", text };
}

function configError(fn: () => unknown): ConfigError {
  const err = assertThrows(fn);
  assert(err instanceof ConfigError, String(err));
  return err;
}

Deno.test("a JSONC file with comments and trailing commas parses, defaults applied", () => {
  const cfg = resolveConfig({ file: file(FILE) });
  assertEquals(cfg.socket, "/run/enim/a.sock");
  assertEquals(cfg.statePath, "/var/lib/enim/enim.db");
  assertEquals(cfg.provider, { name: "mock", mock: { enis: 4 } });
  assertEquals(cfg.gc, { intervalSeconds: 10, graceSeconds: 30 });
  assertEquals(cfg.log, { level: "info", format: "json" });
  assertEquals(cfg.devices, "ip");
  assertEquals(cfg.deviceSimulator, undefined);
  assertEquals(cfg.hostLink, {
    nodeMark: 0x1000,
    kubeProxyMasqueradeMark: 0x4000,
    tableCheckSeconds: 2,
  });
});

Deno.test("a syntax error is reported with line and column", () => {
  const err = configError(() =>
    resolveConfig({ file: file('{\n  "socket": "/x"\n  "gc": {}\n}') })
  );
  assertMatch(err.message, /"\/etc\/enim\/agent\.jsonc"/);
  assertMatch(err.problems[0], /^line 3, column 3: CommaExpected$/);
});

Deno.test("invalid fields are reported with their paths", async (t) => {
  const cases: [string, string, RegExp][] = [
    [
      "wrong type",
      '{"provider": {"name": "mock"}, "gc": {"intervalSeconds": "x"}}',
      /^gc\.intervalSeconds: Invalid input: expected number/,
    ],
    ["unknown provider", '{"provider": {"name": "aws"}}', /^provider\.name: Invalid option/],
    ["missing provider", "{}", /^provider: /],
    [
      "typo in a key",
      '{"provider": {"name": "mock"}, "sockt": "/x"}',
      /^\(top level\): Unrecognized key.*\(sockt\)/,
    ],
    [
      "relative socket",
      '{"provider": {"name": "mock"}, "socket": "x.sock"}',
      /^socket: Expected an absolute path/,
    ],
    ["bad log level", '{"provider": {"name": "mock"}, "log": {"level": "loud"}}', /^log\.level: /],
    ["bad devices", '{"provider": {"name": "mock"}, "devices": "real"}', /^devices: /],
    ["top-level array", "[]", /^\(top level\): Expected an object/],
    [
      "a node mark of two bits",
      '{"provider": {"name": "mock"}, "hostLink": {"nodeMark": "0x3000"}}',
      /^hostLink\.nodeMark: Expected a mark of one bit/,
    ],
    [
      "the node mark equal to kube-proxy's",
      '{"provider": {"name": "mock"}, "hostLink": {"nodeMark": 16384}}',
      /^hostLink: hostLink\.nodeMark and hostLink\.kubeProxyMasqueradeMark need a bit each/,
    ],
  ];
  for (const [what, text, re] of cases) {
    await t.step(what, () => {
      const err = configError(() => resolveConfig({ file: file(text) }));
      assertMatch(err.problems[0], re);
    });
  }
});

Deno.test("env overrides the file and flags override env", () => {
  const env = {
    ENIM_SOCKET: "/run/enim/env.sock",
    ENIM_STATE: "/var/lib/enim/env.db",
    ENIM_GC_INTERVAL: "5",
    ENIM_LOG_LEVEL: "debug",
  };
  const fromEnv = resolveConfig({ file: file(FILE), env });
  assertEquals(fromEnv.socket, "/run/enim/env.sock");
  assertEquals(fromEnv.statePath, "/var/lib/enim/env.db");
  assertEquals(fromEnv.gc.intervalSeconds, 5);
  assertEquals(fromEnv.log.level, "debug");
  // Untouched file values stay.
  assertEquals(fromEnv.provider.mock, { enis: 4 });

  const fromFlags = resolveConfig({
    file: file(FILE),
    env,
    flags: { socket: "/run/enim/flag.sock", gcInterval: "7", gcGrace: "0", provider: "bce" },
  });
  assertEquals(fromFlags.socket, "/run/enim/flag.sock");
  assertEquals(fromFlags.gc, { intervalSeconds: 7, graceSeconds: 0 });
  assertEquals(fromFlags.provider.name, "bce");
  assertEquals(fromFlags.statePath, "/var/lib/enim/env.db");
});

Deno.test("a bad override names the field and where it came from", () => {
  const err = configError(() =>
    resolveConfig({ file: file(FILE), env: { ENIM_GC_GRACE: "soon" } })
  );
  assertMatch(err.problems[0], /^gc\.graceSeconds \(from ENIM_GC_GRACE\): Invalid input/);
  const err2 = configError(() =>
    resolveConfig({ file: file(FILE), env: {}, flags: { gcInterval: "-1" } })
  );
  assertMatch(err2.problems[0], /^gc\.intervalSeconds \(from --gc-interval\): /);
});

Deno.test("the provider's own section is validated by its schema with the full path", () => {
  const module: ProviderModule<{ enis: number }> = {
    configSchema: z.strictObject({ enis: z.number().int().default(8) }),
    create: () => Promise.reject(new Error("unused")),
  };
  const ok = validateProviderConfig(resolveConfig({ file: file(FILE) }), module);
  assertEquals(ok, { enis: 4 });
  const absent = validateProviderConfig(
    resolveConfig({ file: file('{"provider": {"name": "mock"}}') }),
    module,
  );
  assertEquals(absent, { enis: 8 });
  const bad = resolveConfig({
    file: file('{"provider": {"name": "mock", "mock": {"enis": "x"}}}'),
  });
  const err = configError(() => validateProviderConfig(bad, module));
  assertMatch(err.problems[0], /^provider\.mock\.enis: Invalid input: expected number/);
});

Deno.test("loadConfig reads the named file and refuses a missing one", async () => {
  await withRunDir(async (dir) => {
    await Deno.writeTextFile(`${dir}/agent.jsonc`, FILE);
    const cfg = await loadConfig({ config: `${dir}/agent.jsonc` }, {});
    assertEquals(cfg.socket, "/run/enim/a.sock");
    const viaEnv = await loadConfig({}, { ENIM_CONFIG: `${dir}/agent.jsonc` });
    assertEquals(viaEnv.gc.intervalSeconds, 10);
    let err: unknown;
    try {
      await loadConfig({ config: `${dir}/missing.jsonc` }, {});
    } catch (e) {
      err = e;
    }
    assert(err instanceof ConfigError);
    assertMatch(err.message, /Cannot read the config file/);
  });
});

Deno.test("deploy/agent.jsonc is a valid configuration", async () => {
  const path = new URL("../deploy/agent.jsonc", import.meta.url);
  const cfg = resolveConfig({ file: { path: path.pathname, text: await Deno.readTextFile(path) } });
  assertEquals(cfg.socket, "/run/enim/enim.sock");
});

Deno.test("timeouts.commandSeconds defaults to 10 s and must be positive and at most 600", () => {
  const base = { provider: { name: "mock" } };
  const parse = (timeouts: unknown) =>
    resolveConfig({ file: file(JSON.stringify({ ...base, timeouts })) }).timeouts;
  assertEquals(resolveConfig({ file: file(JSON.stringify(base)) }).timeouts.commandSeconds, 10);
  assertEquals(parse({ commandSeconds: 2.5 }).commandSeconds, 2.5);
  for (const bad of [0, -1, 601, "10"]) {
    const err = configError(() => parse({ commandSeconds: bad }));
    assertMatch(err.problems[0], /^timeouts\.commandSeconds: /);
  }
});

Deno.test("the kubernetes section has its defaults and checks each field", () => {
  const base = '{"provider": {"name": "mock"}';
  assertEquals(resolveConfig({ file: file(base + "}") }).kubernetes, {
    pageSize: 500,
    requestTimeoutSeconds: 30,
    watchTimeoutSeconds: 300,
    watchBookmarkSeconds: 60,
  });
  const cfg = resolveConfig({
    file: file(
      base + ', "kubernetes": {"kubeconfig": "/etc/enim/kubeconfig", "context": "prod", ' +
        '"nodeName": "node-1.example", "pageSize": 100, "requestTimeoutSeconds": 5, ' +
        '"watchTimeoutSeconds": 60, "watchBookmarkSeconds": 0.5}}',
    ),
  });
  assertEquals(cfg.kubernetes, {
    kubeconfig: "/etc/enim/kubeconfig",
    context: "prod",
    nodeName: "node-1.example",
    pageSize: 100,
    requestTimeoutSeconds: 5,
    watchTimeoutSeconds: 60,
    watchBookmarkSeconds: 0.5,
  });
  const bad: [string, RegExp][] = [
    ['{"kubeconfig": "kubeconfig"}', /^kubernetes\.kubeconfig: Expected an absolute path/],
    ['{"nodeName": "Node_1"}', /^kubernetes\.nodeName: Expected a Kubernetes node name/],
    ['{"pageSize": 0}', /^kubernetes\.pageSize: /],
    ['{"watchTimeoutSeconds": 5}', /^kubernetes\.watchTimeoutSeconds: /],
    ['{"watchBookmarkSeconds": 0}', /^kubernetes\.watchBookmarkSeconds: /],
    ['{"server": "https://x"}', /^kubernetes: .*\(server\)/],
  ];
  for (const [section, pattern] of bad) {
    const err = configError(() =>
      resolveConfig({ file: file(`${base}, "kubernetes": ${section}}`) })
    );
    assertMatch(err.problems[0], pattern);
  }
});
