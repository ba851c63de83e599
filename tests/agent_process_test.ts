import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { ApiError } from "../api/schema.ts";
import { SocketAgentClient, unixRequest } from "../api/client.ts";
import {
  agentCommandLine,
  fakeDevicesConfig,
  podAddRequest,
  startAgent,
} from "./support/agent_proc.ts";
import { withSandbox } from "./support/run_dir.ts";
import { runEnim } from "./support/enim.ts";

Deno.test("the real agent process serves ADD, DEL and status, and stops on SIGTERM", async () => {
  await withSandbox(async (dir, sb) => {
    const agent = await startAgent(sb, {
      ...fakeDevicesConfig(dir, { enis: 4 }),
      log: { level: "debug", file: `${dir}/agent.log` },
    });
    try {
      const c = new SocketAgentClient(agent.socket);
      assertEquals((await Deno.lstat(agent.socket)).mode! & 0o777, 0o600);
      const before = await c.status();
      assertEquals([before.provider, before.pool.free, before.pool.owned], ["mock", 4, 0]);
      const res = await c.add(podAddRequest(1));
      assertMatch(res.eniId, /^eni-mock-\d{4}$/);
      assertEquals(res.ips.length, 1);
      const again = await c.add(podAddRequest(1));
      assertEquals(again.eniId, res.eniId, "a retried ADD returns the same ENI");
      const atts = await c.attachments();
      assertEquals(atts.map((a) => [a.pod, a.eniId, a.state]), [[
        "default/pod-1",
        res.eniId,
        "ready",
      ]]);
      await c.del({ containerId: "ctr-1", ifName: "eth0", netns: "/run/netns/pod-1" });
      await c.del({ containerId: "ctr-1", ifName: "eth0" }); // idempotent
      assertEquals((await c.status()).pool.free, 4);
      assertEquals(await c.attachments(), []);
    } finally {
      const s = await agent.stop("SIGTERM");
      assertEquals(s.code, 0, agent.stderr());
    }
    const log = await Deno.readTextFile(sb.host("agent.log"));
    assertMatch(log, /"msg":"serving the API"/);
    assertMatch(log, /"msg":"api request".*"method":"POST","path":"\/v1\/add","status":200/);
    assertMatch(log, /"msg":"stopped"/);
    assertEquals(agent.stderr(), "");
    let gone = false;
    try {
      await Deno.lstat(sb.host("enim.sock"));
    } catch {
      gone = true;
    }
    assert(gone, "SIGTERM left the socket behind");
  });
});

Deno.test("a second agent on the same socket is refused while the first runs", async () => {
  await withSandbox(async (dir, sb) => {
    const agent = await startAgent(sb, fakeDevicesConfig(dir, { enis: 2 }));
    try {
      // A second agent with its own config and state, on the same socket.
      const second = `${dir}/second.jsonc`;
      await Deno.writeTextFile(
        sb.host("second.jsonc"),
        JSON.stringify({ ...fakeDevicesConfig(dir, { enis: 2 }), statePath: `${dir}/second.db` }),
      );
      const [cmd, ...args] = agentCommandLine(sb, second);
      const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
      assertEquals(out.code, 1);
      assertMatch(new TextDecoder().decode(out.stderr), /Another enim agent is already serving/);
      assertEquals((await new SocketAgentClient(agent.socket).status()).ready, true);
    } finally {
      await agent.stop("SIGTERM");
    }
  });
});

Deno.test("32 parallel ADDs against 24 ENIs: 24 distinct ENIs, 8 no_eni_available", async () => {
  await withSandbox(async (dir, sb) => {
    const agent = await startAgent(sb, fakeDevicesConfig(dir, { enis: 24 }));
    try {
      const c = new SocketAgentClient(agent.socket);
      const results = await Promise.allSettled(
        Array.from({ length: 32 }, (_, i) => c.add(podAddRequest(i))),
      );
      const ok = results.flatMap((r) => r.status === "fulfilled" ? [r.value.eniId] : []);
      const failed = results.flatMap((r) => r.status === "rejected" ? [r.reason] : []);
      assertEquals(ok.length, 24);
      assertEquals(new Set(ok).size, 24, "an ENI was handed out twice");
      assertEquals(failed.length, 8);
      for (const e of failed) {
        assert(e instanceof ApiError, String(e));
        assertEquals(e.code, "no_eni_available", e.message);
      }
      const mid = await c.status();
      assertEquals([mid.pool.free, mid.pool.owned, mid.canAllocate], [0, 24, false]);
      await Promise.all(
        Array.from({ length: 32 }, (_, i) => c.del({ containerId: `ctr-${i}`, ifName: "eth0" })),
      );
      const end = await c.status();
      assertEquals([end.pool.free, end.pool.owned], [24, 0]);
      assertEquals(await c.attachments(), []);
    } finally {
      await agent.stop("SIGTERM");
    }
  });
});

Deno.test("enim agent --check-config validates the provider's own section", async () => {
  await withSandbox(async (dir, sb) => {
    const good = `${dir}/good.jsonc`;
    await Deno.writeTextFile(
      sb.host("good.jsonc"),
      '// ok\n{"provider": {"name": "mock", "mock": {"enis": 3}}}',
    );
    const ok = await runEnim(["agent", "--check-config", "--config", good], { sandbox: sb });
    assertEquals(ok.code, 0, ok.stderr);
    assertMatch(ok.stdout, /^configuration OK: provider mock/);
    const bad = `${dir}/bad.jsonc`;
    await Deno.writeTextFile(
      sb.host("bad.jsonc"),
      '{"provider": {"name": "mock", "mock": {"enis": "x"}}}',
    );
    const ko = await runEnim(["agent", "--check-config", "--config", bad], { sandbox: sb });
    assertEquals(ko.code, 1);
    assertMatch(ko.stderr, /provider\.mock\.enis: Invalid input: expected number/);
    const syntax = `${dir}/syntax.jsonc`;
    await Deno.writeTextFile(sb.host("syntax.jsonc"), '{"provider": {"name": "mock"\n  "x": 1}');
    const se = await runEnim(["agent", "--check-config", "--config", syntax], { sandbox: sb });
    assertEquals(se.code, 1);
    assertMatch(se.stderr, /line 2, column 3: CommaExpected/);
  });
});

// Issue 50 (BCE): --check-config passed with no credentials and with a world-readable file.
Deno.test("enim agent --check-config fails on missing or world-readable BCE credentials, and passes with a 0600 file", async () => {
  await withSandbox(async (dir, sb) => {
    const config = `${dir}/bce.jsonc`;
    await Deno.writeTextFile(
      sb.host("bce.jsonc"),
      JSON.stringify({
        provider: { name: "bce", bce: { region: "bj", credentialsFile: `${dir}/creds.json` } },
      }),
    );
    const run = () => runEnim(["agent", "--check-config", "--config", config], { sandbox: sb });
    const missing = await run();
    assertEquals(missing.code, 1);
    assertStringIncludes(missing.stderr, "Cannot read the BCE credentials file");
    await Deno.writeTextFile(
      sb.host("creds.json"),
      JSON.stringify({ accessKeyId: "AKIDcheck0001", secretAccessKey: "SK-check-secret" }),
    );
    await Deno.chmod(sb.host("creds.json"), 0o644);
    const open = await run();
    assertEquals(open.code, 1);
    assertStringIncludes(open.stderr, "accessible by group or others");
    assert(!open.stderr.includes("SK-check-secret"), "no secret in the message");
    await Deno.chmod(sb.host("creds.json"), 0o600);
    const ok = await run();
    assertEquals(ok.code, 0, ok.stderr);
    assertMatch(ok.stdout, /^configuration OK: provider bce/);
  });
});

// Issue 25 point 5: a profile's subnet overlapping the default's was accepted.
Deno.test("enim agent --check-config refuses a profile subnet that overlaps another profile's, naming both", async () => {
  await withSandbox(async (dir, sb) => {
    const check = async (name: string, provider: Record<string, unknown>) => {
      await Deno.writeTextFile(sb.host(name), JSON.stringify({ provider }));
      return await runEnim(["agent", "--check-config", "--config", `${dir}/${name}`], {
        sandbox: sb,
      });
    };
    const mock = await check("mock.jsonc", {
      name: "mock",
      mock: {
        subnets: { ipv4: { cidr: "10.99.0.0/24" } },
        profiles: { pci: { subnets: { ipv4: { cidr: "10.99.0.128/25" } } } },
      },
    });
    assertEquals(mock.code, 1, mock.stdout);
    assertStringIncludes(
      mock.stderr,
      'provider.mock.profiles.pci.subnets.ipv4: Subnet "10.99.0.128/25" of profile "pci" ' +
        'overlaps subnet "10.99.0.0/24" of profile "default"',
    );
    const bce = await check("bce.jsonc", {
      name: "bce",
      bce: {
        subnetId: "sbn-default01",
        subnetCidr: "10.0.0.0/16",
        securityGroupIds: ["g-default01"],
        profiles: {
          same: {
            subnetId: "sbn-default01",
            subnetCidr: "10.0.0.0/16",
            securityGroupIds: ["g-other001"],
          },
          db: {
            subnetId: "sbn-db000001",
            subnetCidr: "10.0.8.0/24",
            securityGroupIds: ["g-db000001"],
          },
        },
      },
    });
    assertEquals(bce.code, 1, bce.stdout);
    assertStringIncludes(
      bce.stderr,
      'provider.bce.profiles.db.subnetCidr: subnetCidr "10.0.8.0/24" of profile "db" (subnet ' +
        '"sbn-db000001") overlaps "10.0.0.0/16" of profile "default" (subnet "sbn-default01")',
    );
    assert(!bce.stderr.includes("profiles.same"), "a profile may share the default's subnet");
    const apart = await check("apart.jsonc", {
      name: "mock",
      mock: { profiles: { pci: { subnets: { ipv4: { cidr: "10.98.0.0/24" } } } } },
    });
    assertEquals(apart.code, 0, apart.stderr);
  });
});

Deno.test("enim agent --help documents every option", async () => {
  const r = await runEnim(["agent", "--help"]);
  assertEquals(r.code, 0);
  for (
    const opt of [
      "--config",
      "--socket",
      "--state",
      "--provider",
      "--log-level",
      "--gc-interval",
      "--gc-grace",
      "--check-config",
    ]
  ) {
    assertMatch(r.stdout, new RegExp(`${opt}\\b`));
  }
});

Deno.test("bad requests to the real agent get a 400 and leave its state unchanged", async () => {
  await withSandbox(async (dir, sb) => {
    const agent = await startAgent(sb, fakeDevicesConfig(dir, { enis: 3 }));
    try {
      const c = new SocketAgentClient(agent.socket);
      await c.add(podAddRequest(1));
      const dump = async () => JSON.stringify([await c.attachments(), await c.enis()]);
      const before = await dump();
      const bad: [string, string, RegExp][] = [
        ["/v1/add", "{not json", /^Malformed JSON/],
        ["/v1/add", JSON.stringify({ ...podAddRequest(2), ifName: 7 }), /ifName: /],
        ["/v1/add", JSON.stringify({ ...podAddRequest(2), pod: "default/pod-2" }), /pod: /],
        [
          "/v1/add",
          JSON.stringify({ ...podAddRequest(2), pod: { namespace: "Bad_NS", name: "x" } }),
          /pod\.namespace: /,
        ],
        [
          "/v1/add",
          JSON.stringify({ ...podAddRequest(2), netns: "/run/netns/../../etc" }),
          /netns: /,
        ],
        [
          "/v1/del",
          JSON.stringify({ containerId: "ctr-1", ifName: "eth0", netns: "/a/../b" }),
          /netns: /,
        ],
        ["/v1/gc", JSON.stringify({ dryRun: 1 }), /dryRun: /],
      ];
      for (const [path, body, re] of bad) {
        const res = await unixRawPost(agent.socket, path, body);
        assertEquals(res.status, 400, `${path} ${body}`);
        const err = JSON.parse(res.body).error;
        assertEquals(err.code, "bad_request");
        assertMatch(err.message, re);
      }
      assertEquals(await dump(), before);
    } finally {
      await agent.stop("SIGTERM");
    }
  });
});

/** POSTs a raw body (not necessarily JSON) over the socket. */
function unixRawPost(socket: string, path: string, body: string) {
  return unixRequest(socket, "POST", path, body);
}

Deno.test("enim agent --check-config passes on the shipped configs: deploy/agent.jsonc and the DaemonSet's ConfigMap", async () => {
  const { parseAllDocuments } = await import("yaml");
  const { ROOT } = await import("../scripts/_paths.ts");
  const cms = parseAllDocuments(
    await Deno.readTextFile(`${ROOT}/deploy/kubernetes/configmap.yaml`),
  ).map((d) => d.toJS());
  const inCm = cms.find((d) => d?.metadata?.name === "enim-agent-config").data["agent.jsonc"];
  await withSandbox(async (dir, sb) => {
    await Deno.writeTextFile(
      sb.host("file.jsonc"),
      await Deno.readTextFile(`${ROOT}/deploy/agent.jsonc`),
    );
    await Deno.writeTextFile(sb.host("configmap.jsonc"), inCm);
    for (const name of ["file.jsonc", "configmap.jsonc"]) {
      const r = await runEnim(["agent", "--check-config", "--config", `${dir}/${name}`], {
        sandbox: sb,
      });
      assertEquals([r.code, r.stderr], [0, ""], name);
      assertMatch(r.stdout, /^configuration OK: provider mock, socket \/run\/enim\/enim\.sock/);
    }
  });
});
