/**
 * The real kube-proxy (issue 43, point 4), iptables and nftables modes, in a simulated
 * node's namespace, reading the real API server: a ClusterIP Service whose EndpointSlice
 * the real controller-manager makes from a Ready enim pod, called from another enim pod
 * through its host link; the backend sees the client pod's own address, and a
 * NetworkPolicy admitting only `web` keeps `job` out of the Service. kube-proxy's rules
 * stay in the node's namespace, and the machine's global conntrack knobs are left as they
 * were (tests/support/k8s/kube_proxy.ts says which flags keep them).
 *
 * Skips, saying why, without Go at /usr/local/go/bin/go or without root.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { z } from "zod";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS, who } from "./support/traffic.ts";
import { goMissing } from "./support/k8s/build.ts";
import { type ClusterPod, PolicyCluster, SERVICE_CIDRS } from "./support/policy_cluster.ts";
import { RealApi } from "./support/k8s/policy_api.ts";
import { RealKubeProxy } from "./support/k8s/kube_proxy.ts";
import {
  installKubeProxy,
  KUBE_PROXY_NEEDS,
  type ProxyMode,
  type ProxyOptions,
  type ServicePort,
} from "./support/kube_proxy.ts";
import { createNetns, deleteNetns, uniqueName } from "../netns/sim.ts";
import { FIELD_MANAGER } from "./support/k8s/manifests.ts";
import { StoredListSchema, StoredSchema } from "./support/k8s/rest.ts";
import { passed } from "./support/prober.ts";

const MISSING = goMissing();
const DEPS = MISSING === null
  ? await clientDeps("k8s_kube_proxy_test", [...TRAFFIC_NEEDS, ...KUBE_PROXY_NEEDS])
  : { skip: MISSING };

/** The machine's global conntrack knobs, read only. */
async function globalKnobs(): Promise<Record<string, string>> {
  const read = (p: string) => Deno.readTextFile(p).then((t) => t.trim(), () => "(absent)");
  return {
    nf_conntrack_max: await read("/proc/sys/net/netfilter/nf_conntrack_max"),
    hashsize: await read("/sys/module/nf_conntrack/parameters/hashsize"),
  };
}

/** The text of `argv` run in `netns`. */
async function inNetns(netns: string, argv: string[]): Promise<string> {
  const out = await new Deno.Command("/usr/sbin/ip", {
    args: ["netns", "exec", netns, ...argv],
    stdout: "piped",
    stderr: "piped",
  }).output();
  return new TextDecoder().decode(out.stdout);
}

const EndpointSliceListSchema = StoredListSchema.extend({
  items: z.array(z.looseObject({
    endpoints: z.nullish(z.array(z.looseObject({
      addresses: z.array(z.string()),
      conditions: z.optional(z.looseObject({ ready: z.optional(z.boolean()) })),
    }))),
  })),
});

const CLUSTER_IP = "172.30.0.10";
const STICKY_IP = "172.30.0.11";
const NODE_PORT = 30432;
const NODE_PORT_LOCAL = 30433;

/** A ruleset's JSON (`nft -j`), its handles left out, keyed so that order does not matter. */
function nftShape(json: string, foreign: string[]): Record<string, unknown> {
  const mine = (text: string) => !foreign.some((f) => text.includes(f));
  const items = z.object({ nftables: z.array(z.record(z.string(), z.unknown())) })
    .parse(JSON.parse(json)).nftables;
  const shape: Record<string, unknown> = {};
  const strip = (o: Record<string, unknown>) => {
    const { handle: _h, family: _f, table: _t, ...rest } = o;
    return rest;
  };
  for (const item of items) {
    const [kind, raw] = Object.entries(item)[0] as [string, Record<string, unknown>];
    if (kind === "metainfo" || kind === "table") continue;
    const o = strip(raw);
    if (!mine(`${kind} ${o.name ?? o.chain}`)) continue;
    if (kind === "rule") {
      const key = `chain ${o.chain} rules`;
      ((shape[key] ??= []) as string[]).push(JSON.stringify({ ...o, chain: undefined }));
    } else if (kind === "set" || kind === "map") {
      // The default/kubernetes Service (no endpoints here) is not the hand-written rules' subject.
      const elem = ((o.elem ?? []) as unknown[]).map((e) => JSON.stringify(e))
        .filter((e) => !e.includes('"172.30.0.1"') && mine(e)).sort();
      shape[`${kind} ${o.name}`] = { ...o, elem };
    } else {
      shape[`${kind} ${o.name}`] = o;
    }
  }
  return shape;
}

/**
 * What kube-proxy's rules for the Service `alpha/db` are in `netns`: nft's table (less what
 * names `foreign`: the other Services' chains, addresses and ports), or iptables' lines.
 */
async function proxyRules(netns: string, mode: ProxyMode, foreign: string[]): Promise<unknown> {
  if (mode === "nftables") {
    return nftShape(
      await inNetns(netns, ["/usr/sbin/nft", "-j", "list", "table", "ip", "kube-proxy"]),
      foreign,
    );
  }
  const nat = await inNetns(netns, ["/usr/sbin/iptables-save", "-t", "nat"]);
  return nat.split("\n").filter((l) => l.includes("alpha/db:pg"));
}

/** Probes TCP `CLUSTER_IP`:5432 from `from` until it answers as `want` (or the time is up). */
async function reachService(from: ClusterPod, want: boolean, timeoutMs = 60_000) {
  let last = "";
  const ok = await poll(async () => {
    const [r] = await from.prober.probe([{ proto: "tcp", addr: CLUSTER_IP, port: 5432 }], 1_000);
    last = r;
    return passed(r) === want ? r : null;
  }, { timeoutMs, intervalMs: 200 });
  assert(ok, `${from.id} -> ${CLUSTER_IP}:5432: ${last}, want ${want ? "through" : "dropped"}`);
  return ok;
}

Deno.test({
  name:
    "the real kube-proxy in a node's namespace, iptables and nftables modes: an enim pod reaches a ClusterIP whose EndpointSlice the real controller-manager made, with its own address, and a backend's NetworkPolicy keeps another pod out",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const api = await RealApi.start({ serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6] });
    const c = await PolicyCluster.start(api);
    const knobs = await globalKnobs();
    let proxy: RealKubeProxy | null = null;
    try {
      c.namespace("alpha", { team: "a" });
      const a = await c.node("node-a", { nodeNic: true, mock: { enis: 5 } });
      const db = await c.pod(a, "node-a", "alpha", "db", { app: "db" }, [
        { name: "pg", containerPort: 5432 },
      ]);
      const web = await c.pod(a, "node-a", "alpha", "web", { app: "web" }, []);
      const job = await c.pod(a, "node-a", "alpha", "job", { app: "job" }, []);
      await c.settle();
      const admin = api.cluster.admin;
      await admin.apply(
        "/api/v1/namespaces/alpha/services/db",
        {
          apiVersion: "v1",
          kind: "Service",
          metadata: { name: "db", namespace: "alpha" },
          spec: {
            clusterIP: CLUSTER_IP,
            selector: { app: "db" },
            ports: [{ name: "pg", port: 5432, targetPort: "pg" }],
          },
        },
        StoredSchema,
        FIELD_MANAGER,
      );
      // The same backend as a NodePort (externalTrafficPolicy Cluster, then Local) and as a
      // ClusterIP with session affinity.
      const more: [string, Record<string, unknown>][] = [
        ["db-np", {
          type: "NodePort",
          ports: [{ name: "pg", port: 5432, targetPort: "pg", nodePort: NODE_PORT }],
        }],
        ["db-local", {
          type: "NodePort",
          externalTrafficPolicy: "Local",
          ports: [{ name: "pg", port: 5432, targetPort: "pg", nodePort: NODE_PORT_LOCAL }],
        }],
        ["db-sticky", {
          clusterIP: STICKY_IP,
          sessionAffinity: "ClientIP",
          ports: [{ name: "pg", port: 5432, targetPort: "pg" }],
        }],
      ];
      for (const [name, spec] of more) {
        await admin.apply(
          `/api/v1/namespaces/alpha/services/${name}`,
          {
            apiVersion: "v1",
            kind: "Service",
            metadata: { name, namespace: "alpha" },
            spec: { selector: { app: "db" }, ...spec },
          },
          StoredSchema,
          FIELD_MANAGER,
        );
      }
      const outside = await a.vpc.host("outside", 60);
      const client = await c.prober(outside.ns.name);
      await t.step(
        "the controller-manager makes the Service's EndpointSlice from the Ready pod",
        async () => {
          const slice = await poll(async () => {
            const l = await admin.get(
              "/apis/discovery.k8s.io/v1/namespaces/alpha/endpointslices",
              EndpointSliceListSchema,
              { labelSelector: "kubernetes.io/service-name=db" },
            );
            const eps = l.items.flatMap((s) => s.endpoints ?? []);
            return eps.some((e) => e.addresses.includes(db.v4) && e.conditions?.ready) ? eps : null;
          }, { timeoutMs: 60_000, intervalMs: 200 });
          assert(slice, "no ready endpoint for alpha/db");
        },
      );
      const port = await c.bridge.into(a.vpc.node.name);
      for (const mode of ["iptables", "nftables"] as ProxyMode[]) {
        proxy = await RealKubeProxy.start(api.cluster, {
          netns: a.vpc.node.name,
          nodeName: "node-a",
          apiPort: port,
          mode,
        });
        const p = proxy;
        await t.step(
          `${mode}: web reaches the ClusterIP and the backend sees web's own address`,
          async () => {
            const r = await reachService(web, true).catch(async (err) => {
              throw new Error(`${err.message}\n${(await p.log()).slice(-4000)}`);
            });
            assertEquals(who(r.slice(5)), `alpha/db ${web.v4}`);
          },
        );
        await t.step(
          `${mode}: the backend reaches itself through its own ClusterIP (hairpin), masqueraded to the node's address`,
          async () => {
            const r = await reachService(db, true);
            assertEquals(who(r.slice(5)), `alpha/db ${a.nic!.ipv4}`);
          },
        );
        await t.step(
          `${mode}: the hand-written rules of tests/support/kube_proxy.ts for this Service are what this kube-proxy wrote`,
          async () => {
            const svc: ServicePort = {
              namespace: "alpha",
              name: "db",
              portName: "pg",
              protocol: "tcp",
              clusterIP: CLUSTER_IP,
              port: 5432,
              endpoints: [{ ip: db.v4, port: 5432 }],
            };
            const o: ProxyOptions = {
              family: 4,
              serviceCidr: SERVICE_CIDRS.ipv4,
              nodeIPs: [a.nic!.ipv4!],
              release: api.cluster.bins.version,
            };
            // The other Services of the test: what names them is left out of the comparison.
            const others = await admin.get(
              "/api/v1/namespaces/alpha/services",
              z.looseObject({
                items: z.array(z.looseObject({
                  metadata: z.looseObject({ name: z.string() }),
                  spec: z.looseObject({ clusterIP: z.string() }),
                })),
              }),
            );
            const foreign = [
              "alpha/db-",
              ...others.items.filter((x) => x.metadata.name !== "db").map((x) =>
                `"${x.spec.clusterIP}"`
              ),
              String(NODE_PORT),
              String(NODE_PORT_LOCAL),
            ];
            const real = await proxyRules(a.vpc.node.name, mode, foreign);
            const scratch = uniqueName("enim-kpx");
            await createNetns(scratch);
            try {
              await installKubeProxy(scratch, mode, [svc], [o]);
              assertEquals(await proxyRules(scratch, mode, foreign), real);
            } finally {
              await deleteNetns(scratch);
            }
          },
        );
        await t.step(`${mode}: its rules are in the node's namespace`, async () => {
          if (mode === "nftables") {
            const tables = await inNetns(a.vpc.node.name, ["/usr/sbin/nft", "list", "tables"]);
            assert(/table ip kube-proxy/.test(tables), tables);
          } else {
            const rules = await inNetns(a.vpc.node.name, ["/usr/sbin/iptables-save", "-t", "nat"]);
            assert(rules.includes("KUBE-SERVICES") && rules.includes(CLUSTER_IP), rules);
          }
        });
        await t.step(
          `${mode}: a NodePort from outside the node reaches the backend, masqueraded to the node's address; with externalTrafficPolicy Local the backend sees the client's own`,
          async () => {
            const node = a.nic!.ipv4!;
            const viaNodePort = async (port: number) => {
              let last = "";
              const ok = await poll(async () => {
                const [r] = await client.probe([{ proto: "tcp", addr: node, port }], 1_000);
                last = r;
                return r.startsWith("open ") ? r : null;
              }, { timeoutMs: 60_000, intervalMs: 200 });
              assert(ok, `${outside.ipv4} -> ${node}:${port}: ${last}`);
              return who(ok.slice(5));
            };
            assertEquals(await viaNodePort(NODE_PORT), `alpha/db ${node}`);
            assertEquals(await viaNodePort(NODE_PORT_LOCAL), `alpha/db ${outside.ipv4}`);
          },
        );
        await t.step(
          `${mode}: a ClusterIP with session affinity ClientIP reaches the backend`,
          async () => {
            let last = "";
            const ok = await poll(async () => {
              const [r] = await web.prober.probe(
                [{ proto: "tcp", addr: STICKY_IP, port: 5432 }],
                1_000,
              );
              last = r;
              return r.startsWith("open ") ? r : null;
            }, { timeoutMs: 60_000, intervalMs: 200 });
            assert(ok, `${web.id} -> ${STICKY_IP}:5432: ${last}`);
            assertEquals(who(ok.slice(5)), `alpha/db ${web.v4}`);
          },
        );
        await t.step(`${mode}: a backend admitting only web keeps job out`, async () => {
          c.put("networkpolicies", {
            metadata: { namespace: "alpha", name: "db" },
            spec: {
              podSelector: { matchLabels: { app: "db" } },
              ingress: [{ from: [{ podSelector: { matchLabels: { app: "web" } } }] }],
            },
          });
          await c.settle();
          await reachService(job, false);
          await reachService(web, true);
          c.remove("networkpolicies", "alpha", "db");
          await c.settle();
          await reachService(job, true);
        });
        await t.step(`${mode}: the machine's global conntrack knobs are as they were`, async () => {
          assertEquals(await globalKnobs(), knobs);
        });
        proxy = null;
        await p.stop();
      }
      await t.step(
        "kube-proxy --cleanup left none of its rules in the node's namespace",
        async () => {
          const tables = await inNetns(a.vpc.node.name, ["/usr/sbin/nft", "list", "tables"]);
          assert(!/kube-proxy/.test(tables), tables);
        },
      );
    } catch (err) {
      for (const n of c.nodes) console.error((await n.agentLog()).slice(-4000));
      throw err;
    } finally {
      await proxy?.stop().catch(() => {});
      await c.close();
    }
  },
});

Deno.test({
  name:
    "a pod's packet to a ClusterIP kube-proxy has not programmed (before its first sync; an unallocated ClusterIP in iptables mode) never leaves by the node's NIC",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const api = await RealApi.start({ serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6] });
    const c = await PolicyCluster.start(api);
    let proxy: RealKubeProxy | null = null;
    try {
      c.namespace("alpha", { team: "a" });
      const a = await c.node("node-a", { nodeNic: true, mock: { enis: 3 } });
      const web = await c.pod(a, "node-a", "alpha", "web", { app: "web" }, []);
      await c.settle();
      const before = await a.vpc.sourceCheckDrops();
      const probe = (addr: string) =>
        web.prober.probe(
          [{ proto: "tcp", addr, port: 5432 }, { proto: "udp", addr, port: 53 }],
          500,
        );
      await t.step("no kube-proxy yet: nothing of the pod leaves by the node's NIC", async () => {
        await probe(CLUSTER_IP);
        assertEquals(await a.vpc.sourceCheckDrops() - before, 0);
      });
      proxy = await RealKubeProxy.start(api.cluster, {
        netns: a.vpc.node.name,
        nodeName: "node-a",
        apiPort: await c.bridge.into(a.vpc.node.name),
        mode: "iptables",
      });
      const p = proxy;
      assert(
        await poll(async () => (await p.rules()).includes("KUBE-SERVICES") || null, {
          timeoutMs: 60_000,
          intervalMs: 200,
        }),
        "kube-proxy wrote no rules",
      );
      await t.step(
        "iptables mode, an unallocated ClusterIP: nothing leaves by the node's NIC",
        async () => {
          await probe("172.30.0.99");
          assertEquals(await a.vpc.sourceCheckDrops() - before, 0);
        },
      );
    } finally {
      await proxy?.stop().catch(() => {});
      await c.close();
    }
  },
});
