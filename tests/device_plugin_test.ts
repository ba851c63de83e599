/**
 * The real agent (the built bundle, the production permission set, the mock
 * provider) and the tests' kubelet (tests/support/kubelet: built from the published
 * device-plugin API, not from enim's code) in a sandbox whose kubelet folder is at
 * its production path: what the agent advertises as `enim.dev/eni` follows the
 * mock cloud's quota, its foreign ENIs and its outages; kubelet restarts, agent
 * kills and bad input from kubelet's side leave the agent registered and its CNI
 * service working.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { openDatabase } from "../lib/sqlite.ts";
import { SocketAgentClient, unixRequest } from "../api/client.ts";
import { type MockNode, setMockNode } from "../providers/mock/mod.ts";
import {
  type AgentProcess,
  fakeDevicesConfig,
  podAddRequest,
  startAgent,
} from "./support/agent_proc.ts";
import { runEnim } from "./support/enim.ts";
import { withSandbox } from "./support/run_dir.ts";
import type { EnimSandbox } from "./support/sandbox.ts";
import {
  type Device,
  FakeKubelet,
  hangingKubelet,
  RpcError,
} from "./support/kubelet/fake_kubelet.ts";

function agentConfig(dir: string) {
  return fakeDevicesConfig(dir, { enis: 8, maxEnisPerNode: 4 }, {
    log: { level: "info", file: `${dir}/agent.log` },
    // "auto": the sandbox has kubelet's folder, so the plugin is on.
    devicePlugin: {
      resyncSeconds: 0.1,
      unreachableSeconds: 0.5,
      registerTimeoutSeconds: 1,
    },
  });
}

/** Changes the mock cloud behind the agent's back (its table in the agent's state). */
function cloud(sb: EnimSandbox, patch: Partial<MockNode>): void {
  const db = openDatabase(sb.host("state/enim.db"));
  try {
    setMockNode(db, patch);
  } finally {
    db.close();
  }
}

const health = (list: Device[]) => list.map((d) => `${d.ID}:${d.health[0]}`).join(" ");

/** The agent's metrics text. */
async function metrics(agent: AgentProcess): Promise<string> {
  const res = await unixRequest(
    agent.socket,
    "GET",
    "/metrics",
    undefined,
    5000,
  );
  assertEquals(res.status, 200);
  return res.body;
}

/** How many times the agent has read the mock's capacity. */
async function capacityReads(agent: AgentProcess): Promise<number> {
  const m =
    /enim_provider_call_duration_seconds_count\{[^}]*call="capacity"[^}]*result="ok"[^}]*\} (\d+)/
      .exec(await metrics(agent));
  return Number(m?.[1] ?? 0);
}

async function until(
  what: string,
  cond: () => Promise<boolean> | boolean,
): Promise<void> {
  const ok = await poll(async () => (await cond()) || null, {
    timeoutMs: 10_000,
    intervalMs: 20,
  });
  assert(ok, `Timed out waiting until ${what}`);
}

Deno.test("the agent advertises the mock's capacity as enim.dev/eni and follows its quota, foreign ENIs and outages, with no duplicate list", async () => {
  await withSandbox(async (dir, sb) => {
    await using kubelet = await FakeKubelet.start(sb.kubeletDir, { podResources: true });
    const agent = await startAgent(sb, agentConfig(dir));
    const client = kubelet.plugin(
      (await kubelet.waitForRegistrations(1)).endpoint,
    );
    try {
      assertEquals(kubelet.registrations[0].resource_name, "enim.dev/eni");
      assertEquals(await client.options(), {
        pre_start_required: false,
        get_preferred_allocation_available: false,
      });
      const watch = client.watch();
      assertEquals(
        health(await watch.list(1)),
        "eni-0:H eni-1:H eni-2:H eni-3:H",
      );
      // Nothing changes for several reads of the capacity: no list is sent again.
      const reads = await capacityReads(agent);
      await until(
        "three more capacity reads",
        async () => (await capacityReads(agent)) >= reads + 3,
      );
      assertEquals(
        watch.lists.length,
        1,
        "a list was sent again though nothing changed",
      );

      cloud(sb, { maxEnis: 5 });
      assertEquals(
        health(await watch.list(2)),
        "eni-0:H eni-1:H eni-2:H eni-3:H eni-4:H",
      );
      cloud(sb, { foreignEnis: 1 });
      assertEquals(
        health(await watch.list(3)),
        "eni-0:H eni-1:H eni-2:H eni-3:H eni-4:U",
      );
      const status = await new SocketAgentClient(agent.socket).status();
      assertEquals(status.devicePlugin?.state, "registered");
      assertEquals(
        status.devicePlugin?.unhealthyReasons.map((u) => [u.reason, u.devices]),
        [[
          "foreign",
          1,
        ]],
      );
      const out = await runEnim(["status"], { sandbox: sb });
      assertEquals(out.code, 0, out.stderr);
      assertStringIncludes(
        out.stdout,
        "device plugin enim.dev/eni: registered with kubelet, 5 devices advertised: 4 healthy, 1 unhealthy\n" +
          "UNHEALTHY: 1 device: 1 slot of the node's ENI limit taken by 1 ENI enim does not own\n",
      );
      const m = await metrics(agent);
      assertMatch(m, /^enim_device_plugin_registered 1$/m);
      assertMatch(m, /^enim_device_plugin_devices\{health="Unhealthy"\} 1$/m);
      assertMatch(
        m,
        /^enim_device_plugin_unhealthy_devices\{reason="foreign"\} 1$/m,
      );

      // The cloud stops answering: past unreachableSeconds every device is Unhealthy.
      cloud(sb, { unreachable: "test outage" });
      assertEquals(
        health(await watch.list(4)),
        "eni-0:U eni-1:U eni-2:U eni-3:U eni-4:U",
      );
      const down = await new SocketAgentClient(agent.socket).status();
      assertMatch(
        down.devicePlugin?.unhealthyReasons[0]?.message ?? "",
        /^The provider has not answered for \d+ s: The mock cloud did not answer "capacity": test outage$/,
      );
      cloud(sb, { unreachable: null });
      assertEquals(
        health(await watch.list(5)),
        "eni-0:H eni-1:H eni-2:H eni-3:H eni-4:U",
      );
      assertEquals(watch.lists.length, 5);
      watch.cancel();
    } finally {
      await client.close();
      assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
    }
  }, { kubelet: true });
});

Deno.test("the agent takes the ENIs kubelet counts no device for off the healthy devices: a sticky pod's hold, a pod without the request, IPAM mode", async () => {
  await withSandbox(async (dir, sb) => {
    await using kubelet = await FakeKubelet.start(sb.kubeletDir, { podResources: true });
    const agent = await startAgent(sb, agentConfig(dir));
    const client = kubelet.plugin((await kubelet.waitForRegistrations(1)).endpoint);
    const c = new SocketAgentClient(agent.socket);
    /** Waits until the agent advertises `healthy` healthy devices; then their reasons. */
    const advertised = async (healthy: number) => {
      await until(
        `${healthy} healthy devices`,
        async () => (await c.status()).devicePlugin?.healthy === healthy,
      );
      const s = (await c.status()).devicePlugin!;
      return Object.fromEntries(s.unhealthyReasons.map((u) => [u.reason, u.devices]));
    };
    try {
      const watch = client.watch();
      assertEquals(health(await watch.list(1)), "eni-0:H eni-1:H eni-2:H eni-3:H");
      // A pod admitted with its device: its ENI is the device kubelet counts.
      await kubelet.admit("default", "pod-1", ["eni-0"]);
      await c.add(podAddRequest(1));
      // A pod of a namespace without the admission policy: kubelet counts no device.
      await kubelet.admit("default", "pod-2", []);
      await c.add(podAddRequest(2));
      assertEquals(await advertised(3), { no_device: 1 });
      assertEquals(health(await watch.latest()), "eni-0:H eni-1:H eni-2:H eni-3:U");
      // A sticky pod, deleted: kubelet frees its device, the ENI stays held for it.
      await kubelet.admit("default", "pod-3", ["eni-1"]);
      await c.add({ ...podAddRequest(3), sticky: true });
      assertEquals(await advertised(3), { no_device: 1 });
      await kubelet.forget("default", "pod-3");
      await c.del({ containerId: "ctr-3", ifName: "eth0", netns: "/run/netns/pod-3" });
      assertEquals(await advertised(2), { sticky_hold: 1, no_device: 1 });
      // IPAM mode under another plugin, for a pod kubelet gave no device.
      await c.add({ ...podAddRequest(4), mode: "ipam", netns: "/dev/null" });
      assertEquals(await advertised(1), { sticky_hold: 1, no_device: 2 });
      assertEquals(health(await watch.latest()), "eni-0:H eni-1:U eni-2:U eni-3:U");
      const out = await runEnim(["status"], { sandbox: sb });
      assertEquals(out.code, 0, out.stderr);
      assertStringIncludes(out.stdout, "1 ENI held for sticky pods that are gone");
      assertStringIncludes(
        out.stdout,
        "2 ENIs taken by attachments kubelet counts no enim.dev/eni",
      );
      assertMatch(
        await metrics(agent),
        /^enim_device_plugin_unhealthy_devices\{reason="sticky_hold"\} 1$/m,
      );
      // The sticky pod is re-created here and admitted: its device covers the hold.
      await kubelet.admit("default", "pod-3", ["eni-1"]);
      assertEquals(await advertised(2), { no_device: 2 });
      assert((await kubelet.podResourcesCalls()) > 0);
      watch.cancel();
    } finally {
      await client.close();
      assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
    }
  }, { kubelet: true });
});

Deno.test("kubelet restarts (every socket deleted): the agent registers again within 10 s", async () => {
  await withSandbox(async (dir, sb) => {
    await using kubelet = await FakeKubelet.start(sb.kubeletDir);
    const agent = await startAgent(sb, agentConfig(dir));
    try {
      await kubelet.waitForRegistrations(1);
      for (let restart = 2; restart <= 3; restart++) {
        await kubelet.restart();
        const again = await kubelet.waitForRegistrations(restart, 10_000);
        assertEquals(again.endpoint, "enim.sock");
        const client = kubelet.plugin(again.endpoint);
        try {
          const watch = client.watch();
          assertEquals((await watch.list(1)).length, 4);
          watch.cancel();
        } finally {
          await client.close();
        }
      }
    } finally {
      assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
    }
  }, { kubelet: true });
});

Deno.test("the agent killed with SIGKILL and started again registers again; ENIs held by pods are untouched", async () => {
  await withSandbox(async (dir, sb) => {
    await using kubelet = await FakeKubelet.start(sb.kubeletDir);
    let agent = await startAgent(sb, agentConfig(dir));
    try {
      await kubelet.waitForRegistrations(1);
      const c = new SocketAgentClient(agent.socket);
      const held = [await c.add(podAddRequest(1)), await c.add(podAddRequest(2))];
      const before = await c.attachments();
      await agent.stop("SIGKILL");
      agent = await startAgent(sb, agentConfig(dir));
      await kubelet.waitForRegistrations(2, 10_000);
      const after = await new SocketAgentClient(agent.socket).attachments();
      assertEquals(after, before);
      assertEquals(after.map((a) => a.eniId), held.map((h) => h.eniId));
      const client = kubelet.plugin("enim.sock");
      try {
        const watch = client.watch();
        // The same devices as before the kill: derived from the state, not from memory.
        assertEquals(
          health(await watch.list(1)),
          "eni-0:H eni-1:H eni-2:H eni-3:H",
        );
        watch.cancel();
      } finally {
        await client.close();
      }
    } finally {
      assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
    }
  }, { kubelet: true });
});

Deno.test("bad input from kubelet's side (unknown device IDs, a closed stream, a kubelet that hangs): clear errors, the CNI service unaffected", async () => {
  await withSandbox(async (dir, sb) => {
    let kubelet: FakeKubelet | null = await FakeKubelet.start(sb.kubeletDir);
    const agent = await startAgent(sb, agentConfig(dir));
    const c = new SocketAgentClient(agent.socket);
    const hung = { close: () => Promise.resolve() };
    try {
      const client = kubelet.plugin(
        (await kubelet.waitForRegistrations(1)).endpoint,
      );
      try {
        const err = await client.allocate([["eni-7", "eni-0"]]).then(
          () => null,
          (e) => e,
        );
        assert(err instanceof RpcError, String(err));
        assertEquals(err.code, 3);
        assertEquals(
          err.details,
          'Unknown enim.dev/eni device ID "eni-7": this node advertises "eni-0" to "eni-3"',
        );
        const watch = client.watch();
        await watch.list(1);
        watch.cancel();
        await watch.end();
        assertEquals(
          (await client.allocate([["eni-0"]])).container_responses.length,
          1,
        );
      } finally {
        await client.close();
      }
      assertEquals(
        (await c.add(podAddRequest(1))).ips.length,
        1,
        "ADD works after the bad input",
      );

      // kubelet goes, and what comes back on its socket accepts and never answers.
      await kubelet[Symbol.asyncDispose]();
      kubelet = null;
      Object.assign(hung, hangingKubelet(sb.kubeletDir));
      await until(
        "the agent says kubelet did not answer",
        async () =>
          /did not answer Register on "\/var\/lib\/kubelet\/device-plugins\/kubelet.sock" within 1 s/
            .test((await c.status()).devicePlugin?.reason ?? ""),
      );
      assertEquals((await c.status()).devicePlugin?.state, "registering");
      // Meanwhile pods come and go as ever.
      assertEquals((await c.add(podAddRequest(2))).ips.length, 1);
      await c.del({ containerId: "ctr-1", ifName: "eth0" });
      assertEquals((await c.attachments()).map((a) => a.pod), [
        "default/pod-2",
      ]);
      const out = await runEnim(["status"], { sandbox: sb });
      assertEquals(out.code, 0, out.stderr);
      assertStringIncludes(out.stdout, "NOT REGISTERED with kubelet");

      // kubelet is back: the agent registers.
      await hung.close();
      kubelet = await FakeKubelet.start(sb.kubeletDir);
      await kubelet.waitForRegistrations(1, 10_000);
      await until(
        "the agent is registered",
        async () => (await c.status()).devicePlugin?.state === "registered",
      );
    } finally {
      await hung.close();
      await kubelet?.[Symbol.asyncDispose]();
      assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
    }
    const log = await Deno.readTextFile(sb.host("agent.log"));
    assertMatch(
      log,
      /"msg":"kubelet asked to allocate devices this node does not advertise"/,
    );
    assertMatch(
      log,
      /"msg":"Cannot register the device plugin with kubelet; retrying"/,
    );
  }, { kubelet: true });
});

Deno.test("where kubelet's folder does not exist the device plugin stays off and says why", async () => {
  await withSandbox(async (dir, sb) => {
    const agent = await startAgent(sb, agentConfig(dir));
    try {
      // The API answers a moment before the device plugin is launched ("The agent is
      // starting" until then): its own answer is awaited.
      const client = new SocketAgentClient(agent.socket);
      const status = await poll(async () => {
        const s = await client.status();
        return s.devicePlugin?.reason === "The agent is starting" ? null : s;
      }, { timeoutMs: 10_000, intervalMs: 20 });
      assert(status, "the device plugin was never launched");
      assertEquals(status.devicePlugin?.state, "off");
      assertEquals(
        status.devicePlugin?.reason,
        'kubelet\'s device-plugin folder "/var/lib/kubelet/device-plugins" does not exist (no kubelet on this node; devicePlugin.enabled true waits for it)',
      );
      assertMatch(await metrics(agent), /^enim_device_plugin_registered 0$/m);
      assert(
        !/enim_device_plugin_devices\{/.test(await metrics(agent)),
        "no device gauges",
      );
    } finally {
      assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
    }
  });
});
