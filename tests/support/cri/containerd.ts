/**
 * containerd (Debian's 1.6, its CRI plugin and runc) in a temp directory, inside a simulated
 * node, driven over CRI as kubelet drives it.
 *
 * containerd runs inside the node's sandbox (`node.sandbox.wrap`): the plugins it execs
 * reach the node's agent at /run/enim/enim.sock, and the network namespaces its CRI plugin
 * creates (/var/run/netns/cni-…, mounted inside the sandbox's mount namespace) are visible
 * to the agent, which runs in the same sandbox.
 *
 * Everything containerd keeps lives in one temp directory: config, root, state, temp, the
 * gRPC and ttrpc sockets, runc's state (`Root`), the pause image. Exceptions, all removed by
 * {@linkcode Containerd.close} when the test created them: the shims' sockets under
 * /run/containerd/s (containerd 1.6 puts them there whatever its state directory), libcni's
 * result cache under /var/lib/cni, the sandboxes' namespaces in /run/netns, and the cgroups
 * under a parent named after the temp directory.
 *
 * Settings these machines need (measured): `restrict_oom_score_adj = true` (runc otherwise
 * fails with "can't get final child's PID from pipe"), runc rather than crun, and container
 * ulimits at most nofile 20000 (containerd's default spec sets 1024).
 *
 * @module
 */
import { existsSync as exists } from "../../../lib/fs.ts";
import type { SimulatedNode } from "../node.ts";
import { removeEmptyDirs, runInNode, tempDir } from "../clients.ts";
import { buildPauseImage } from "./image.ts";
import { CriClient, kubeletSandboxConfig, type PodSandboxConfig, type PodSpec } from "./client.ts";

const CONTAINERD = "/usr/bin/containerd";
const CTR = "/usr/bin/ctr";
const RUNC = "/usr/sbin/runc";
const PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/** The namespace containerd's CRI plugin works in. */
const K8S_NS = "k8s.io";
/** The directory containerd 1.6's shims put their sockets in. */
const SHIM_SOCKETS = "/run/containerd/s";
/** libcni's default cache (containerd 1.6 sets no other). */
const CNI_CACHE = "/var/lib/cni";

/** Options for {@linkcode Containerd.start}. */
export interface ContainerdOptions {
  /** The CNI plugin directory (CRI `bin_dir`). */
  binDir: string;
  /** The CNI config directory of the default runtime handler (CRI `conf_dir`). */
  confDir: string;
  /** More runtime handlers (runc too), each with its own CNI config directory. */
  handlers?: Record<string, string>;
  /** Environment for containerd, and so for the shims and CNI plugins it starts. */
  env?: Record<string, string>;
  /** A label for progress lines and error messages. */
  label?: string;
}

function entries(dir: string): string[] {
  try {
    return [...Deno.readDirSync(dir)].map((e) => e.name);
  } catch {
    return [];
  }
}

/** The cgroup v1 controller directories and the v2 root of this machine. */
function cgroupRoots(): string[] {
  const base = "/sys/fs/cgroup";
  if (exists(`${base}/cgroup.controllers`)) return [base];
  return [...Deno.readDirSync(base)].filter((e) => e.isDirectory).map((e) => `${base}/${e.name}`);
}

/** Every directory under `dir`, deepest first (then `dir` itself). */
function dirsDeepestFirst(dir: string): string[] {
  const out: string[] = [];
  for (const e of entries(dir)) {
    const p = `${dir}/${e}`;
    try {
      if (Deno.lstatSync(p).isDirectory) out.push(...dirsDeepestFirst(p));
    } catch { /* gone meanwhile */ }
  }
  out.push(dir);
  return out;
}

/** containerd with its CRI plugin, in a temp directory, inside a simulated node. */
export class Containerd {
  readonly node: SimulatedNode;
  readonly dir: string;
  /** containerd's gRPC socket (CRI and ctr). */
  readonly socket: string;
  /** The cgroup parent every sandbox goes under (cgroupfs style). */
  readonly cgroupParent: string;
  /** The locally built pause image. */
  readonly pauseImage = "enim.test/pause:1";
  /** containerd's log (its stderr). */
  readonly logPath: string;
  readonly label: string;
  #cri: CriClient | null = null;
  #pid: number | null = null;
  #status: Promise<Deno.CommandStatus> | null = null;
  readonly #before: { shimSockets: Set<string>; netns: Set<string>; runContainerd: boolean };
  readonly #cniCacheExisted: boolean;
  #closed = false;

  private constructor(node: SimulatedNode, dir: string, label: string) {
    this.node = node;
    this.dir = dir;
    this.label = label;
    this.socket = `${dir}/containerd.sock`;
    this.logPath = `${dir}/containerd.log`;
    this.cgroupParent = `/${dir.split("/").pop()}`;
    this.#before = {
      shimSockets: new Set(entries(SHIM_SOCKETS)),
      netns: new Set(entries("/run/netns")),
      runContainerd: exists("/run/containerd"),
    };
    this.#cniCacheExisted = exists(CNI_CACHE);
  }

  /** The CRI client (after {@linkcode start}). */
  get cri(): CriClient {
    if (!this.#cri) throw new Error("containerd is not running");
    return this.#cri;
  }

  /** containerd's PID, or null once stopped. */
  get pid(): number | null {
    return this.#pid;
  }

  /**
   * Writes the config, builds the pause image, starts containerd in the node's sandbox,
   * waits until its CRI reports the network ready and imports the pause image.
   */
  static async start(node: SimulatedNode, opts: ContainerdOptions): Promise<Containerd> {
    const cd = new Containerd(node, await tempDir("enim-cri"), opts.label ?? "containerd");
    try {
      await cd.#start(opts);
    } catch (err) {
      const log = await cd.log();
      await cd.close().catch(() => {});
      throw new Error(
        `${err instanceof Error ? err.message : String(err)}\ncontainerd's log:\n${
          log.slice(-4000)
        }`,
        { cause: err },
      );
    }
    return cd;
  }

  async #start(opts: ContainerdOptions): Promise<void> {
    const d = this.dir;
    for (const sub of ["root", "state", "tmp", "opt", "runc", "image", "pods"]) {
      await Deno.mkdir(`${d}/${sub}`, { recursive: true });
    }
    const image = await buildPauseImage(`${d}/image`, this.pauseImage);
    await Deno.writeTextFile(`${d}/config.toml`, this.#config(opts));

    const env = { PATH, ...opts.env };
    const [cmd, ...args] = this.node.sandbox.wrap([
      "/bin/sh",
      "-c",
      `exec ${CONTAINERD} --config ${d}/config.toml >>${this.logPath} 2>&1`,
    ]);
    // nsenter and sh exec, so the child's PID is containerd's.
    const child = new Deno.Command(cmd, {
      args,
      clearEnv: true,
      env,
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    this.#pid = child.pid;
    this.#status = child.status;

    // Wait for the socket, then for the CRI plugin to have loaded the CNI config.
    const exited = () => this.#status === null;
    child.status.then(() => {
      this.#status = null;
    });
    const deadline = Date.now() + 60_000;
    while (!exists(this.socket)) {
      if (exited()) throw new Error(`containerd exited before listening on ${this.socket}`);
      if (Date.now() > deadline) throw new Error(`containerd does not listen on ${this.socket}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    this.#cri = await CriClient.connect(this.socket);
    let last = "";
    for (;;) {
      const status = await this.#cri.status().catch((err) => {
        last = String(err);
        return null;
      });
      const net = status?.status.conditions.find((c) => c.type === "NetworkReady");
      if (net?.status) break;
      if (net) last = `NetworkReady false: ${net.reason} ${net.message}`;
      if (exited()) throw new Error("containerd exited during start-up");
      if (Date.now() > deadline) throw new Error(`containerd's CRI is not ready: ${last}`);
      await new Promise((r) => setTimeout(r, 100));
    }

    const imported = await runInNode(this.node, [
      CTR,
      "--address",
      this.socket,
      "--namespace",
      K8S_NS,
      "images",
      "import",
      image.tar,
    ]);
    if (imported.code !== 0) {
      throw new Error(`ctr images import failed: ${imported.stderr}${imported.stdout}`);
    }
    // The CRI plugin learns of the image from containerd's events: wait until it has it.
    while ((await this.#cri.imageStatus(this.pauseImage)) === null) {
      if (Date.now() > deadline) throw new Error(`The CRI does not see ${this.pauseImage}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  #config(opts: ContainerdOptions): string {
    const d = this.dir;
    const cri = 'plugins."io.containerd.grpc.v1.cri"';
    const runtime = (name: string, cniConfDir?: string) => [
      `[${cri}.containerd.runtimes.${name}]`,
      '  runtime_type = "io.containerd.runc.v2"',
      ...(cniConfDir ? [`  cni_conf_dir = "${cniConfDir}"`, "  cni_max_conf_num = 1"] : []),
      `[${cri}.containerd.runtimes.${name}.options]`,
      `  BinaryName = "${RUNC}"`,
      `  Root = "${d}/runc"`,
      "  SystemdCgroup = false",
    ];
    return [
      "# containerd for enim's CRI test (tests/support/cri/containerd.ts); everything in this directory.",
      "version = 2",
      `root = "${d}/root"`,
      `state = "${d}/state"`,
      `temp = "${d}/tmp"`,
      "disabled_plugins = [",
      '  "io.containerd.snapshotter.v1.aufs",',
      '  "io.containerd.snapshotter.v1.btrfs",',
      '  "io.containerd.snapshotter.v1.devmapper",',
      '  "io.containerd.snapshotter.v1.zfs",',
      "]",
      "[grpc]",
      `  address = "${this.socket}"`,
      "[ttrpc]",
      `  address = "${d}/containerd.sock.ttrpc"`,
      "[debug]",
      '  level = "info"',
      '[plugins."io.containerd.internal.v1.opt"]',
      `  path = "${d}/opt"`,
      `[${cri}]`,
      `  sandbox_image = "${this.pauseImage}"`,
      // runc on these machines fails to start a container otherwise.
      "  restrict_oom_score_adj = true",
      "  disable_apparmor = true",
      '  stream_server_address = "127.0.0.1"',
      '  stream_server_port = "0"',
      `[${cri}.cni]`,
      `  bin_dir = "${opts.binDir}"`,
      `  conf_dir = "${opts.confDir}"`,
      "  max_conf_num = 1",
      `[${cri}.containerd]`,
      '  snapshotter = "overlayfs"',
      '  default_runtime_name = "runc"',
      ...runtime("runc"),
      ...Object.entries(opts.handlers ?? {}).flatMap(([name, dir]) => runtime(name, dir)),
      "",
    ].join("\n");
  }

  /** A kubelet-style sandbox config for `pod`, with this containerd's log and cgroup dirs. */
  sandboxConfig(pod: PodSpec): PodSandboxConfig {
    return kubeletSandboxConfig(pod, {
      logRoot: `${this.dir}/pods`,
      cgroupParent: `${this.cgroupParent}/pod${pod.uid}`,
    });
  }

  /** containerd's log so far. */
  async log(): Promise<string> {
    return await Deno.readTextFile(this.logPath).catch(() => "");
  }

  /**
   * The sandbox namespaces (containerd names them cni-<uuid>) that appeared in /run/netns
   * since this containerd was made. Other work on the machine adds namespaces of its own
   * there, under other names.
   */
  newNetns(): string[] {
    return entries("/run/netns").filter((n) => n.startsWith("cni-") && !this.#before.netns.has(n));
  }

  /**
   * Removes every sandbox (Stop + Remove through CRI), stops containerd (SIGTERM, then
   * SIGKILL), kills whatever is left in its cgroups (by PID), and removes its cgroups, the
   * shim sockets, namespaces and libcni cache entries it left, and the temp directory.
   * Idempotent.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const errors: unknown[] = [];
    const step = async (f: () => Promise<unknown>) => {
      try {
        await f();
      } catch (err) {
        errors.push(err);
      }
    };
    if (this.#cri && this.#status !== null) {
      const cri = this.#cri;
      await step(async () => {
        for (const sb of await cri.listPodSandbox()) {
          await cri.stopPodSandbox(sb.id).catch(() => {});
          await cri.removePodSandbox(sb.id);
        }
      });
    }
    this.#cri?.close();
    this.#cri = null;
    await step(() => this.#stop());
    await step(() => this.#killCgroups());
    // Shim sockets, namespaces and cache entries a clean run removes itself.
    await step(async () => {
      for (const s of entries(SHIM_SOCKETS)) {
        if (!this.#before.shimSockets.has(s)) await Deno.remove(`${SHIM_SOCKETS}/${s}`);
      }
      if (!this.#before.runContainerd) await removeEmptyDirs([SHIM_SOCKETS, "/run/containerd"]);
    });
    await step(async () => {
      // containerd mounts each sandbox namespace inside the node's sandbox; from here the
      // file is a plain empty file on the directory's device. Only a crashed run leaves one.
      const dirDev = Deno.statSync("/run/netns").dev;
      for (const name of this.newNetns()) {
        const path = `/run/netns/${name}`;
        if (Deno.statSync(path).dev === dirDev) await Deno.remove(path);
      }
    });
    if (!this.#cniCacheExisted) {
      await step(() => removeEmptyDirs([`${CNI_CACHE}/results`, CNI_CACHE]));
    }
    await step(() => Deno.remove(this.dir, { recursive: true }));
    if (errors.length > 0) {
      throw new AggregateError(errors, `Cannot tear ${this.label} in ${this.dir} down`);
    }
  }

  /** SIGTERM to containerd (by PID), SIGKILL after 10 s; waits for it to exit. */
  async #stop(): Promise<void> {
    const pid = this.#pid, status = this.#status;
    this.#pid = null;
    if (pid === null || status === null) return;
    Deno.kill(pid, "SIGTERM");
    const timer = setTimeout(() => {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch { /* exited meanwhile */ }
    }, 10_000);
    try {
      await status;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Kills (SIGKILL, by PID) every process still in this containerd's cgroup parent (shims'
   * containers after a crash) and the shims whose socket names this containerd, then
   * removes the cgroup directories.
   */
  async #killCgroups(): Promise<void> {
    const pids = new Set<number>();
    const roots = cgroupRoots().map((r) => `${r}${this.cgroupParent}`).filter(exists);
    for (const root of roots) {
      for (const dir of dirsDeepestFirst(root)) {
        const procs = await Deno.readTextFile(`${dir}/cgroup.procs`).catch(() => "");
        for (const p of procs.split("\n").filter(Boolean)) pids.add(Number(p));
      }
    }
    for (const p of entries("/proc").filter((e) => /^\d+$/.test(e))) {
      const cmdline = await Deno.readTextFile(`/proc/${p}/cmdline`).catch(() => "");
      if (cmdline.includes("containerd-shim") && cmdline.includes(this.socket)) {
        pids.add(Number(p));
      }
    }
    for (const pid of pids) {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch { /* exited meanwhile */ }
    }
    for (const root of roots) {
      for (let i = 0; i < 50; i++) {
        const left = dirsDeepestFirst(root).filter((dir) => {
          try {
            Deno.removeSync(dir);
            return false;
          } catch {
            return exists(dir);
          }
        });
        if (left.length === 0) break;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }
}
