/**
 * `deno task demo`: enim's main job, end to end, on the embedded default (the mock
 * provider) in network namespaces.
 *
 * Builds a simulated node and VPC, starts the agent in the node namespace, runs the
 * plugin for three pods exactly as a container runtime would, shows each pod's
 * ENI, interface, addresses and pings, a "cluster DNS" Service at a ClusterIP
 * (kube-proxy's nftables rules on the node, endpoints a node process and the api
 * pod) answering the web pod through its host link, a second Service backed by a
 * machine elsewhere in the VPC (which sees the web pod's own address: the node sends
 * it back to leave by web's ENI), the node opening TCP to a pod,
 * shows `enim status`, DELs the pods and tears everything down. Exits 0 only if
 * every step worked.
 *
 * kube-proxy's rules are written as kube-proxy writes them (tests/support/kube_proxy.ts,
 * checked against the real kube-proxy by tests/k8s_kube_proxy_test.ts), not run: the real
 * one needs a control plane built from Go modules (minutes, and Go), which is the tests'
 * to install, not the demo's.
 *
 * @module
 */
import { aptNeedsOf, ensureApt, isRoot } from "./_deps.ts";
import { SimulatedNode } from "../tests/support/node.ts";
import type { NetnsHandle } from "../tests/support/vpc.ts";
import { askWithDeno, Servers, who } from "../tests/support/traffic.ts";
import { installKubeProxy } from "../tests/support/kube_proxy.ts";

const bold = (s: string) => Deno.noColor ? s : `\x1b[1m${s}\x1b[0m`;
const ok = (s: string) => (Deno.noColor ? "ok " : "\x1b[32mok\x1b[0m ") + s;
const bad = (s: string) => (Deno.noColor ? "FAIL " : "\x1b[31mFAIL\x1b[0m ") + s;

let failures = 0;
function step(pass: boolean, text: string): void {
  if (!pass) failures++;
  console.log("  " + (pass ? ok(text) : bad(text)));
}

if (!isRoot()) {
  console.error("The demo builds network namespaces and needs root: run it as root.");
  Deno.exit(2);
}
const unmet = await ensureApt(aptNeedsOf("demo"));
if (unmet.length > 0) {
  console.error(`The demo needs ${unmet.join(", ")}, which could not be installed.`);
  Deno.exit(2);
}

const t0 = performance.now();
console.log(bold("enim demo: whole ENIs for pods, on the mock provider in network namespaces\n"));
// Two profiles: the default subnet, and "db" (its own subnet and security group), which
// the db pod chooses through its annotations as containerd passes them.
// The node has its own NIC on the VPC (the 250th address), as a Kubernetes node has: the
// cluster DNS Service's node-process endpoint listens there.
const ELSEWHERE_SUBNET = "10.97.0.0/24";
const node = await SimulatedNode.start({
  nodeNic: true,
  // Another subnet of the VPC, outside every profile: a machine elsewhere in the VPC.
  extraSubnets: [ELSEWHERE_SUBNET],
  mock: { enis: 4 },
  profiles: {
    db: { subnets: { ipv4: "10.98.0.0/24" }, enis: 2, securityGroupIds: ["g-dbonly"] },
  },
});
const ANNOTATIONS: Record<string, Record<string, string>> = {
  db: { "enim.dev/profile": "db", "enim.dev/sticky": "true" },
};
/** The cluster's Service CIDR (the pods route it through their host link to the node). */
const SERVICE_CIDR = "10.96.0.0/16";
const CLUSTER_DNS = "10.96.0.10";
/** A Service whose backend is a machine elsewhere in the VPC (beyond the node). */
const METRICS = "10.96.0.20";
const conf = (extra: Record<string, unknown> = {}) =>
  node.netconf("1.1.0", { serviceCidrs: [SERVICE_CIDR], ...extra });
await using servers = new Servers();
try {
  console.log(`node namespace   ${node.vpc.node.name}`);
  console.log(
    `VPC namespace    ${node.vpc.vpc.name} (bridge ${node.vpc.bridge}, gateways ${node.vpc.gateways.ipv4} ${node.vpc.gateways.ipv6})`,
  );
  console.log(`agent            pid ${node.agentPid}, socket ${node.socket}`);
  console.log(`sandbox          ${node.sandbox.base} (the node's private /run/enim)\n`);

  const pods: {
    name: string;
    ns: NetnsHandle;
    containerId: string;
    ips: string[];
    gateways: string[];
  }[] = [];
  for (const name of ["web", "api", "db"]) {
    const ns = await node.vpc.pod(name);
    const containerId = `demo-${name}-${crypto.randomUUID().slice(0, 8)}`;
    const annotations = ANNOTATIONS[name];
    console.log(
      bold(`ADD pod default/${name}`) + `  (CNI_NETNS=${ns.path})` +
        (annotations ? `\n     annotations ${JSON.stringify(annotations)}` : ""),
    );
    const res = await node.cni("ADD", {
      containerId,
      ifName: "eth0",
      netns: ns.path,
      args: `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1`,
      config: conf(
        annotations ? { runtimeConfig: { "io.kubernetes.cri.pod-annotations": annotations } } : {},
      ),
    });
    if (res.code !== 0 || !res.json) {
      step(false, `ADD failed (exit ${res.code}): ${res.stdout.trim()} ${res.stderr.trim()}`);
      continue;
    }
    const ifaces = res.json.interfaces as { name: string; mac: string; sandbox?: string }[];
    const iface = ifaces[0];
    const ips = res.json.ips as { address: string; gateway: string }[];
    step(true, `interface ${iface.name}, MAC ${iface.mac}`);
    if (ifaces.length === 3) {
      console.log(`     host link ${ifaces[2].name} (pod) ↔ ${ifaces[1].name} (node)`);
    }
    for (const ip of ips) console.log(`     address ${ip.address} via ${ip.gateway}`);
    const shown = await node.vpc.exec(ns, ["/usr/sbin/ip", "-br", "addr", "show", "dev", "eth0"]);
    console.log(`     in the pod: ${shown.stdout.trim()}`);
    pods.push({
      name,
      ns,
      containerId,
      ips: ips.map((i) => i.address.split("/")[0]),
      gateways: ips.map((i) => i.gateway),
    });
  }

  console.log(bold("\nPings from inside the pods"));
  for (const [i, pod] of pods.entries()) {
    // Each pod reaches its own subnet's gateway, and the pods of the same subnet each other.
    for (const gw of pod.gateways) {
      step(await node.vpc.ping(pod.ns, gw), `${pod.name} → its gateway ${gw}`);
    }
    const other = pods[(i + 1) % pods.length];
    if (other !== pod && other.gateways[0] === pod.gateways[0]) {
      for (const ip of other.ips) {
        step(await node.vpc.ping(pod.ns, ip), `${pod.name} → ${other.name} ${ip}`);
      }
    }
  }

  console.log(bold("\nKubernetes: cluster DNS at a ClusterIP, through each pod's host link"));
  const nic = node.nic!;
  const web = pods.find((p) => p.name === "web");
  const api = pods.find((p) => p.name === "api");
  if (web && api) {
    // Two endpoints, as kube-proxy would pick between them: a process on the node
    // (hostNetwork) and the api pod (an enim pod on the same node).
    await servers.start(node.vpc.node, "node-dns", [{ proto: "udp", port: 5353 }]);
    await servers.start(api.ns, "api-dns", [{ proto: "udp", port: 5353 }]);
    // And a machine elsewhere in the VPC behind a second Service: beyond the node.
    const metrics = await node.vpc.host("metrics", 70, { ipv4: ELSEWHERE_SUBNET });
    await servers.start(metrics.ns, "vpc-metrics", [{ proto: "udp", port: 5353 }]);
    await installKubeProxy(node.vpc.node.name, "nftables", [{
      namespace: "kube-system",
      name: "kube-dns",
      portName: "dns",
      protocol: "udp",
      clusterIP: CLUSTER_DNS,
      port: 53,
      endpoints: [{ ip: nic.ipv4!, port: 5353 }, { ip: api.ips[0], port: 5353 }],
    }, {
      namespace: "monitoring",
      name: "metrics",
      portName: "udp",
      protocol: "udp",
      clusterIP: METRICS,
      port: 53,
      endpoints: [{ ip: metrics.ipv4!, port: 5353 }],
    }], [{ family: 4, serviceCidr: SERVICE_CIDR, nodeIPs: [nic.ipv4!] }]);
    console.log(
      `     kube-proxy (nftables mode) DNATs ${CLUSTER_DNS}:53/udp to ${nic.ipv4}:5353 (node) ` +
        `and ${api.ips[0]}:5353 (api)`,
    );
    const routes = await node.vpc.exec(web.ns, ["/usr/sbin/ip", "route", "show", SERVICE_CIDR]);
    console.log(`     web's route: ${routes.stdout.trim()}`);
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) {
      const answer = who(await askWithDeno(web.ns, "udp", CLUSTER_DNS, 53));
      const [backend, peer] = answer.split(" ");
      step(
        peer === web.ips[0],
        `web asks ${CLUSTER_DNS}:53 → answered by ${backend || "nobody"}, which saw web's ${
          peer || "?"
        }`,
      );
      if (backend) seen.add(backend);
    }
    console.log(`     backends that answered: ${[...seen].join(", ")}`);
    // Beyond the node: the node sends web's Service traffic back over its host link, and
    // it leaves by web's own ENI with web's own address (its security groups apply).
    const far = who(await askWithDeno(web.ns, "udp", METRICS, 53));
    const [farBackend, farPeer] = far.split(" ");
    step(
      farPeer === web.ips[0],
      `web asks ${METRICS}:53 → answered by ${farBackend || "nobody"} (${metrics.ipv4}, ` +
        `elsewhere in the VPC), which saw web's own ${farPeer || "?"}`,
    );
    const drops = await node.vpc.sourceCheckDrops();
    step(
      drops === 0,
      `the VPC's source check dropped ${drops} frames: nothing of a pod left the node's NIC`,
    );
    await servers.start(web.ns, "web", [{ proto: "tcp", port: 8080 }]);
    const probe = who(await askWithDeno(node.vpc.node, "tcp", web.ips[0], 8080));
    step(
      probe === `web ${nic.ipv4}`,
      `the node (kubelet) opens TCP to web at ${web.ips[0]}:8080 → ${probe || "no answer"}`,
    );
  }

  console.log(bold("\nenim status"));
  const status = await node.enim(["status"]);
  console.log(status.stdout.trimEnd().split("\n").map((l) => "  " + l).join("\n"));
  step(status.code === 0, "enim status");

  console.log(bold("\nDEL the pods"));
  for (const pod of pods) {
    const res = await node.cni("DEL", {
      containerId: pod.containerId,
      ifName: "eth0",
      netns: pod.ns.path,
      args: `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${pod.name};IgnoreUnknown=1`,
      config: conf(),
    });
    step(res.code === 0, `DEL ${pod.name}${res.code === 0 ? "" : `: ${res.stdout.trim()}`}`);
  }
  const after = await node.client.status();
  step(
    after.pool.owned === after.pool.held,
    `every ENI back in the pool (free ${after.pool.free}, owned ${after.pool.owned}, of which held for the sticky db pod ${after.pool.held})`,
  );
} catch (err) {
  step(false, `demo aborted: ${err instanceof Error ? err.message : String(err)}`);
  console.error(await node.agentLog());
} finally {
  await servers[Symbol.asyncDispose]();
  await node.close();
  console.log(`\nteardown: namespaces removed, agent stopped`);
}
const secs = ((performance.now() - t0) / 1000).toFixed(1);
console.log(
  failures === 0
    ? bold(`\ndemo passed in ${secs} s`)
    : bold(`\ndemo FAILED: ${failures} step(s) in ${secs} s`),
);
Deno.exit(failures === 0 ? 0 : 1);
