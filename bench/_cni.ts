/**
 * The bench's contenders and how it calls them: enim (the launcher
 * `deno task install` puts at /opt/cni/bin/enim, exec'd as a runtime does) and the
 * reference (Debian's host-device + static IPAM on an equivalent veth), both spawned
 * through the same `nsenter` wrapper into the simulated node and timed from spawn to
 * exit; and the pod slots they work on.
 *
 * @module
 */
import type { SimulatedNode } from "../tests/support/node.ts";
import type { NetnsHandle } from "../tests/support/vpc.ts";
import { runCommand } from "../tests/support/command.ts";
import { SHAPED_10M_RUNTIME_CONFIG } from "../tests/support/bandwidth_fixtures.ts";
import { vethNames } from "../netns/sim.ts";
import type { Eni } from "../providers/schema.ts";
import type { Settings } from "./_settings.ts";

/** The reference plugin (containernetworking-plugins). */
export const HOST_DEVICE = "/usr/lib/cni/host-device";
const SYSCTL = "/usr/sbin/sysctl";

/** One spawn's outcome and its wall time. */
export interface ExecResult {
  code: number;
  ms: number;
  stdout: string;
  stderr: string;
}

/** Spawns `argv` inside the node's sandbox (the one wrapper both contenders share) and times it. */
export async function execInNode(
  node: SimulatedNode,
  argv: string[],
  env: Record<string, string>,
  stdin: string,
): Promise<ExecResult> {
  const wrapped = node.sandbox.wrap(argv);
  const t0 = performance.now();
  const out = await runCommand(
    wrapped,
    { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", NO_COLOR: "1", ...env },
    stdin,
  );
  return { ...out, ms: performance.now() - t0 };
}

/** One contender: how to run its ADD, DEL and VERSION for a pod. */
export interface Contender {
  name: string;
  argv: string[];
  env(verb: string, pod: PodSlot): Record<string, string>;
  config(pod: PodSlot): string;
}

/** A pod namespace and, for the reference, the veth it moves in. */
export interface PodSlot {
  ns: NetnsHandle;
  containerId: string;
  /** Reference only: the node-side device and its ENI's addresses. */
  eni?: Eni;
}

/** The three contenders: enim, enim with the pod's bandwidth shaped, and the reference. */
export interface Contenders {
  enim: Contender;
  /** enim with the pod's bandwidth shaped (the bandwidth section). */
  shaped: Contender;
  reference: Contender;
}

/** The contenders, enim's through the launcher at `launcher`. */
export function contenders(settings: Settings, launcher: string): Contenders {
  /**
   * enim's network config: a Kubernetes pod's (the CNI_ARGS say so), so each ADD also makes
   * the pod's host link to the node, routing a Service CIDR (issue 27); `--host-link off`
   * measures without it.
   */
  const enimConfig = JSON.stringify({
    cniVersion: "1.1.0",
    name: "bench",
    type: "enim",
    serviceCidrs: ["10.96.0.0/16"],
    ...(settings.hostLink ? {} : { hostLink: { enabled: false } }),
  });
  /** The same network with 10M limits both ways, as containerd passes a pod's bandwidth annotations. */
  const shapedConfig = JSON.stringify({
    ...JSON.parse(enimConfig),
    runtimeConfig: SHAPED_10M_RUNTIME_CONFIG,
  });
  const enim: Contender = {
    name: "enim",
    argv: [launcher],
    env: (verb, pod) => ({
      CNI_COMMAND: verb,
      CNI_CONTAINERID: pod.containerId,
      CNI_NETNS: pod.ns.path,
      CNI_IFNAME: "eth0",
      CNI_PATH: "/opt/cni/bin",
      CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${pod.ns.name}`,
      ENIM_LOG_FILE: "/run/enim/cni.log",
    }),
    config: () => enimConfig,
  };
  const reference: Contender = {
    name: "reference",
    argv: [HOST_DEVICE],
    env: (verb, pod) => ({
      CNI_COMMAND: verb,
      CNI_CONTAINERID: pod.containerId,
      CNI_NETNS: pod.ns.path,
      CNI_IFNAME: "eth0",
      CNI_PATH: "/usr/lib/cni",
      CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${pod.ns.name}`,
    }),
    config: (pod) => {
      const eni = pod.eni!;
      const addrs = [eni.ipv4, eni.ipv6].filter((a) => a !== null);
      return JSON.stringify({
        cniVersion: "1.0.0",
        name: "bench-ref",
        type: "host-device",
        device: vethNames(eni.mac).node,
        ipam: {
          type: "static",
          addresses: addrs.map((a) => ({
            address: `${a.address}/${a.prefixLength}`,
            gateway: a.gateway,
          })),
          routes: addrs.map((a) => ({
            dst: a.address.includes(":") ? "::/0" : "0.0.0.0/0",
            gw: a.gateway,
          })),
        },
      });
    },
  };
  return { enim, shaped: { ...enim, name: "enim-shaped", config: () => shapedConfig }, reference };
}

/** Runs one CNI call of `c` for `pod`; throws with its output when it fails. */
export async function cni(
  node: SimulatedNode,
  c: Contender,
  verb: "ADD" | "DEL",
  pod: PodSlot,
  wrap: string[] = [],
): Promise<ExecResult> {
  const res = await execInNode(node, [...wrap, ...c.argv], c.env(verb, pod), c.config(pod));
  if (res.code !== 0) {
    throw new Error(
      `${c.name} ${verb} for ${pod.ns.name} failed (exit ${res.code}): ${res.stdout.trim()} ${res.stderr.trim()}`,
    );
  }
  return res;
}

/** A pod namespace without IPv6 DAD (the reference would otherwise wait 10 s for it). */
export async function podNetns(node: SimulatedNode, name: string): Promise<NetnsHandle> {
  const ns = await node.vpc.pod(name);
  for (const k of ["default", "all"]) {
    const out = await node.vpc.exec(ns, [SYSCTL, "-qw", `net.ipv6.conf.${k}.accept_dad=0`]);
    if (out.code !== 0) throw new Error(`sysctl in ${ns.name} failed: ${out.stderr}`);
  }
  return ns;
}

/**
 * Gives `pod` a new namespace, as kubelet gives each sandbox one, and removes its last
 * (as the runtime does after a DEL); then waits, untimed, for the rest of enim's DELs
 * that answered before their device's move home (a read of the agent's state waits for
 * it), so the call timed next is timed alone.
 */
export async function newSandbox(node: SimulatedNode, pod: PodSlot, name: string): Promise<void> {
  const old = pod.ns;
  pod.ns = await podNetns(node, name);
  await node.vpc.deletePod(old);
  await node.client.status();
}

let cidSeq = 0;
/** A container ID not used before in this run. */
export const newCid = (tag: string): string =>
  `bench-${tag}-${(cidSeq++).toString().padStart(6, "0")}`;

/** What every section works with: the node, its agent, the contenders and the two pod slots. */
export interface BenchContext {
  settings: Settings;
  node: SimulatedNode;
  agentPid: number;
  contenders: Contenders;
  /** The floor of any Deno process: an empty program, no config, no lockfile. */
  floorArgv: string[];
  enimPod: PodSlot;
  refPod: PodSlot;
}
