/**
 * kube-proxy for the datapath tests (issue 43, point 4): one interface, two makers.
 *
 * - **The real kube-proxy** (the default when Go is here): the control plane of
 *   tests/support/k8s/cluster.ts and, per node, {@linkcode RealKubeProxy} in the node's
 *   namespace, reading the API server through a relay there. A test's
 *   {@linkcode ServicePort}s become what a user writes: a Service per name (single- or
 *   dual-stack, its ClusterIPs as given, no selector) and its EndpointSlices, one per
 *   family and set of target ports, each endpoint ready and on the node the test says
 *   (`local`: this node; else another). Selector-less Services are plain Kubernetes
 *   (a Service whose endpoints something other than the EndpointSlice controller
 *   writes), and kube-proxy reads their slices as it reads the controller's: the tests
 *   whose backends are not pods of the API server (a VPC machine, a node's own server)
 *   need them. The slices the real controller-manager makes from pods are covered by
 *   tests/k8s_kube_proxy_test.ts and the NetworkPolicy end-to-end tests.
 * - **kube-proxy's rules written by hand** (tests/support/kube_proxy.ts), when Go is
 *   missing or `ENIM_KUBE_PROXY=rules` asks for them (a run that skips the build).
 *
 * `install` waits until the node's kube-proxy has programmed every ClusterIP and endpoint
 * asked for (and none it was asked to drop), so a test probes only programmed rules.
 *
 * @module
 */
import { poll } from "../../../lib/async.ts";
import { KubeBridge } from "../kube_bridge.ts";
import {
  installKubeProxy,
  type ProxyMode,
  type ProxyOptions,
  removeKubeProxy,
  type ServicePort,
} from "../kube_proxy.ts";
import type { SimulatedNode } from "../node.ts";
import { goMissing } from "./build.ts";
import { KubeCluster } from "./cluster.ts";
import { SimulatedKubelet } from "./kubelet.ts";
import { RealKubeProxy } from "./kube_proxy.ts";
import { FIELD_MANAGER } from "./manifests.ts";
import { StoredListSchema, StoredSchema } from "./rest.ts";

/** kube-proxy on the nodes of one test. */
export interface ServiceProxy extends AsyncDisposable {
  /** Which kube-proxy it is, for test names and logs. */
  readonly what: string;
  /** Whether it is the real kube-proxy. */
  readonly real: boolean;
  /**
   * kube-proxy on `node` in `mode`, serving exactly `services` (what an earlier call
   * served and this one does not name is removed); `opts` per family, as
   * {@linkcode installKubeProxy} takes them (the real one reads the node's addresses from
   * `nodeIPs`, its own Service CIDRs from the API server, and `clusterCidr` as its flag).
   */
  install(
    node: SimulatedNode,
    mode: ProxyMode,
    services: ServicePort[],
    opts: ProxyOptions[],
  ): Promise<void>;
  /** Removes kube-proxy's rules from `node` (the real one stopped and `--cleanup` run). */
  remove(node: SimulatedNode): Promise<void>;
  close(): Promise<void>;
}

/** Which kube-proxy the datapath tests get, and why. */
export function realKubeProxyWanted(): { real: boolean; why: string } {
  if (Deno.env.get("ENIM_KUBE_PROXY") === "rules") {
    return { real: false, why: "ENIM_KUBE_PROXY=rules" };
  }
  const missing = goMissing();
  return missing ? { real: false, why: missing } : { real: true, why: "Go is installed" };
}

/**
 * The kube-proxy of {@linkcode realKubeProxyWanted}; the real one's control plane gets
 * `serviceCidrs` (each test's ClusterIPs must be in them).
 */
export async function startServiceProxy(
  o: { serviceCidrs: string[] },
): Promise<ServiceProxy> {
  const want = realKubeProxyWanted();
  if (!want.real) {
    console.error(`kube-proxy's rules written by hand (${want.why})`);
    return new HandWrittenProxy(want.why);
  }
  const proxy = await RealServiceProxy.start(o.serviceCidrs);
  console.error(`kube-proxy: ${proxy.what}`);
  return proxy;
}

/** The hand-written rules of tests/support/kube_proxy.ts. */
class HandWrittenProxy implements ServiceProxy {
  readonly real = false;
  readonly what: string;

  constructor(why: string) {
    this.what = `kube-proxy's rules written by hand (${why})`;
  }

  async install(
    node: SimulatedNode,
    mode: ProxyMode,
    services: ServicePort[],
    opts: ProxyOptions[],
  ) {
    await installKubeProxy(node.vpc.node.name, mode, services, opts);
  }

  async remove(node: SimulatedNode) {
    await removeKubeProxy(node.vpc.node.name);
  }

  async close() {}

  [Symbol.asyncDispose]() {
    return this.close();
  }
}

/** What marks the objects this module writes. */
const MANAGED = { "enim.dev/test-proxy": "true" };

const enc = encodeURIComponent;
const family = (ip: string): 4 | 6 => (ip.includes(":") ? 6 : 4);

/** One node's kube-proxy: the process, its mode, what it serves. */
interface NodeProxy {
  proc: RealKubeProxy;
  mode: ProxyMode;
  clusterCidr: string | undefined;
  /** The ClusterIPs and endpoint addresses its rules must name. */
  names: string[];
}

/** The real kube-proxy, one per node, and the control plane it reads. */
class RealServiceProxy implements ServiceProxy {
  readonly real = true;
  readonly #cluster: KubeCluster;
  readonly #bridge: KubeBridge;
  readonly #ports = new Map<string, number>();
  readonly #nodes = new Map<string, NodeProxy>();
  readonly #kubelets = new Map<string, SimulatedKubelet>();
  readonly #namespaces = new Set<string>(["default", "kube-system"]);
  /** `namespace/name` of each Service written, by node netns. */
  readonly #written = new Map<string, Set<string>>();

  private constructor(cluster: KubeCluster, bridge: KubeBridge) {
    this.#cluster = cluster;
    this.#bridge = bridge;
  }

  static async start(serviceCidrs: string[]): Promise<RealServiceProxy> {
    const cluster = await KubeCluster.start({ serviceCidrs });
    return new RealServiceProxy(cluster, KubeBridge.start({ url: cluster.url }));
  }

  get what(): string {
    return `the real kube-proxy v${this.#cluster.bins.version}`;
  }

  /** The node's name in the cluster: its namespace's name, as a DNS label. */
  #nodeName(node: SimulatedNode): string {
    return node.vpc.node.name.toLowerCase().replace(/[^a-z0-9-]/g, "-").slice(0, 63);
  }

  async install(
    node: SimulatedNode,
    mode: ProxyMode,
    services: ServicePort[],
    opts: ProxyOptions[],
  ) {
    const netns = node.vpc.node.name;
    const nodeName = this.#nodeName(node);
    const admin = this.#cluster.admin;
    let kubelet = this.#kubelets.get(nodeName);
    if (!kubelet) {
      kubelet = await SimulatedKubelet.of(this.#cluster, nodeName);
      this.#kubelets.set(nodeName, kubelet);
      const addresses = opts.flatMap((o) => o.nodeIPs);
      await kubelet.register({ addresses: addresses.length ? addresses : ["10.0.0.254"] });
    }
    // The Services, grouped by name; their slices per family and set of target ports.
    const byName = new Map<string, ServicePort[]>();
    for (const s of services) {
      const key = `${s.namespace}/${s.name}`;
      byName.set(key, [...(byName.get(key) ?? []), s]);
    }
    const written = this.#written.get(netns) ?? new Set<string>();
    for (const [key, ports] of byName) {
      const [namespace, name] = key.split("/");
      await this.#namespace(namespace);
      const ips = [...new Set(ports.map((p) => p.clusterIP))].sort((a, b) => family(a) - family(b));
      const specPorts = new Map<string, { name: string; protocol: string; port: number }>();
      for (const p of ports) {
        specPorts.set(p.portName, {
          name: p.portName,
          protocol: p.protocol.toUpperCase(),
          port: p.port,
        });
      }
      await admin.apply(
        `/api/v1/namespaces/${enc(namespace)}/services/${enc(name)}`,
        {
          apiVersion: "v1",
          kind: "Service",
          metadata: { name, namespace, labels: MANAGED },
          spec: {
            clusterIP: ips[0],
            clusterIPs: ips,
            ipFamilies: ips.map((ip) => `IPv${family(ip)}`),
            ipFamilyPolicy: ips.length > 1 ? "RequireDualStack" : "SingleStack",
            ports: [...specPorts.values()],
          },
        },
        StoredSchema,
        FIELD_MANAGER,
      );
      // Endpoint address → its target port per port name, and whether it is on this node.
      const eps = new Map<string, { ports: Map<string, number>; local: boolean }>();
      for (const p of ports) {
        for (const e of p.endpoints) {
          const x = eps.get(e.ip) ?? { ports: new Map(), local: e.local ?? true };
          x.ports.set(`${p.portName}/${p.protocol}`, e.port);
          eps.set(e.ip, x);
        }
      }
      const slices = new Map<
        string,
        { fam: 4 | 6; ports: Map<string, number>; ips: string[]; local: boolean[] }
      >();
      for (const [ip, x] of eps) {
        const sig = `${family(ip)} ${JSON.stringify([...x.ports].sort())}`;
        const sl = slices.get(sig) ?? { fam: family(ip), ports: x.ports, ips: [], local: [] };
        sl.ips.push(ip);
        sl.local.push(x.local);
        slices.set(sig, sl);
      }
      const sliceNames = new Set<string>();
      let i = 0;
      for (const sl of slices.values()) {
        const sliceName = `${name}-enim-${i++}`;
        sliceNames.add(sliceName);
        await admin.apply(
          `/apis/discovery.k8s.io/v1/namespaces/${enc(namespace)}/endpointslices/${enc(sliceName)}`,
          {
            apiVersion: "discovery.k8s.io/v1",
            kind: "EndpointSlice",
            metadata: {
              name: sliceName,
              namespace,
              labels: {
                ...MANAGED,
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "enim-tests",
              },
            },
            addressType: `IPv${sl.fam}`,
            endpoints: sl.ips.map((ip, k) => ({
              addresses: [ip],
              conditions: { ready: true, serving: true, terminating: false },
              nodeName: sl.local[k] ? nodeName : "elsewhere",
            })),
            ports: [...sl.ports].map(([portName, port]) => ({
              name: portName.split("/")[0],
              protocol: portName.split("/")[1].toUpperCase(),
              port,
            })),
          },
          StoredSchema,
          FIELD_MANAGER,
        );
      }
      // Slices of this Service from an earlier call that this one does not name.
      const old = await admin.get(
        `/apis/discovery.k8s.io/v1/namespaces/${enc(namespace)}/endpointslices`,
        StoredListSchema,
        { labelSelector: `enim.dev/test-proxy=true,kubernetes.io/service-name=${name}` },
      );
      for (const o of old.items ?? []) {
        if (!sliceNames.has(o.metadata.name)) {
          await admin.delete(
            `/apis/discovery.k8s.io/v1/namespaces/${enc(namespace)}/endpointslices/${
              enc(o.metadata.name)
            }`,
          );
        }
      }
      written.add(key);
    }
    // Services of an earlier call that this one does not name.
    const dropped: string[] = [];
    for (const key of [...written]) {
      if (byName.has(key)) continue;
      const [namespace, name] = key.split("/");
      await admin.delete(`/api/v1/namespaces/${enc(namespace)}/services/${enc(name)}`);
      written.delete(key);
      dropped.push(key);
    }
    this.#written.set(netns, written);

    const clusterCidr = opts.find((o) => o.clusterCidr)?.clusterCidr;
    const names = [
      ...new Set(services.flatMap((s) => [s.clusterIP, ...s.endpoints.map((e) => e.ip)])),
    ];
    const before = this.#nodes.get(netns);
    const droppedIps = before ? before.names.filter((n) => !names.includes(n)) : [];
    let proc = before?.proc;
    if (before && (before.mode !== mode || before.clusterCidr !== clusterCidr)) {
      await before.proc.stop();
      proc = undefined;
    }
    if (!proc) {
      let port = this.#ports.get(netns);
      if (port === undefined) {
        port = await this.#bridge.into(netns);
        this.#ports.set(netns, port);
      }
      proc = await RealKubeProxy.start(this.#cluster, {
        netns,
        nodeName,
        apiPort: port,
        mode,
        clusterCidr,
      });
    }
    this.#nodes.set(netns, { proc, mode, clusterCidr, names });
    const p = proc;
    let text = "";
    const ok = await poll(async () => {
      if (p.exited) throw new Error(`kube-proxy exited: ${(await p.log()).slice(-3000)}`);
      text = await p.allRules();
      return names.every((n) => text.includes(n)) && !droppedIps.some((n) => text.includes(n)) ||
        null;
    }, { timeoutMs: 60_000, intervalMs: 200 });
    if (!ok) {
      throw new Error(
        `kube-proxy (${mode}) on ${netns} did not program ${names.join(", ")}${
          dropped.length ? ` or drop ${dropped.join(", ")}` : ""
        }:\n${text.slice(-3000)}\n${(await p.log()).slice(-3000)}`,
      );
    }
  }

  async #namespace(name: string): Promise<void> {
    if (this.#namespaces.has(name)) return;
    await this.#cluster.admin.apply(
      `/api/v1/namespaces/${enc(name)}`,
      { apiVersion: "v1", kind: "Namespace", metadata: { name } },
      StoredSchema,
      FIELD_MANAGER,
    );
    this.#namespaces.add(name);
  }

  async remove(node: SimulatedNode) {
    const netns = node.vpc.node.name;
    const p = this.#nodes.get(netns);
    this.#nodes.delete(netns);
    await p?.proc.stop();
  }

  async close() {
    for (const p of [...this.#nodes.values()]) await p.proc.stop().catch(() => {});
    this.#nodes.clear();
    for (const k of this.#kubelets.values()) k.close();
    await this.#bridge.close().catch(() => {});
    await this.#cluster.stop();
  }

  [Symbol.asyncDispose]() {
    return this.close();
  }
}
