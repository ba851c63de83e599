import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { ApiError } from "../api/schema.ts";
import { FakeAgent, SAMPLE_ADD_RESPONSE, sampleStatus } from "../tests/support/fake_agent.ts";
import { expectError, expectQuietSuccess, run } from "../tests/support/run_dispatch.ts";
import { SUPPORTED_VERSIONS } from "./negotiate.ts";

const ENV = {
  CNI_CONTAINERID: "c0ffee01",
  CNI_NETNS: "/run/netns/pod1",
  CNI_IFNAME: "eth0",
  CNI_PATH: "/opt/cni/bin",
  CNI_ARGS: "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web-0;K8S_POD_UID=uid-1",
};
const env = (command: string, over: Record<string, string | undefined> = {}) => ({
  ...ENV,
  CNI_COMMAND: command,
  ...over,
});
const iface = (v: string, over: Record<string, unknown> = {}) => ({
  cniVersion: v,
  name: "enimnet",
  type: "enim",
  ...over,
});
const ipam = (v: string, over: Record<string, unknown> = {}) => ({
  cniVersion: v,
  name: "enimnet",
  type: "bridge",
  ipam: { type: "enim", ...over },
});
/** The attachment ENV and the networks above name, as the agent's requests carry it. */
const ATTACHMENT = {
  containerId: "c0ffee01",
  ifName: "eth0",
  netns: "/run/netns/pod1",
  network: "enimnet",
};
/** Versions whose format defines each verb. */
const CHECK_VERSIONS = SUPPORTED_VERSIONS.filter((v) => !v.startsWith("0.3"));

Deno.test("VERSION answers the supported versions for every requested version", async (t) => {
  for (const v of [...SUPPORTED_VERSIONS, "1.0.10", "2.0.0"]) {
    await t.step(v, async () => {
      const r = await run({ CNI_COMMAND: "VERSION" }, { cniVersion: v });
      assertEquals(r.code, 0);
      assertEquals(JSON.parse(r.stdout), {
        cniVersion: v,
        supportedVersions: ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
      });
    });
  }
  await t.step("empty stdin", async () => {
    const r = await run({ CNI_COMMAND: "VERSION" }, "");
    assertEquals(JSON.parse(r.stdout).cniVersion, "1.1.0");
  });
  await t.step("malformed JSON → 6", async () => {
    expectError(await run({ CNI_COMMAND: "VERSION" }, "{"), 6);
  });
});

Deno.test("bad input of each class fails with its code and only the error on stdout", async (t) => {
  for (const v of SUPPORTED_VERSIONS) {
    await t.step(`${v}: malformed JSON → 6`, async () => {
      expectError(await run(env("ADD"), '{"cniVersion": "' + v + '", '), 6);
    });
    await t.step(`${v}: JSON that is not an object → 6`, async () => {
      expectError(await run(env("ADD"), "[1,2]"), 6);
    });
    await t.step(`${v}: empty stdin → 6`, async () => {
      expectError(await run(env("DEL"), ""), 6);
    });
    await t.step(`${v}: invalid config → 7 naming the field`, async () => {
      const e = expectError(await run(env("ADD"), iface(v, { mtu: "big" })), 7, v);
      assertStringIncludes(e.msg, "mtu");
    });
    await t.step(`${v}: not an enim config → 7`, async () => {
      expectError(await run(env("ADD"), { cniVersion: v, name: "n", type: "bridge" }), 7, v);
    });
    await t.step(`${v}: missing env → 4 naming the variables`, async () => {
      const r = await run(env("ADD", { CNI_NETNS: undefined, CNI_IFNAME: "" }), iface(v));
      const e = expectError(r, 4, v);
      assertStringIncludes(e.msg, "CNI_NETNS");
      assertStringIncludes(e.msg, "CNI_IFNAME");
    });
    await t.step(`${v}: invalid env → 4 naming the variable`, async () => {
      const e = expectError(await run(env("ADD", { CNI_IFNAME: "a/b" }), iface(v)), 4, v);
      assertStringIncludes(e.msg, "CNI_IFNAME");
    });
    await t.step(`${v}: unknown CNI_ARGS key → 4 naming CNI_ARGS`, async () => {
      const e = expectError(await run(env("ADD", { CNI_ARGS: "FOO=1" }), iface(v)), 4, v);
      assertStringIncludes(e.msg, "CNI_ARGS");
      assertStringIncludes(e.msg, "FOO");
    });
    await t.step(`${v}: malformed CNI_ARGS → 4`, async () => {
      expectError(await run(env("ADD", { CNI_ARGS: "K8S_POD_NAME" }), iface(v)), 4, v);
    });
    await t.step(`${v}: no agent call was made for bad input`, async () => {
      const r = await run(env("ADD", { CNI_ARGS: "FOO=1" }), iface(v));
      assertEquals(r.agent.calls, []);
    });
  }
  for (const v of ["2.0.0", "0.2.0", "1.2.0", "zzz"]) {
    await t.step(`unsupported ${v} → 1`, async () => {
      const e = expectError(await run(env("ADD"), iface(v)), 1, v);
      assertStringIncludes(e.msg, "1.1.0");
    });
  }
});

Deno.test("ADD sends the request to the agent and prints the converted result", async (t) => {
  for (const v of SUPPORTED_VERSIONS) {
    await t.step(`${v} interface mode`, async () => {
      const r = await run(env("ADD"), iface(v, { mtu: 9000, routes: [{ dst: "10.0.0.0/8" }] }));
      assertEquals(r.code, 0, r.stdout);
      assertEquals(r.agent.calls.length, 1);
      assertEquals(r.agent.calls[0].req, {
        ...ATTACHMENT,
        pod: { namespace: "ns1", name: "web-0", uid: "uid-1" },
        mode: "interface",
        ips: [],
        ranges: [],
        routes: [{ dst: "10.0.0.0/8" }],
        defaultRoutes: true,
        mtu: 9000,
        // A Kubernetes pod (K8S_POD_NAMESPACE): the host link is on by default.
        hostLink: {
          podIfName: "host0",
          nodeIfPrefix: "enimh",
          serviceCidrs: [],
          hostStackCidrs: [],
        },
      });
      const out = JSON.parse(r.stdout);
      assertEquals(out.cniVersion, v);
      assertEquals(out.interfaces[0], {
        name: "eth0",
        mac: SAMPLE_ADD_RESPONSE.mac,
        ...(v === "1.1.0" ? { mtu: 9000 } : {}),
        sandbox: "/run/netns/pod1",
      });
      assertEquals(out.ips[0].interface, 0);
      assertEquals(out.ips[0].version, v.startsWith("0.") ? "4" : undefined);
    });
    await t.step(`${v} IPAM mode`, async () => {
      const r = await run(
        env("ADD"),
        ipam(v, { agentSocket: "/run/enim/b.sock", timeoutSeconds: 2 }),
      );
      assertEquals(r.code, 0, r.stdout);
      assertEquals((r.agent.calls[0].req as { mode: string }).mode, "ipam");
      const out = JSON.parse(r.stdout);
      assertEquals(out.interfaces, [{ mac: SAMPLE_ADD_RESPONSE.mac }]);
      assertEquals(out.ips[0].interface, 10);
    });
  }
  await t.step("the seed's example config (1.0.10, no top-level type)", async () => {
    const r = await run(env("ADD"), {
      cniVersion: "1.0.10",
      name: "examplenet",
      ipam: { type: "enim" },
    });
    assertEquals(r.code, 0, r.stdout);
    assertEquals(JSON.parse(r.stdout).cniVersion, "1.0.10");
    assertEquals(JSON.parse(r.stdout).ips[0].version, undefined);
  });
  await t.step("args.cni.ips wins over IP=, runtimeConfig.ipRanges is forwarded", async () => {
    const ranges = [[{ subnet: "10.0.1.0/24" }]];
    const r = await run(
      env("ADD", { CNI_ARGS: "IP=10.0.1.9" }),
      iface("1.1.0", {
        args: { cni: { ips: ["10.0.1.7/24"] } },
        runtimeConfig: { ipRanges: ranges },
      }),
    );
    const req = r.agent.calls[0].req as { ips: string[]; ranges: unknown };
    assertEquals(req.ips, ["10.0.1.7"]);
    assertEquals(req.ranges, ranges);
  });
  await t.step("IP= is used when args.cni.ips is absent", async () => {
    const r = await run(env("ADD", { CNI_ARGS: "IP=10.0.1.9" }), iface("1.1.0"));
    assertEquals((r.agent.calls[0].req as { ips: string[] }).ips, ["10.0.1.9"]);
  });
  await t.step("no Kubernetes keys: owner default/<container id>", async () => {
    const r = await run(env("ADD", { CNI_ARGS: undefined }), iface("1.1.0"));
    assertEquals((r.agent.calls[0].req as { pod: unknown }).pod, {
      namespace: "default",
      name: "c0ffee01",
    });
  });
  await t.step("an empty pool → 100 saying so", async () => {
    const agent = new FakeAgent({
      add: () => {
        throw new ApiError("no_eni_available", "0 free ENIs, 0 attachable");
      },
    });
    const e = expectError(await run(env("ADD"), iface("1.1.0"), agent), 100);
    assertStringIncludes(e.msg, "pool is empty");
  });
  await t.step("one log line with verb, container, owner, ENI, code and duration", async () => {
    const r = await run(env("ADD"), iface("1.1.0"));
    assertEquals(r.logs.length, 1);
    const l = r.logs[0];
    assertEquals([l.verb, l.containerId, l.pod, l.eniId, l.code], [
      "ADD",
      "c0ffee01",
      "ns1/web-0",
      "eni-0001",
      0,
    ]);
    assert(typeof l.durationMs === "number");
  });
});

Deno.test("DEL releases through the agent and tolerates what is already gone", async (t) => {
  await t.step("forwards the attachment", async () => {
    const r = await run(env("DEL"), iface("1.1.0"));
    expectQuietSuccess(r);
    assertEquals(r.agent.calls[0].req, ATTACHMENT);
  });
  await t.step("without CNI_NETNS, netns is empty", async () => {
    const r = await run(env("DEL", { CNI_NETNS: undefined }), iface("1.1.0"));
    expectQuietSuccess(r);
    assertEquals((r.agent.calls[0].req as { netns: string }).netns, "");
  });
  await t.step("bad CNI_ARGS do not fail a DEL", async () => {
    const r = await run(env("DEL", { CNI_ARGS: "FOO=1" }), iface("1.1.0"));
    expectQuietSuccess(r);
    assertEquals(r.logs[0].level, "warn");
  });
  await t.step("not_found from the agent is success", async () => {
    const agent = new FakeAgent({
      del: () => {
        throw new ApiError("not_found", "no such attachment");
      },
    });
    expectQuietSuccess(await run(env("DEL"), iface("1.1.0"), agent));
  });
  await t.step("another agent error fails the DEL", async () => {
    const agent = new FakeAgent({
      del: () => {
        throw new ApiError("device_error", "cannot move eth0");
      },
    });
    expectError(await run(env("DEL"), iface("1.1.0"), agent), 105);
  });
});

Deno.test("CHECK compares with prevResult through the agent", async (t) => {
  const prevFor = (v: string) => ({
    cniVersion: v,
    interfaces: [
      { name: "lo", sandbox: "/run/netns/pod1" },
      { name: "eth0", mac: "02:00:00:00:00:01", sandbox: "/run/netns/pod1" },
    ],
    ips: [
      { address: "127.0.0.1/8", interface: 0, ...(v.startsWith("0.") ? { version: "4" } : {}) },
      {
        address: "10.0.1.5/24",
        gateway: "10.0.1.1",
        interface: 1,
        ...(v.startsWith("0.") ? { version: "4" } : {}),
      },
    ],
    routes: [{ dst: "0.0.0.0/0", gw: "10.0.1.1" }],
  });
  for (const v of CHECK_VERSIONS) {
    await t.step(`${v} sends the expected MAC, addresses and routes`, async () => {
      const r = await run(env("CHECK"), iface(v, { prevResult: prevFor(v) }));
      expectQuietSuccess(r);
      assertEquals(r.agent.calls[0].req, {
        ...ATTACHMENT,
        mode: "interface",
        expected: {
          mac: "02:00:00:00:00:01",
          addresses: ["10.0.1.5/24"],
          routes: [{ dst: "0.0.0.0/0", gw: "10.0.1.1" }],
        },
      });
    });
    await t.step(`${v} without prevResult → 7`, async () => {
      assertStringIncludes(expectError(await run(env("CHECK"), iface(v)), 7).msg, "prevResult");
    });
  }
  for (const v of ["0.3.0", "0.3.1"]) {
    await t.step(`${v} has no CHECK → 1`, async () => {
      expectError(await run(env("CHECK"), iface(v, { prevResult: prevFor(v) })), 1, v);
    });
  }
  await t.step("IPAM mode sends all addresses and no MAC", async () => {
    const r = await run(
      env("CHECK"),
      ipam("1.1.0").ipam && {
        ...ipam("1.1.0"),
        prevResult: prevFor("1.1.0"),
      },
    );
    expectQuietSuccess(r);
    const req = r.agent.calls[0].req as { expected: { mac?: string; addresses: string[] } };
    assertEquals(req.expected.mac, undefined);
    assertEquals(req.expected.addresses, ["127.0.0.1/8", "10.0.1.5/24"]);
  });
  await t.step("an interface missing from prevResult → 106", async () => {
    const r = await run(
      env("CHECK", { CNI_IFNAME: "net9" }),
      iface("1.1.0", { prevResult: prevFor("1.1.0") }),
    );
    expectError(r, 106);
  });
  await t.step("the agent's check_failed → 106", async () => {
    const agent = new FakeAgent({
      check: () => {
        throw new ApiError("check_failed", "address 10.0.1.5/24 missing");
      },
    });
    const r = await run(env("CHECK"), iface("1.1.0", { prevResult: prevFor("1.1.0") }), agent);
    assertStringIncludes(expectError(r, 106).msg, "10.0.1.5/24");
  });
});

Deno.test("GC forwards the valid attachments of its network", async (t) => {
  const gcEnv = { CNI_COMMAND: "GC", CNI_PATH: "/opt/cni/bin" };
  const valid = [{ containerID: "c1", ifname: "eth0" }, { containerID: "c2", ifname: "net1" }];
  await t.step("1.1.0: forwarded as {containerId, ifName}", async () => {
    const r = await run(gcEnv, iface("1.1.0", { "cni.dev/valid-attachments": valid }));
    expectQuietSuccess(r);
    assertEquals(r.agent.calls[0].req, {
      network: "enimnet",
      validAttachments: [{ containerId: "c1", ifName: "eth0" }, {
        containerId: "c2",
        ifName: "net1",
      }],
    });
  });
  await t.step("IPAM mode too", async () => {
    const r = await run(gcEnv, { ...ipam("1.1.0"), "cni.dev/valid-attachments": [] });
    expectQuietSuccess(r);
    assertEquals(r.agent.calls[0].req, { network: "enimnet", validAttachments: [] });
  });
  await t.step("null (a Go nil slice) means no valid attachments", async () => {
    const r = await run(gcEnv, iface("1.1.0", { "cni.dev/valid-attachments": null }));
    expectQuietSuccess(r);
    assertEquals((r.agent.calls[0].req as { validAttachments: unknown[] }).validAttachments, []);
  });
  await t.step("a missing list → 7, nothing reclaimed", async () => {
    const r = await run(gcEnv, iface("1.1.0"));
    expectError(r, 7);
    assertEquals(r.agent.calls, []);
  });
  await t.step("missing CNI_PATH → 4", async () => {
    expectError(
      await run({ CNI_COMMAND: "GC" }, iface("1.1.0", { "cni.dev/valid-attachments": [] })),
      4,
    );
  });
  for (const v of SUPPORTED_VERSIONS.filter((s) => s !== "1.1.0")) {
    await t.step(`${v} has no GC → 1`, async () => {
      expectError(await run(gcEnv, iface(v, { "cni.dev/valid-attachments": [] })), 1, v);
    });
  }
  await t.step("failed reclaims → 107 listing them", async () => {
    const agent = new FakeAgent({
      gc: () => ({
        dryRun: false,
        unfinishedDels: [],
        items: [{
          eniId: "eni-9",
          mac: "02:00:00:00:00:09",
          device: "eni9",
          pod: "ns/p",
          containerId: "c9",
          ifName: "eth0",
          netns: "/run/netns/x",
          reason: "not in valid-attachments",
          action: "reclaim",
          outcome: "failed",
          error: "provider timeout",
          kind: "dead",
          profile: "default",
        }],
      }),
    });
    const r = await run(gcEnv, iface("1.1.0", { "cni.dev/valid-attachments": [] }), agent);
    assertStringIncludes(expectError(r, 107).details ?? "", "eni-9");
  });
});

Deno.test("STATUS reports whether the agent is ready, whatever its pool holds", async (t) => {
  const st = { CNI_COMMAND: "STATUS" };
  await t.step("0 when the pool can allocate", async () => {
    const r = await run(st, iface("1.1.0"));
    expectQuietSuccess(r);
    assertEquals(r.agent.calls.map((c) => c.method), ["status"]);
  });
  // Issue 33 item 1: a full node is a scheduling fact; a 50 here evicts every pod on it.
  await t.step("0 when the pool is exhausted: a full node's network is ready", async () => {
    const agent = new FakeAgent({
      status: () =>
        sampleStatus({
          canAllocate: false,
          pool: {
            exhausted: true,
            free: 0,
            owned: 4,
            recycling: 0,
            held: 1,
            attachable: 0,
            profiles: {},
          },
        }),
    });
    expectQuietSuccess(await run(st, iface("1.1.0"), agent));
  });
  await t.step("50 when the agent is not ready", async () => {
    const agent = new FakeAgent({ status: () => sampleStatus({ ready: false }) });
    assertStringIncludes(expectError(await run(st, ipam("1.1.0"), agent), 50).msg, "not ready");
  });
  for (const v of SUPPORTED_VERSIONS.filter((s) => s !== "1.1.0")) {
    await t.step(`${v} has no STATUS → 1`, async () => {
      expectError(await run(st, iface(v)), 1, v);
    });
  }
});

Deno.test("a broken logger or stdout never changes the outcome", async (t) => {
  await t.step("openLog that throws", async () => {
    let out = "";
    const { dispatchCall } = await import("./dispatch.ts");
    const code = await dispatchCall({
      env: env("ADD"),
      stdin: JSON.stringify(iface("1.1.0")),
      stdout: (s) => (out += s),
      agent: new FakeAgent(),
      openLog: () => {
        throw new Error("disk full");
      },
    });
    assertEquals(code, 0);
    assertEquals(JSON.parse(out).interfaces[0].name, "eth0");
  });
  await t.step("stdout that throws → exit 1, no exception", async () => {
    const { dispatchCall } = await import("./dispatch.ts");
    const code = await dispatchCall({
      env: env("ADD"),
      stdin: JSON.stringify(iface("1.1.0")),
      stdout: () => {
        throw new Deno.errors.BrokenPipe("closed");
      },
      agent: new FakeAgent(),
    });
    assertEquals(code, 1);
  });
});
