/**
 * A real Kubernetes node for the tests: kubelet, containerd 2.x (its runc shim) and runc,
 * built by {@linkcode ensureNodeBinaries}, in a simulated node's network namespace and a
 * private mount namespace of their own, registered with a real control plane
 * (tests/support/k8s/cluster.ts).
 *
 * What they would change on the machine stays inside (docs/testing.md, "The real node"):
 *
 * | knob | kept in by |
 * | --- | --- |
 * | `/run` (containerd's state and sockets, the shims', `/run/netns` with the pods' namespaces) | a folder of the test bind-mounted over `/run` in the mount namespace |
 * | `/var/lib` (`/var/lib/kubelet`, containerd's root, libcni's cache) | a folder of the test over `/var/lib` |
 * | `/var/log` (`/var/log/pods`, `/var/log/containers`) | a folder of the test over `/var/log` |
 * | `/opt` (`/opt/cni/bin`, containerd's `opt` plugin) | a folder of the test over `/opt` |
 * | `/etc/cni` (`/etc/cni/net.d`) | a folder of the test over `/etc/cni` |
 * | the kernel tunables kubelet sets at start (`vm.overcommit_memory`, `vm.panic_on_oom`, `kernel.panic`, `kernel.panic_on_oops`, `kernel.keys.root_maxkeys`, `kernel.keys.root_maxbytes`) | stand-in files (holding the machine's values) bind-mounted over their `/proc/sys` paths; kubelet has no option that leaves them alone (`protectKernelDefaults` only turns the write into a refusal to start) |
 * | cgroups | `cgroupRoot` `/enim-rnode-<id>` (created in every hierarchy, removed at the end); cgroupfs driver; kubelet's own and the runtime's cgroups not set (nothing moved) |
 * | kubelet's OOM score | `oomScoreAdj: 0` (its own process only) |
 * | network | the node's network namespace: addresses, routes, the pods' host links, iptables |
 * | swap, image GC, eviction | `failSwapOn: false`, image GC at 100 %, no eviction thresholds |
 * | `/etc/resolv.conf` | `resolvConf` names a stand-in in kubelet's folder |
 * | volume plugins (`/usr/libexec/kubernetes`) | `volumePluginDir` in kubelet's folder |
 *
 * The API server (127.0.0.1 of the test's namespace) is reached through a
 * {@linkcode KubeBridge} relay at 127.0.0.1 of the node's namespace. Images are never
 * pulled: {@linkcode RealNode.importImage} imports OCI archives built here.
 *
 * @module
 */
import { z } from "zod";
import { stringify as toYaml } from "yaml";
import { existsSync as exists } from "../../../lib/fs.ts";
import { ensureNodeBinaries, type EnsureOptions, type NodeBinaries } from "./build.ts";
import type { KubeCluster } from "./cluster.ts";
import { ComponentProcess } from "./process.ts";
import { KubeBridge } from "../kube_bridge.ts";
import { buildBusyboxImage, buildPauseImage } from "../cri/image.ts";
import { containerdSandboxInfo, CriClient } from "../cri/client.ts";
import { NodeSchema } from "./kubelet.ts";
import { RealKubeProxy } from "./kube_proxy.ts";
import { StoredSchema } from "./rest.ts";
import { FIELD_MANAGER } from "./manifests.ts";

const NSENTER = "/usr/bin/nsenter";
const UNSHARE = "/usr/bin/unshare";
const MOUNT = "/usr/bin/mount";
const UMOUNT = "/usr/bin/umount";
const PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** The kernel tunables kubelet writes at start (pkg/kubelet/cm setupKernelTunables). */
export const KUBELET_SYSCTLS = [
  "vm/overcommit_memory",
  "vm/panic_on_oom",
  "kernel/panic",
  "kernel/panic_on_oops",
  "kernel/keys/root_maxkeys",
  "kernel/keys/root_maxbytes",
] as const;

/** The folders of the machine the node gets its own of (bind mounts in its mount namespace). */
const PRIVATE_DIRS = { run: "/run", varlib: "/var/lib", varlog: "/var/log", opt: "/opt" };

/** The pause image containerd pins (the sandbox image), built here from busybox-static. */
export const PAUSE_IMAGE = "enim.test/pause:1";
/** The workload image (busybox-static with every applet), built here. */
export const BUSYBOX_IMAGE = "enim.test/busybox:1";

/** The node's own resolver by default (TEST-NET-1: nothing answers there). */
export const NODE_DNS = "192.0.2.53";

/** Options of {@linkcode RealNode.start}. */
export interface RealNodeOptions {
  /** The node's name in the cluster. */
  name: string;
  /** The node's network namespace (a name under /run/netns). */
  netns: string;
  /** Other namespaces (names under /run/netns) the node's processes must find by name. */
  shareNetns?: string[];
  /** The node's InternalIP (kubelet's `--node-ip`). */
  nodeIp: string;
  /** The runc containerd runs (default: the built one; Debian's is /usr/sbin/runc). */
  runc?: string;
  /** The built node components (default: {@linkcode ensureNodeBinaries}). */
  binaries?: NodeBinaries;
  /** A CNI conflist to install before containerd starts (name → text). */
  cniConfigs?: Record<string, string>;
  /** Executables copied into the node's /opt/cni/bin before containerd starts. */
  cniPlugins?: string[];
  /** kubelet's `clusterDNS` (default 10.96.0.10). */
  clusterDns?: string;
  /**
   * The node's own resolver: the `nameserver` of the node's resolv.conf, which kubelet gives
   * pods with `dnsPolicy: Default` (default 192.0.2.53, a documentation address).
   */
  nodeDns?: string;
  /** More KubeletConfiguration fields. */
  kubeletConfig?: Record<string, unknown>;
  progress?: (line: string) => void;
  /** How long kubelet may take to register the Node (default 120 s). */
  readyTimeoutMs?: number;
}

const ProcNsSchema = z.string().regex(/^mnt:\[\d+\]$/);

/** The cgroup v1 controller directories, or the v2 root, of this machine. */
function cgroupRoots(): string[] {
  const base = "/sys/fs/cgroup";
  if (exists(`${base}/cgroup.controllers`)) return [base];
  return [...Deno.readDirSync(base)]
    .filter((e) => e.isDirectory)
    .map((e) => `${base}/${e.name}`);
}

function entries(dir: string): string[] {
  try {
    return [...Deno.readDirSync(dir)].map((e) => e.name);
  } catch {
    return [];
  }
}

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

async function run(cmd: string, args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, {
    args,
    clearEnv: true,
    env: { PATH },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")} failed: ${dec.decode(out.stderr).trim()}`);
  }
  return dec.decode(out.stdout);
}

/** A running real node (see the module doc). */
export class RealNode implements AsyncDisposable {
  readonly name: string;
  readonly bins: NodeBinaries;
  /** The node's folder (seen from the test process). */
  readonly base: string;
  readonly netns: string;
  readonly nodeIp: string;
  /** The cgroup parent of everything kubelet starts (cgroupfs style, `/enim-rnode-<id>`). */
  readonly cgroupRoot: string;
  readonly #cluster: KubeCluster;
  readonly #say: (line: string) => void;
  #bridge: KubeBridge | null = null;
  #apiPort = 0;
  #containerd: ComponentProcess | null = null;
  #kubelet: ComponentProcess | null = null;
  #kubeletArgs: string[] = [];
  #cri: CriClient | null = null;
  #proxy: RealKubeProxy | null = null;
  #mntIno: string | null = null;
  #closed = false;

  private constructor(cluster: KubeCluster, bins: NodeBinaries, base: string, o: RealNodeOptions) {
    this.#cluster = cluster;
    this.bins = bins;
    this.base = base;
    this.name = o.name;
    this.netns = o.netns;
    this.nodeIp = o.nodeIp;
    this.cgroupRoot = `/${base.split("/").pop()}`;
    this.#say = o.progress ?? (() => {});
  }

  /**
   * The node's view of `path` (`/opt/cni/bin`, `/etc/cni/net.d`, `/var/lib/kubelet`, …),
   * as the test process sees it.
   */
  host(path: string): string {
    if (path.startsWith("/etc/cni")) return `${this.base}/etccni${path.slice("/etc/cni".length)}`;
    for (const [dir, at] of Object.entries(PRIVATE_DIRS)) {
      if (path === at || path.startsWith(`${at}/`)) {
        return `${this.base}/${dir}${path.slice(at.length)}`;
      }
    }
    throw new Error(`"${path}" is the machine's, not the node's own`);
  }

  /** The argv that runs `argv` in the node's network and mount namespaces. */
  wrap(argv: string[]): string[] {
    return [NSENTER, `--mount=${this.base}/mnt`, `--net=/run/netns/${this.netns}`, "--", ...argv];
  }

  /** The CRI client of the node's containerd (as kubelet talks to it). */
  get cri(): CriClient {
    if (!this.#cri) throw new Error("containerd is not running");
    return this.#cri;
  }

  /** The file the stand-in of kernel tunable `key` (`vm/overcommit_memory`) is. */
  sysctlStandIn(key: (typeof KUBELET_SYSCTLS)[number]): string {
    return `${this.base}/sysctl/${key.replaceAll("/", ".")}`;
  }

  /** Builds (or finds) the components, makes the namespaces, starts containerd and kubelet. */
  static async start(cluster: KubeCluster, o: RealNodeOptions): Promise<RealNode> {
    const bins = o.binaries ?? await ensureNodeBinaries({ progress: o.progress });
    const base = `/tmp/enim-rnode-${crypto.randomUUID().slice(0, 8)}`;
    await Deno.mkdir(base, { mode: 0o755 });
    const node = new RealNode(cluster, bins, base, o);
    try {
      await node.#setup(o);
      await node.startContainerd(o.runc);
      await node.#importImages();
      await node.startKubelet(o);
      await node.waitRegistered(o.readyTimeoutMs ?? 120_000);
    } catch (err) {
      const logs = await node.logs().catch(() => "");
      await node.close().catch(() => {});
      throw new Error(
        `${err instanceof Error ? err.message : String(err)}\n${logs.slice(-6000)}`,
        { cause: err },
      );
    }
    return node;
  }

  /** The folders, the mount namespace with its bind mounts, the cgroup root, the relay. */
  async #setup(o: RealNodeOptions): Promise<void> {
    const b = this.base;
    for (const d of [...Object.keys(PRIVATE_DIRS), "etccni", "sysctl", "logs", "images"]) {
      await Deno.mkdir(`${b}/${d}`, { recursive: true });
    }
    for (
      const d of [
        "run/netns",
        "opt/cni/bin",
        "etccni/net.d",
        "varlib/kubelet",
        "varlib/containerd",
        "varlog/pods",
      ]
    ) await Deno.mkdir(`${b}/${d}`, { recursive: true });
    // Stand-ins holding the machine's values: kubelet writes its own into them.
    for (const key of KUBELET_SYSCTLS) {
      await Deno.writeTextFile(
        this.sysctlStandIn(key),
        await Deno.readTextFile(`/proc/sys/${key}`),
      );
    }
    for (const p of o.cniPlugins ?? []) {
      const dst = `${b}/opt/cni/bin/${p.split("/").pop()}`;
      await Deno.copyFile(p, dst);
      await Deno.chmod(dst, 0o755);
    }
    for (const [name, text] of Object.entries(o.cniConfigs ?? {})) {
      await Deno.writeTextFile(`${b}/etccni/net.d/${name}`, text);
    }
    const shared = [this.netns, ...(o.shareNetns ?? [])];
    for (const ns of shared) await Deno.writeTextFile(`${b}/run/netns/${ns}`, "");

    // The file the mount namespace is pinned to must not be on a shared mount.
    await run(MOUNT, ["--bind", b, b]);
    await run(MOUNT, ["--make-private", b]);
    await Deno.writeTextFile(`${b}/mnt`, "");
    const script = [
      "set -e",
      ...KUBELET_SYSCTLS.map((k) => `mount --bind '${this.sysctlStandIn(k)}' /proc/sys/${k}`),
      // The namespaces the node's processes name (the device simulator's VPC), then /run/netns
      // as a shared mount (the agent's Bidirectional volume asks for one).
      // The node's /run/netns a mount of its own (first: a bind of the folder would hide the
      // namespaces bound into it), then the namespaces it must name.
      `mount --bind '${b}/run/netns' '${b}/run/netns'`,
      ...shared.map((ns) => `mount --bind /run/netns/${ns} '${b}/run/netns/${ns}'`),
      // The machine's /run/netns mount (ip netns makes one) would stay in the mount table
      // under the node's /run, where containerd finds it and refuses it for the agent's
      // Bidirectional volume ("not a shared mount"): gone, in this namespace only (a slave).
      "if mountpoint -q /run/netns; then umount -l /run/netns; fi",
      `mount --rbind '${b}/run' /run`,
      "mount --make-rshared /run",
      `mount --bind '${b}/varlib' /var/lib`,
      `mount --bind '${b}/varlog' /var/log`,
      `mount --bind '${b}/opt' /opt`,
      `mount --bind '${b}/etccni' /etc/cni`,
    ].join("\n");
    await run(UNSHARE, [`--mount=${b}/mnt`, "--propagation", "slave", "/bin/sh", "-c", script]);
    this.#mntIno = `mnt:[${Deno.statSync(`${b}/mnt`).ino}]`;

    for (const root of cgroupRoots()) {
      const dir = `${root}${this.cgroupRoot}`;
      await Deno.mkdir(dir);
      // A new cpuset cgroup has no CPUs and no memory nodes: take the parent's.
      if (root.endsWith("/cpuset")) {
        for (const f of ["cpuset.cpus", "cpuset.mems"]) {
          await Deno.writeTextFile(`${dir}/${f}`, await Deno.readTextFile(`${root}/${f}`));
        }
      }
    }

    this.#bridge = KubeBridge.start({ url: this.#cluster.url });
    this.#apiPort = await this.#bridge.into(this.netns);
  }

  /** Starts containerd in the node (its config in /etc/containerd of the node's folder). */
  async startContainerd(runc = this.bins.paths.runc): Promise<void> {
    const b = this.base;
    const cri = "plugins.'io.containerd.cri.v1.runtime'";
    const config = [
      "# containerd 2.x of a real test node (tests/support/k8s/real_node.ts).",
      "version = 3",
      'root = "/var/lib/containerd"',
      'state = "/run/containerd"',
      "[grpc]",
      '  address = "/run/containerd/containerd.sock"',
      "[debug]",
      '  level = "info"',
      "[plugins.'io.containerd.cri.v1.images']",
      "  snapshotter = 'overlayfs'",
      "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
      `  sandbox = '${PAUSE_IMAGE}'`,
      `[${cri}]`,
      // runc on these machines fails to start a container otherwise.
      "  restrict_oom_score_adj = true",
      "  disable_apparmor = true",
      `[${cri}.containerd]`,
      "  default_runtime_name = 'runc'",
      `[${cri}.containerd.runtimes.runc]`,
      "  runtime_type = 'io.containerd.runc.v2'",
      `[${cri}.containerd.runtimes.runc.options]`,
      `  BinaryName = '${runc}'`,
      "  SystemdCgroup = false",
      `[${cri}.cni]`,
      "  bin_dirs = ['/opt/cni/bin']",
      "  conf_dir = '/etc/cni/net.d'",
      "  max_conf_num = 1",
      "[plugins.'io.containerd.grpc.v1.cri']",
      "  stream_server_address = '127.0.0.1'",
      "  stream_server_port = '0'",
      "",
    ].join("\n");
    await Deno.writeTextFile(`${b}/containerd.toml`, config);
    this.#containerd = await ComponentProcess.start(
      "containerd",
      this.bins.paths.containerd,
      ["--config", `${b}/containerd.toml`],
      `${b}/logs/containerd.log`,
      { PATH: `${this.bins.dir}/bin:${PATH}` },
      this.wrap([]),
    );
    this.#say(`node ${this.name}: containerd started (pid ${this.#containerd.pid})`);
    const socket = this.host("/run/containerd/containerd.sock");
    const deadline = Date.now() + 60_000;
    while (!exists(socket)) {
      if (this.#containerd.exited) throw new Error("containerd exited during start-up");
      if (Date.now() > deadline) throw new Error(`containerd does not listen on ${socket}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    this.#cri?.close();
    this.#cri = await CriClient.connect(socket);
  }

  async #importImages(): Promise<void> {
    await Deno.mkdir(`${this.base}/images/pause`);
    await Deno.mkdir(`${this.base}/images/busybox`);
    const pause = await buildPauseImage(`${this.base}/images/pause`, PAUSE_IMAGE);
    const busybox = await buildBusyboxImage(`${this.base}/images/busybox`, BUSYBOX_IMAGE);
    await this.importImage(pause.tar, PAUSE_IMAGE);
    await this.importImage(busybox.tar, BUSYBOX_IMAGE);
  }

  /** Imports the OCI archive `tar` into containerd's `k8s.io` namespace; waits for the CRI to see `ref`. */
  async importImage(tar: string, ref: string): Promise<void> {
    const out = await run(NSENTER, [
      `--mount=${this.base}/mnt`,
      "--",
      this.bins.paths.ctr,
      "--address",
      "/run/containerd/containerd.sock",
      "--namespace",
      "k8s.io",
      "images",
      "import",
      "--no-unpack=false",
      tar,
    ]).catch((err) => {
      throw new Error(`Cannot import "${tar}" into node ${this.name}: ${err.message}`);
    });
    const deadline = Date.now() + 30_000;
    while ((await this.cri.imageStatus(ref)) === null) {
      if (Date.now() > deadline) throw new Error(`The CRI does not see ${ref} (ctr: ${out})`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Writes kubelet's kubeconfig and configuration and starts it in the node. */
  async startKubelet(
    o: Pick<RealNodeOptions, "clusterDns" | "nodeDns" | "kubeletConfig"> = {},
  ): Promise<void> {
    const b = this.base;
    const cert = await this.#cluster.nodeCert(this.name);
    const kubeconfig = `${b}/kubelet.kubeconfig`;
    await Deno.writeTextFile(
      kubeconfig,
      this.#cluster.kubeconfig({ cert }, `https://127.0.0.1:${this.#apiPort}`),
    );
    await Deno.writeTextFile(
      this.host("/var/lib/kubelet/resolv.conf"),
      `nameserver ${o.nodeDns ?? NODE_DNS}\n`,
    );
    const config = {
      apiVersion: "kubelet.config.k8s.io/v1beta1",
      kind: "KubeletConfiguration",
      // This machine runs cgroup v1; kubelet >= 1.35 refuses it unless told.
      failCgroupV1: false,
      cgroupDriver: "cgroupfs",
      cgroupRoot: this.cgroupRoot,
      cgroupsPerQOS: true,
      enforceNodeAllocatable: ["pods"],
      failSwapOn: false,
      protectKernelDefaults: false,
      oomScoreAdj: 0,
      containerRuntimeEndpoint: "unix:///run/containerd/containerd.sock",
      address: this.nodeIp,
      port: 10250,
      readOnlyPort: 0,
      healthzBindAddress: "127.0.0.1",
      healthzPort: 10248,
      authentication: {
        anonymous: { enabled: false },
        webhook: { enabled: false },
        x509: { clientCAFile: this.#cluster.pki.ca.cert },
      },
      authorization: { mode: "AlwaysAllow" },
      clusterDNS: [o.clusterDns ?? "10.96.0.10"],
      clusterDomain: "cluster.local",
      resolvConf: "/var/lib/kubelet/resolv.conf",
      volumePluginDir: "/var/lib/kubelet/volume-plugins",
      staticPodPath: "",
      imageGCHighThresholdPercent: 100,
      imageGCLowThresholdPercent: 99,
      evictionHard: {
        "memory.available": "1Ki",
        "nodefs.available": "1%",
        "imagefs.available": "1%",
      },
      evictionPressureTransitionPeriod: "1s",
      serializeImagePulls: false,
      registerNode: true,
      syncFrequency: "5s",
      nodeStatusUpdateFrequency: "5s",
      ...o.kubeletConfig,
    };
    await Deno.writeTextFile(`${b}/kubelet.yaml`, toYaml(config));
    this.#kubeletArgs = [
      `--config=${b}/kubelet.yaml`,
      `--kubeconfig=${kubeconfig}`,
      "--root-dir=/var/lib/kubelet",
      `--hostname-override=${this.name}`,
      `--node-ip=${this.nodeIp}`,
      "--v=2",
    ];
    await this.#startKubelet();
  }

  async #startKubelet(): Promise<void> {
    this.#kubelet = await ComponentProcess.start(
      "kubelet",
      this.bins.paths.kubelet,
      this.#kubeletArgs,
      `${this.base}/logs/kubelet.log`,
      {},
      this.wrap([]),
    );
    this.#say(`node ${this.name}: kubelet started (pid ${this.#kubelet.pid})`);
  }

  /**
   * The in-cluster path to the API server, as pods (the agent) use it: the `kubernetes`
   * Service's ClusterIP through the real kube-proxy (iptables mode) in the node's namespace,
   * to an endpoint this writes (the API server's own reconciler is off: its address,
   * 127.0.0.1, is not one an EndpointSlice takes) at a relay on the node's address.
   */
  async serveKubernetesService(): Promise<void> {
    const port = await this.#bridge!.into(this.netns, this.nodeIp);
    await this.#cluster.admin.apply(
      "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes",
      {
        apiVersion: "discovery.k8s.io/v1",
        kind: "EndpointSlice",
        metadata: {
          name: "kubernetes",
          namespace: "default",
          labels: {
            "kubernetes.io/service-name": "kubernetes",
            "endpointslice.kubernetes.io/managed-by": "enim-tests",
          },
        },
        addressType: "IPv4",
        endpoints: [{ addresses: [this.nodeIp], conditions: { ready: true } }],
        ports: [{ name: "https", port, protocol: "TCP" }],
      },
      StoredSchema,
      FIELD_MANAGER,
    );
    this.#proxy = await RealKubeProxy.start(this.#cluster, {
      netns: this.netns,
      nodeName: this.name,
      apiPort: this.#apiPort,
      mode: "iptables",
    });
    this.#say(
      `node ${this.name}: kube-proxy started, the kubernetes Service at ${this.nodeIp}:${port}`,
    );
  }

  /** Stops kubelet (SIGTERM, its pods keep running) and starts it again with the same flags. */
  async restartKubelet(): Promise<void> {
    await this.#kubelet?.stop();
    await this.#startKubelet();
  }

  /** kubelet's PID (null before it started). */
  get kubeletPid(): number | null {
    return this.#kubelet?.pid ?? null;
  }

  /** The sandboxes containerd has for the pod of UID `podUid` (kubelet's label), any state. */
  async sandboxesOf(podUid: string): Promise<{ id: string; ready: boolean }[]> {
    return (await this.cri.listPodSandbox())
      .filter((s) => s.labels["io.kubernetes.pod.uid"] === podUid)
      .map((s) => ({ id: s.id, ready: s.state === "SANDBOX_READY" }));
  }

  /** The PID (the machine's) of sandbox `id`'s pause process, from containerd's verbose status. */
  async sandboxPid(id: string): Promise<number> {
    const pid = containerdSandboxInfo(await this.cri.podSandboxStatus(id)).pid;
    if (pid <= 0) throw new Error(`Sandbox ${id} has no process`);
    return pid;
  }

  /**
   * The PIDs (the machine's) of the processes of container `containerId` (a CRI ID): those
   * in its cgroup under the node's cgroup root, where kubelet's cgroupfs driver puts it
   * (`<root>/kubepods/<qos>/pod<uid>/<id>`), and which of them is its init (PID 1 of its
   * PID namespace).
   */
  containerProcesses(containerId: string): { pids: number[]; init: number | null } {
    // cgroup v1: the memory hierarchy (every container has a cgroup there); v2: the root.
    const roots = cgroupRoots();
    const root = [roots.find((r) => r.endsWith("/memory")) ?? roots[0]]
      .map((r) => `${r}${this.cgroupRoot}`).find(exists);
    if (!root) throw new Error(`No cgroup ${this.cgroupRoot}`);
    const dir = dirsDeepestFirst(root).find((d) => d.endsWith(`/${containerId}`));
    if (!dir) throw new Error(`No cgroup of container ${containerId} under ${root}`);
    const pids = Deno.readTextFileSync(`${dir}/cgroup.procs`).split("\n").filter(Boolean)
      .map(Number);
    const init = pids.find((p) => {
      try {
        const ns = /^NSpid:\s+(.*)$/m.exec(Deno.readTextFileSync(`/proc/${p}/status`));
        return ns?.[1].trim().split(/\s+/).pop() === "1";
      } catch {
        return false;
      }
    }) ?? null;
    return { pids, init };
  }

  /** Waits until the Node object exists (kubelet registered it). */
  async waitRegistered(timeoutMs = 120_000): Promise<void> {
    const t0 = performance.now();
    while (!(await this.#cluster.admin.find(`/api/v1/nodes/${this.name}`, NodeSchema))) {
      if (this.#kubelet?.exited) {
        throw new Error(
          `kubelet exited with ${this.#kubelet.exited.code}:\n${this.#kubelet.tail()}`,
        );
      }
      if (performance.now() - t0 > timeoutMs) {
        throw new Error(`kubelet did not register Node "${this.name}" in ${timeoutMs} ms`);
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    this.#say(`node ${this.name}: registered`);
  }

  /** Waits until the Node's Ready condition is True; returns the Node. */
  async waitReady(timeoutMs = 120_000): Promise<z.infer<typeof NodeSchema>> {
    const t0 = performance.now();
    let last = "";
    for (;;) {
      const n = await this.#cluster.admin.find(`/api/v1/nodes/${this.name}`, NodeSchema);
      const ready = n?.status?.conditions?.find((c) => c.type === "Ready");
      if (n && ready?.status === "True") return n;
      last = JSON.stringify(ready ?? null);
      if (this.#kubelet?.exited) {
        throw new Error(
          `kubelet exited with ${this.#kubelet.exited.code}:\n${this.#kubelet.tail()}`,
        );
      }
      if (performance.now() - t0 > timeoutMs) {
        throw new Error(`Node "${this.name}" not Ready in ${timeoutMs} ms: ${last}`);
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  /** kubelet's and containerd's logs so far (their ends). */
  async logs(chars = 8000): Promise<string> {
    const read = async (n: string) =>
      (await Deno.readTextFile(`${this.base}/logs/${n}.log`).catch(() => "")).slice(-chars);
    let pods = "";
    const root = this.host("/var/log/pods");
    for (const pod of entries(root)) {
      for (const c of entries(`${root}/${pod}`)) {
        for (const f of entries(`${root}/${pod}/${c}`)) {
          const text = await Deno.readTextFile(`${root}/${pod}/${c}/${f}`).catch(() => "");
          pods += `--- ${pod}/${c}/${f} ---\n${text.slice(-2000)}\n`;
        }
      }
    }
    return `--- kubelet ---\n${await read("kubelet")}\n--- containerd ---\n${await read(
      "containerd",
    )}\n${pods}`;
  }

  /** kubelet's log so far. */
  kubeletLog(): Promise<string> {
    return Deno.readTextFile(`${this.base}/logs/kubelet.log`).catch(() => "");
  }

  /** containerd's log so far. */
  containerdLog(): Promise<string> {
    return Deno.readTextFile(`${this.base}/logs/containerd.log`).catch(() => "");
  }

  /** The PIDs of processes in the node's mount namespace (kubelet, containerd, the shims). */
  #nodeProcesses(): number[] {
    if (!this.#mntIno) return [];
    const pids: number[] = [];
    for (const p of entries("/proc").filter((e) => /^\d+$/.test(e))) {
      try {
        const ns = ProcNsSchema.safeParse(Deno.readLinkSync(`/proc/${p}/ns/mnt`));
        if (ns.success && ns.data === this.#mntIno && Number(p) !== Deno.pid) pids.push(Number(p));
      } catch { /* gone meanwhile */ }
    }
    return pids;
  }

  /**
   * Stops kubelet, removes every pod sandbox through CRI, stops containerd, kills (by PID)
   * whatever is left in the node's mount namespace or cgroups, removes the cgroups, the
   * mount namespace and the folder. Idempotent.
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
    await step(async () => await this.#kubelet?.stop());
    if (this.#cri && this.#containerd && !this.#containerd.exited) {
      const cri = this.#cri;
      await step(async () => {
        for (const sb of await cri.listPodSandbox()) {
          await cri.stopPodSandbox(sb.id).catch(() => {});
          await cri.removePodSandbox(sb.id).catch(() => {});
        }
      });
    }
    this.#cri?.close();
    this.#cri = null;
    await step(async () => await this.#containerd?.stop());
    await step(async () => await this.#proxy?.stop());
    await step(() => this.#killAll());
    await step(async () => await this.#bridge?.close());
    await step(async () => {
      if (exists(`${this.base}/mnt`)) await run(UMOUNT, [`${this.base}/mnt`]);
    });
    if (Deno.env.get("ENIM_K8S_KEEP") === "1") {
      console.error(`k8s: kept ${this.base} (ENIM_K8S_KEEP=1)`);
    } else {
      await step(async () => {
        await run(UMOUNT, ["--lazy", this.base]).catch(() => {});
        await Deno.remove(this.base, { recursive: true });
      });
    }
    if (errors.length > 0) {
      throw new AggregateError(errors, `Cannot tear node ${this.name} in ${this.base} down`);
    }
  }

  async #killAll(): Promise<void> {
    const roots = cgroupRoots().map((r) => `${r}${this.cgroupRoot}`).filter(exists);
    for (let round = 0; round < 50; round++) {
      const pids = new Set(this.#nodeProcesses());
      for (const root of roots) {
        for (const dir of dirsDeepestFirst(root)) {
          const procs = await Deno.readTextFile(`${dir}/cgroup.procs`).catch(() => "");
          for (const p of procs.split("\n").filter(Boolean)) pids.add(Number(p));
        }
      }
      for (const pid of pids) {
        try {
          Deno.kill(pid, "SIGKILL");
        } catch { /* exited meanwhile */ }
      }
      const left = roots.flatMap((root) =>
        dirsDeepestFirst(root).filter((dir) => {
          try {
            Deno.removeSync(dir);
            return false;
          } catch {
            return exists(dir);
          }
        })
      );
      if (left.length === 0 && pids.size === 0) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`Cannot remove the cgroups under ${this.cgroupRoot}`);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** Re-exported for callers that build the node before the cluster. */
export { ensureNodeBinaries };
export type { EnsureOptions };
