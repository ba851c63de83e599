/**
 * podman as the CNI client: Debian's podman 4.3 with its CNI network backend, runc and a
 * container from a local busybox rootfs (`podman run --rootfs`), against the agent (mock
 * provider) of a simulated node.
 *
 * podman runs inside the node's sandbox (`node.sandbox.wrap`): the enim launcher it execs
 * from its plugin directory then reaches the node's agent at /run/enim/enim.sock, and the
 * network namespace podman creates for the container (/run/netns/netns-…, mounted inside
 * the sandbox's mount namespace) is visible to the agent, which runs in the same sandbox.
 *
 * Everything podman keeps lives in a temp directory: containers.conf and storage.conf
 * (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF; also handed to conmon so the container's
 * `podman container cleanup` reads them too), graph root, run root, tmp dir, runc's state
 * (a wrapper passes `--root`), the CNI config and plugin directories. The container's
 * cgroups go under a parent named for the test, removed at the end.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { SimulatedNode } from "./support/node.ts";
import {
  clientDeps,
  exists,
  pluginDir,
  removeEmptyDirs,
  runInNode,
  type RunOutput,
  tempDir,
} from "./support/clients.ts";
import { aptNeeds } from "../scripts/_deps.ts";

const DEPS = await clientDeps(
  "podman_test",
  aptNeeds("podman", "runc", "conmon", "busybox-static", "containernetworking-plugins"),
);

/** The busybox applets the container uses. */
const APPLETS = ["sh", "ip", "ping", "cat", "sleep", "ls"];

/** podman in its own temp world, run inside a node's sandbox. */
class Podman {
  readonly dir: string;
  readonly cgroupParent: string;
  readonly node: SimulatedNode;

  /** /run/netns before the test: podman names its namespaces netns-<uuid>. */
  readonly #netnsBefore: Set<string>;

  constructor(node: SimulatedNode, dir: string) {
    this.node = node;
    this.dir = dir;
    this.cgroupParent = `/${dir.split("/").pop()}`;
    this.#netnsBefore = new Set(netnsEntries());
  }

  get env(): Record<string, string> {
    return {
      CONTAINERS_CONF: `${this.dir}/containers.conf`,
      CONTAINERS_STORAGE_CONF: `${this.dir}/storage.conf`,
      CONTAINERS_REGISTRIES_CONF: `${this.dir}/registries.conf`,
      HOME: this.dir,
      XDG_RUNTIME_DIR: `${this.dir}/xdg`,
    };
  }

  /** Writes the configs, the runc wrapper, the plugin dir, the network and the rootfs. */
  async setup(network: string, plugin: Record<string, unknown>): Promise<void> {
    const d = this.dir;
    for (const sub of ["root", "runroot", "tmp", "net", "bin", "runc", "xdg", "rootfs/bin"]) {
      await Deno.mkdir(`${d}/${sub}`, { recursive: true });
    }
    // runc keeps its state under the temp dir, not /run/runc.
    await Deno.writeTextFile(
      `${d}/bin/runc`,
      `#!/bin/sh\nexec /usr/sbin/runc --root ${d}/runc "$@"\n`,
      { mode: 0o755 },
    );
    const path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    const env = this.env;
    await Deno.writeTextFile(
      `${d}/containers.conf`,
      [
        "[containers]",
        // podman's default nofile ulimit (1048576) is above these machines' hard limit
        // (20000): runc fails with "error setting rlimit type 7: operation not permitted".
        "default_ulimits = []",
        // conmon in no cgroup; the container's cgroup under a parent this test removes.
        'cgroups = "no-conmon"',
        "[engine]",
        'runtime = "runc"',
        'cgroup_manager = "cgroupfs"',
        'events_logger = "none"',
        `tmp_dir = "${d}/tmp"`,
        `static_dir = "${d}/root/libpod"`,
        `volume_path = "${d}/root/volumes"`,
        `conmon_env_vars = [${
          [`PATH=${path}`, ...Object.entries(env).map(([k, v]) => `${k}=${v}`)]
            .map((s) => JSON.stringify(s)).join(", ")
        }]`,
        "[engine.runtimes]",
        `runc = ["${d}/bin/runc"]`,
        "[network]",
        'network_backend = "cni"',
        `cni_plugin_dirs = ["${d}/plugins"]`,
        `network_config_dir = "${d}/net"`,
        "",
      ].join("\n"),
    );
    await Deno.writeTextFile(
      `${d}/storage.conf`,
      `[storage]\ndriver = "vfs"\ngraphroot = "${d}/root"\nrunroot = "${d}/runroot"\n`,
    );
    await Deno.writeTextFile(`${d}/registries.conf`, "");
    await pluginDir(`${d}/plugins`, ["loopback"]);
    await Deno.writeTextFile(
      `${d}/net/${network}.conflist`,
      JSON.stringify({ cniVersion: "1.0.0", name: network, plugins: [plugin] }, null, 2),
    );
    await Deno.copyFile("/bin/busybox", `${d}/rootfs/bin/busybox`);
    await Deno.chmod(`${d}/rootfs/bin/busybox`, 0o755);
    for (const a of APPLETS) await Deno.symlink("busybox", `${d}/rootfs/bin/${a}`);
  }

  /** Runs `podman <args>` inside the node's sandbox. */
  run(args: string[]): Promise<RunOutput> {
    return runInNode(this.node, [
      "/usr/bin/podman",
      "--root",
      `${this.dir}/root`,
      "--runroot",
      `${this.dir}/runroot`,
      ...args,
    ], this.env);
  }

  /** Like {@linkcode run}, failing the test on a non-zero exit. */
  async ok(args: string[]): Promise<string> {
    const out = await this.run(args);
    assertEquals(
      out.code,
      0,
      `podman ${args.join(" ")} exited ${out.code}:\n${out.stderr}\n${out.stdout}\n` +
        `agent log:\n${(await this.node.agentLog()).slice(-3000)}`,
    );
    return out.stdout;
  }

  /** Removes every container, podman's state, the cgroup parent and the temp dir. */
  async close(): Promise<void> {
    await this.run(["rm", "--all", "--force", "--time", "0"]).catch(() => {});
    await removeEmptyDirs(
      [...Deno.readDirSync("/sys/fs/cgroup")].map((c) =>
        `/sys/fs/cgroup/${c.name}${this.cgroupParent}`
      ),
    );
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
    // podman creates each container namespace as a file in /run/netns with a mount on it;
    // it mounts inside the node's sandbox, so from here the file is a plain empty file
    // (same device as the directory). Only if podman died before removing it is one left.
    const dirDev = Deno.statSync("/run/netns").dev;
    for (const name of netnsEntries()) {
      if (this.#netnsBefore.has(name) || !name.startsWith("netns-")) continue;
      const path = `/run/netns/${name}`;
      if (Deno.statSync(path).dev === dirDev) await Deno.remove(path).catch(() => {});
    }
  }
}

function netnsEntries(): string[] {
  try {
    return [...Deno.readDirSync("/run/netns")].map((e) => e.name);
  } catch {
    return [];
  }
}

Deno.test({
  name: "podman (CNI backend): run gets the ENI, the container pings its gateway, rm frees it",
  ignore: DEPS.skip !== null,
  async fn() {
    // libcni inside podman caches results under /var/lib/cni; remove what it creates.
    const cniCacheExisted = exists("/var/lib/cni");
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const podman = new Podman(node, await tempDir("enim-podman"));
    try {
      const network = "enimnet";
      await podman.setup(network, { type: "enim", logFile: node.sandbox.inner("cni.log") });
      const nets = await podman.ok(["network", "ls", "--format", "{{.Name}}"]);
      assertStringIncludes(nets, network);

      const name = "enim-c1";
      await podman.ok([
        "run",
        "--detach",
        "--name",
        name,
        "--cgroup-parent",
        podman.cgroupParent,
        "--network",
        network,
        "--rootfs",
        `${podman.dir}/rootfs`,
        "/bin/sleep",
        "3600",
      ]);

      // The agent gave the container's owner one ENI (podman passes only K8S_POD_NAME).
      const status = await node.client.status();
      assertEquals(status.pool.owned, 1);
      const eni = status.enis.find((e) => e.owner !== null)!;
      assertEquals(eni.owner?.pod, `default/${name}`);
      assertEquals(eni.owner?.ifName, "eth0");
      const v4 = eni.ipv4!;

      // Inside the container: the ENI's MAC and address on eth0, the default route, a ping.
      const link = await podman.ok(["exec", name, "/bin/ip", "link", "show", "eth0"]);
      assertStringIncludes(link, `link/ether ${eni.mac}`);
      const addr = await podman.ok(["exec", name, "/bin/ip", "-o", "-4", "addr", "show", "eth0"]);
      assertStringIncludes(addr, `inet ${v4.address}/${v4.prefixLength}`);
      const route = await podman.ok(["exec", name, "/bin/ip", "-4", "route", "show", "default"]);
      assertStringIncludes(route, `via ${v4.gateway} dev eth0`);
      const ping = await podman.ok(["exec", name, "/bin/ping", "-c", "1", "-W", "3", v4.gateway]);
      assertMatch(ping, /1 packets received/);

      // podman understood the CNI result.
      const inspect = JSON.parse(await podman.ok(["inspect", name]))[0];
      const settings = inspect.NetworkSettings.Networks[network];
      assertEquals(settings.IPAddress, v4.address);
      assertEquals(settings.MacAddress, eni.mac);
      assertEquals(settings.Gateway, v4.gateway);

      // rm stops the container: podman's teardown calls DEL, the ENI is free again and its
      // device is back on the node.
      await podman.ok(["rm", "--force", "--time", "0", name]);
      const after = await node.client.status();
      assertEquals(after.pool.owned, 0);
      assertEquals(await node.client.attachments(), []);
      const back = await node.vpc.exec(node.vpc.node, ["/usr/sbin/ip", "-o", "link", "show"]);
      assertStringIncludes(back.stdout, eni.mac);
      const cniLog = await Deno.readTextFile(node.sandbox.host("cni.log"));
      assertMatch(cniLog, /"verb":"ADD"/);
      assertMatch(cniLog, /"verb":"DEL"/);
      assert((await podman.ok(["ps", "--all", "--quiet"])).trim() === "", "no container left");
      const sandbox = inspect.NetworkSettings.SandboxKey as string;
      assertMatch(sandbox, /^\/run\/netns\/netns-/);
      assert(!exists(sandbox), `podman removed the container's namespace ${sandbox}`);
    } finally {
      await podman.close();
      if (!cniCacheExisted) await removeEmptyDirs(["/var/lib/cni/results", "/var/lib/cni"]);
    }
  },
});
