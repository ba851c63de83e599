/**
 * Every lazily loaded module of the shipped bundle, loaded by the bundle itself.
 *
 * The bundle (`deno task build`) splits enim into chunks, and each `import()` of the source
 * becomes an `import()` of a chunk. What such a chunk exports is the bundler's work, not the
 * source's: an `import()` of an npm package that is CommonJS gives a chunk with a default
 * export only, so the named exports the source reads are undefined there. That is how the
 * shipped agent died at start on every YAML kubeconfig (`TypeError: s is not a constructor`,
 * issue 41) while `deno run main.ts` and every unit test worked.
 *
 * So this file holds two rules:
 * - every `import()` in the shipped folders names one of enim's own modules by a literal
 *   relative path (an npm package is imported statically, by a module of ours that the
 *   `import()` loads: `kube/_yaml.ts`);
 * - every such `import()` is listed in {@linkcode SITES} with the scenario that drives it,
 *   and each scenario runs the built bundle, as the launcher, the compiled binary and the
 *   systemd unit run it, and checks that the lazily loaded code did its work. A new
 *   `import()` with no scenario fails here.
 *
 * @module
 */
import { stringify } from "yaml";
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { join, ROOT, SHIPPED_DIRS } from "./_paths.ts";
import { isRoot } from "./_deps.ts";
import { runEnim } from "../tests/support/enim.ts";
import { EnimSandbox } from "../tests/support/sandbox.ts";
import { fakeDevicesConfig, startAgent } from "../tests/support/agent_proc.ts";
import { KubeApiServer } from "../tests/support/kube_apiserver.ts";
import { makeTestPki } from "../tests/support/kube_pki.ts";
import { makeNamespace, makeNetworkPolicy, makePod } from "../tests/support/kube_objects.ts";
import { SocketAgentClient } from "../api/client.ts";
import { SimulatedNode } from "../tests/support/node.ts";

/** The scenarios, each run once against the bundle below. */
type Scenario = "plugin" | "cli" | "check-config" | "agent" | "kernel";

/**
 * Every `import()` of the shipped source (`file: specifier`) and the scenario that loads
 * it through the bundle.
 */
const SITES: Record<string, Scenario> = {
  "main.ts: ./cni/forward.ts": "plugin",
  "main.ts: ./cli/mod.ts": "cli",
  "cli/agent.ts: ../agent/agent.ts": "agent",
  "cli/agent.ts: ../agent/deps.ts": "agent",
  "cli/agent.ts: ../providers/registry.ts": "check-config",
  "cli/agent.ts: ../agent/cni_conflist.ts": "check-config",
  "providers/registry.ts: ./mock/mod.ts": "check-config",
  "providers/registry.ts: ./bce/mod.ts": "check-config",
  "agent/deps.ts: ./fake_devices.ts": "agent",
  "agent/deps.ts: ../netns/mod.ts": "kernel",
  "agent/deps.ts: ../netns/sim.ts": "kernel",
  "agent/deviceplugin/launch.ts: ./mod.ts": "agent",
  "kube/kubeconfig.ts: ./_yaml.ts": "agent",
  "cli/uninstall.ts: ../agent/uninstall.ts": "kernel",
  "cli/uninstall.ts: ../agent/deps.ts": "kernel",
};

/** Every `import(` of the shipped source: its file, its argument's text. */
function importSites(): { file: string; arg: string }[] {
  const files: string[] = ["main.ts"];
  const visit = (rel: string) => {
    for (const e of Deno.readDirSync(join(ROOT, rel))) {
      const path = `${rel}/${e.name}`;
      if (e.isDirectory) visit(path);
      else if (/\.ts$/.test(e.name) && !/_test\.ts$|_bench\.ts$/.test(e.name)) files.push(path);
    }
  };
  for (const dir of SHIPPED_DIRS) visit(dir);
  const out: { file: string; arg: string }[] = [];
  for (const file of files) {
    const text = Deno.readTextFileSync(join(ROOT, file))
      // Comments may mention import() (this file's own kind of prose): code only.
      .replace(/\/\*[\s\S]*?\*\//g, "")
      .replace(/(^|[^:"'`\\])\/\/.*$/gm, "$1");
    for (const m of text.matchAll(/\bimport\s*\(\s*([^)]*?)\s*[,)]/g)) {
      out.push({ file, arg: m[1] });
    }
  }
  return out;
}

Deno.test("every import() of the shipped source names one of enim's modules by a literal relative path", () => {
  const sites = importSites();
  assert(sites.length >= Object.keys(SITES).length, `found ${sites.length} import() sites`);
  const bad = sites.filter((s) => !/^(["'])\.\.?\/[^"'`$]+\.ts\1$/.test(s.arg));
  assertEquals(
    bad.map((s) => `${s.file}: import(${s.arg})`),
    [],
    "an import() of an npm package (or of a computed name) has the bundler's exports, not the " +
      "package's: import the package statically in a module of enim's and import() that",
  );
});

Deno.test("every import() of the shipped source has a scenario that loads it through the bundle", () => {
  const found = importSites().map((s) => `${s.file}: ${s.arg.slice(1, -1)}`);
  assertEquals(found.filter((k) => !(k in SITES)), [], "import() sites with no scenario in SITES");
  assertEquals(
    Object.keys(SITES).filter((k) => !found.includes(k)),
    [],
    "SITES lists import() sites the source no longer has",
  );
});

Deno.test("the bundle loads each lazily loaded module and runs it", async (t) => {
  const ran = new Set<Scenario>();

  await t.step("plugin: CNI_COMMAND starts the plugin process (cni/forward.ts)", async () => {
    const r = await runEnim([], {
      env: { CNI_COMMAND: "VERSION" },
      stdin: JSON.stringify({ cniVersion: "1.1.0", name: "enim-net", type: "enim" }),
    });
    assertEquals(r.code, 0, r.stderr);
    assertStringIncludes(JSON.parse(r.stdout).supportedVersions, "1.1.0");
    ran.add("plugin");
  });

  await t.step("cli: a command loads the CLI (cli/mod.ts)", async () => {
    const r = await runEnim(["version"]);
    assertEquals(r.code, 0, r.stderr);
    assertStringIncludes(r.stdout, "enim");
    ran.add("cli");
  });

  await t.step("check-config: each provider's module loads and checks its section", async () => {
    await using sb = await EnimSandbox.create();
    const check = async (
      name: string,
      provider: Record<string, unknown>,
      more: Record<string, unknown> = {},
    ) => {
      await Deno.writeTextFile(sb.host(name), JSON.stringify({ provider, ...more }));
      return await runEnim(["agent", "--check-config", "--config", sb.inner(name)], {
        sandbox: sb,
      });
    };
    // With cniConfig: its check (agent/cni_conflist.ts) loads too.
    const mock = await check("mock.jsonc", { name: "mock", mock: {} }, {
      cniConfig: { source: "/etc/enim/10-enim.conflist" },
    });
    assertEquals(mock.code, 0, mock.stderr);
    assertStringIncludes(mock.stdout, "configuration OK: provider mock");
    assertStringIncludes(mock.stdout, "CNI config /etc/enim/10-enim.conflist -> ");
    // The BCE module's own check (not the config schema's) refuses what only it knows.
    const bce = await check("bce.jsonc", {
      name: "bce",
      bce: {
        subnetId: "sbn-default01",
        subnetCidr: "10.0.0.0/16",
        securityGroupIds: ["g-default01"],
        profiles: {
          db: {
            subnetId: "sbn-db000001",
            subnetCidr: "10.0.8.0/24",
            securityGroupIds: ["g-db000001"],
          },
        },
      },
    });
    assertEquals(bce.code, 1, bce.stdout);
    assertStringIncludes(bce.stderr, 'subnetCidr "10.0.8.0/24" of profile "db"');
    ran.add("check-config");
  });

  await t.step(
    "agent: fake devices, the device plugin, NetworkPolicy through a YAML kubeconfig",
    async () => {
      const pki = await makeTestPki();
      await using server = KubeApiServer.start({ pki });
      server.put("namespaces", makeNamespace("default"));
      server.put("pods", makePod({ namespace: "default", name: "web", ip: "10.99.0.9" }));
      server.put("networkpolicies", makeNetworkPolicy("default", "web"));
      // A kubelet folder: the device plugin is on ("auto") and loads its module.
      await using sb = await EnimSandbox.create(null, { kubelet: true });
      // YAML, as kubeadm, kubectl and every managed cluster write it; the CA in a file.
      await Deno.writeTextFile(sb.host("ca.crt"), pki.caCert);
      await Deno.writeTextFile(sb.host("token"), "test-token\n");
      await Deno.writeTextFile(
        sb.host("kubeconfig"),
        stringify({
          apiVersion: "v1",
          kind: "Config",
          clusters: [{
            name: "test",
            cluster: { server: server.url, "certificate-authority": "ca.crt" },
          }],
          users: [{ name: "enim", user: { tokenFile: "token" } }],
          contexts: [{ name: "test", context: { cluster: "test", user: "enim" } }],
          "current-context": "test",
        }),
      );
      const agent = await startAgent(
        sb,
        fakeDevicesConfig(sb.inner(), { enis: 2, maxEnisPerNode: 2 }, {
          kubernetes: { kubeconfig: sb.inner("kubeconfig"), nodeName: "node-1" },
          networkPolicy: { enabled: true },
        }),
      );
      try {
        const client = new SocketAgentClient(agent.socket);
        const until = Date.now() + 20_000;
        let status = await client.status();
        while (
          !(status.policy?.synced && status.devicePlugin !== undefined) && Date.now() < until
        ) {
          await new Promise((r) => setTimeout(r, 50));
          status = await client.status();
        }
        assert(status.policy?.synced, `policy synced:\n${agent.stderr()}`);
        const objects = Object.fromEntries(
          status.policy.caches.map((c) => [c.resource, c.objects]),
        );
        assertEquals(objects, { pods: 1, namespaces: 1, networkpolicies: 1 });
        assert(status.devicePlugin !== undefined, `device plugin status:\n${agent.stderr()}`);
        assert(!agent.stderr().includes("the agent failed"), agent.stderr());
      } finally {
        await agent.stop();
      }
      ran.add("agent");
    },
  );

  await t.step({
    name:
      "kernel: real devices and the veth simulator, one pod's ADD and DEL, an uninstall's dry run",
    ignore: !isRoot(),
    fn: async () => {
      await using node = await SimulatedNode.start();
      const pod = await node.vpc.pod("lazy");
      const res = await node.add(pod);
      // The device layer (netns/mod.ts) moved the simulated ENI (netns/sim.ts) into the pod.
      assertEquals(res.interfaces[0].sandbox, pod.path, JSON.stringify(res));
      assertStringIncludes(JSON.stringify(res.ips), '"10.99.0.', JSON.stringify(res));
      await node.del(pod);
      // enim uninstall (cli/uninstall.ts → agent/uninstall.ts, agent/deps.ts), a dry run.
      await node.stopAgent();
      const u = await node.enim([
        "uninstall",
        "--keep-enis",
        "--dry-run",
        "--config",
        node.sandbox.inner("agent.jsonc"),
        "--cni-bin-dir",
        node.sandbox.inner("none"),
        "--cni-conf-dir",
        node.sandbox.inner("none"),
      ]);
      assertEquals(u.code, 0, u.stdout + u.stderr);
      assertStringIncludes(u.stdout, "nothing changed");
      ran.add("kernel");
    },
  });

  const expected = new Set(Object.values(SITES));
  if (!isRoot()) expected.delete("kernel");
  assertEquals([...ran].sort(), [...expected].sort(), "every scenario ran");
});
