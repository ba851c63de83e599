/**
 * The real kube-proxy (built by tests/support/k8s/build.ts) in a simulated node's network
 * namespace (`ip netns exec`), reading the real API server through the node's loopback
 * relay: Services, the EndpointSlices the real controller-manager makes, its own Node. Its
 * rules land in the node's namespace only (iptables and nft act on the namespace they run
 * in); the flags below keep it from the knobs that are the machine's, not the namespace's:
 *
 * - `--conntrack-max-per-core=0`: `nf_conntrack_max` and the conntrack module's `hashsize`
 *   (`/sys/module/nf_conntrack/parameters/hashsize`) are global; left as they are;
 * - `--conntrack-tcp-timeout-established=0`, `--conntrack-tcp-timeout-close-wait=0`,
 *   `--conntrack-udp-timeout=0`, `--conntrack-udp-timeout-stream=0` (and no
 *   `--conntrack-tcp-be-liberal`): the `nf_conntrack_*` timeouts, left as they are;
 * - `--nodeport-addresses=primary` (with `--iptables-localhost-nodeports=false`): no
 *   NodePorts on 127.0.0.1, so no `route_localnet` sysctl;
 * - `--oom-score-adj=0`; health and metrics servers on 127.0.0.1 of the node's namespace.
 *
 * @module
 */
import type { KubeCluster } from "./cluster.ts";
import { ComponentProcess } from "./process.ts";

import type { ProxyMode } from "../kube_proxy.ts";

/** The flags that keep kube-proxy off the machine's global knobs (see the module doc). */
export const KUBE_PROXY_GLOBAL_KNOBS_OFF = [
  "--conntrack-max-per-core=0",
  "--conntrack-tcp-timeout-established=0",
  "--conntrack-tcp-timeout-close-wait=0",
  "--conntrack-udp-timeout=0",
  "--conntrack-udp-timeout-stream=0",
  "--nodeport-addresses=primary",
  "--iptables-localhost-nodeports=false",
  "--oom-score-adj=0",
];

/** Options of {@linkcode RealKubeProxy.start}. */
export interface KubeProxyOptions {
  /** The node's network namespace (a name under /run/netns). */
  netns: string;
  /** The node's name in the cluster (its Node must be registered). */
  nodeName: string;
  /** The port of the API server's relay at 127.0.0.1 in `netns`. */
  apiPort: number;
  mode: ProxyMode;
  /** `--cluster-cidr` (default none: no local-traffic detector, as enim's docs allow). */
  clusterCidr?: string;
  /** More flags. */
  flags?: string[];
}

/** A running kube-proxy. */
export class RealKubeProxy {
  readonly mode: ProxyMode;
  readonly netns: string;
  readonly #proc: ComponentProcess;
  readonly #cluster: KubeCluster;
  readonly #argsBase: string[];

  private constructor(
    cluster: KubeCluster,
    proc: ComponentProcess,
    mode: ProxyMode,
    netns: string,
    argsBase: string[],
  ) {
    this.#cluster = cluster;
    this.#proc = proc;
    this.mode = mode;
    this.netns = netns;
    this.#argsBase = argsBase;
  }

  /** Starts kube-proxy in `o.netns`; it syncs its rules on its own (poll for their effect). */
  static async start(cluster: KubeCluster, o: KubeProxyOptions): Promise<RealKubeProxy> {
    const kubeconfig = `${cluster.dir}/kube-proxy-${o.netns}.kubeconfig`;
    await Deno.writeTextFile(
      kubeconfig,
      cluster.kubeconfig({ cert: cluster.pki.kubeProxy }, `https://127.0.0.1:${o.apiPort}`),
    );
    const base = [`--kubeconfig=${kubeconfig}`, `--hostname-override=${o.nodeName}`];
    const args = [
      ...base,
      `--proxy-mode=${o.mode}`,
      "--healthz-bind-address=127.0.0.1:10256",
      "--metrics-bind-address=127.0.0.1:10249",
      ...(o.clusterCidr ? [`--cluster-cidr=${o.clusterCidr}`] : []),
      ...KUBE_PROXY_GLOBAL_KNOBS_OFF,
      ...(o.flags ?? []),
    ];
    const proc = await ComponentProcess.start(
      `kube-proxy`,
      cluster.bins.paths["kube-proxy"],
      args,
      `${cluster.dir}/logs/kube-proxy-${o.netns}-${o.mode}.log`,
      {},
      ["/usr/sbin/ip", "netns", "exec", o.netns],
    );
    return new RealKubeProxy(cluster, proc, o.mode, o.netns, base);
  }

  /** Its rules in the node's namespace now: `nft list table ip kube-proxy`, or `iptables-save -t nat`. */
  async rules(): Promise<string> {
    const argv = this.mode === "nftables"
      ? ["/usr/sbin/nft", "list", "table", "ip", "kube-proxy"]
      : ["/usr/sbin/iptables-save", "-t", "nat"];
    const out = await new Deno.Command("/usr/sbin/ip", {
      args: ["netns", "exec", this.netns, ...argv],
      stdout: "piped",
      stderr: "null",
    }).output();
    return new TextDecoder().decode(out.stdout);
  }

  /**
   * All its rules in the node's namespace, both families: `nft list ruleset`, or
   * `iptables-save -t nat` and `ip6tables-save -t nat`.
   */
  async allRules(): Promise<string> {
    const argvs = this.mode === "nftables"
      ? [["/usr/sbin/nft", "list", "ruleset"]]
      : [["/usr/sbin/iptables-save", "-t", "nat"], ["/usr/sbin/ip6tables-save", "-t", "nat"]];
    let text = "";
    for (const argv of argvs) {
      const out = await new Deno.Command("/usr/sbin/ip", {
        args: ["netns", "exec", this.netns, ...argv],
        stdout: "piped",
        stderr: "null",
      }).output();
      text += new TextDecoder().decode(out.stdout);
    }
    return text;
  }

  /** Its log so far. */
  async log(): Promise<string> {
    return await Deno.readTextFile(this.#proc.logPath).catch(() => "");
  }

  /** Whether it exited (and how). */
  get exited(): Deno.CommandStatus | null {
    return this.#proc.exited;
  }

  /**
   * Stops it (SIGTERM by PID) and removes its rules from the node's namespace
   * (`kube-proxy --cleanup`, which removes both modes' rules), as an operator switching
   * modes does.
   */
  async stop(): Promise<void> {
    await this.#proc.stop();
    const out = await new Deno.Command("/usr/sbin/ip", {
      args: [
        "netns",
        "exec",
        this.netns,
        this.#cluster.bins.paths["kube-proxy"],
        ...this.#argsBase,
        "--cleanup",
      ],
      clearEnv: true,
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) {
      throw new Error(
        `kube-proxy --cleanup in "${this.netns}" failed: ${new TextDecoder().decode(out.stderr)}`,
      );
    }
  }
}
