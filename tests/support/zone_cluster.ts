/**
 * Zone-wide sticky pods on several simulated nodes (issue 26): the harness the
 * two-node end-to-end test (`tests/bce_sticky_zone_e2e_test.ts`) and the zone
 * mode of `deno task stress` (`tests/stress/_zone.ts`) share.
 *
 * Nodes A and B are two node namespaces on one simulated VPC, each with its own
 * agent on the BCE provider (production permission set), their default profile's
 * sticky pods kept zone-wide with no node hold (a DEL parks at once). One fake
 * BCE cloud (`bce_fake_main.ts`) serves both: it runs in A's namespace, and B's
 * agent reaches it at 127.0.0.1 of its own namespace through a
 * {@linkcode LoopbackRelay}. An ENI the fake attaches to an instance appears as a
 * veth device in that instance's node, on the VPC bridge.
 *
 * With `otherZone`, a third node C joins the VPC as an instance of another zone
 * (`cn-bj-b`, with a subnet of that zone for its default profile): the ENI and the
 * instance must have their subnets in the same availability zone (BCE reference
 * §1.2, attach), which the fake enforces too.
 *
 * @module
 */
import { type CniOutcome, SimulatedNode } from "./node.ts";
import { FAKE_BCE_AGENT_TIMEOUTS, FakeBceProcess, type FakeBceState } from "./bce_fake_main.ts";
import { LoopbackRelay } from "./loopback_relay.ts";
import type { NetnsHandle } from "./vpc.ts";

/** The zone's subnet (nodes A and B). */
export const ZONE_SUBNET = "10.97.0.0/24";
/** Its gateway on the VPC bridge. */
export const ZONE_GATEWAY = "10.97.0.1";
/** The zone of nodes A and B, and of their subnet. */
export const ZONE_A = "cn-bj-a";
/** The zone of node C (`otherZone`) and of its subnet. */
export const ZONE_B = "cn-bj-b";
/** Node C's subnet, in {@linkcode ZONE_B}. */
export const OTHER_ZONE_SUBNET = "10.96.200.0/24";
/** The instances of nodes A, B and C. */
export const INSTANCES = { A: "i-stickya01", B: "i-stickyb01", C: "i-stickyc01" } as const;
const AK = "AKIDenimSticky0000001";
/** The fake's secret key: it must never appear in any log line. */
export const ZONE_SECRET = "SK-sticky-secret-DO-NOT-LOG-9a8b7c6d";

/** Tears one thing down. */
type Closer = () => Promise<unknown>;

/** One node of the cluster. */
export interface ZoneNode {
  label: "A" | "B" | "C";
  node: SimulatedNode;
  instanceId: string;
  zone: string;
}

/** Options of {@linkcode ZoneCluster.start}. */
export interface ZoneClusterOptions {
  /** The agents' log level (default `debug`). */
  logLevel?: "debug" | "info";
  /** Provider timeouts of every node, over the defaults. */
  timeouts?: Record<string, number>;
  /** Provider timeouts of node B only (over `timeouts`). */
  timeoutsB?: Record<string, number>;
  /** The sticky hold (`sticky.holdSeconds` of the agents; default 3600). */
  holdSeconds?: number;
  /** Add node C, an instance of another zone. */
  otherZone?: boolean;
  /** The GC interval of the agents (default 1 s). */
  gcIntervalSeconds?: number;
}

/** The provider settings of a node (endpoint and metadata: set once the fake listens). */
function bceSettings(timeouts: Record<string, number>, subnetId?: string) {
  return {
    credentialsFile: "/run/enim/bce-credentials.json",
    clusterId: "e2e",
    securityGroupIds: ["g-sticky01"],
    warmPool: { minIdle: 0, maxIdle: 4 },
    maxEnisPerNode: 8,
    sticky: { scope: "zone", nodeHoldSeconds: 0 },
    ...(subnetId ? { subnetId } : {}),
    timeouts: {
      ...FAKE_BCE_AGENT_TIMEOUTS,
      detachMs: 20_000,
      poolIntervalMs: 300,
      idleIntervalMs: 1000,
      minPassGapMs: 50,
      ...timeouts,
    },
  };
}

/** The CNI_ARGS of pod `default/<name>` (sticky unless said otherwise). */
export function podArgs(name: string, sticky = true): string {
  return `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1${
    sticky ? ";ENIM_STICKY=true" : ""
  }`;
}

/** Waits until `check` holds (polling every 100 ms), failing with `what`. */
export async function waitFor(
  what: string,
  check: () => Promise<boolean>,
  ms = 30_000,
): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** What a CNI call printed, for a failed assertion's message. */
export function said(r: CniOutcome): string {
  return `exit ${r.code}: ${r.stdout}${r.stderr}`;
}

/** The successful attaches of an ENI the fake answered. */
export function attaches(state: FakeBceState, eniId: string): FakeBceState["requests"] {
  return state.requests.filter((r) =>
    r.method === "PUT" && r.path === `/v1/eni/${eniId}` &&
    "attach" in r.query && r.status === 200
  );
}

/** The sticky-zone events of `event` a node's agent has counted (its metrics). */
export async function stickyEvents(node: SimulatedNode, event: string): Promise<number> {
  const text = await node.client.metrics();
  return [...text.matchAll(/^enim_sticky_zone_events_total\{([^}]*)\} (\d+)$/gm)]
    .filter((m) => m[1].includes(`event="${event}"`))
    .reduce((n, m) => n + Number(m[2]), 0);
}

/** Two (or three) nodes on one simulated VPC and one fake BCE cloud (see the module doc). */
export class ZoneCluster implements AsyncDisposable {
  readonly fake: FakeBceProcess;
  /** Every node, A first. */
  readonly nodes: ZoneNode[];
  readonly #closers: Closer[];

  private constructor(fake: FakeBceProcess, nodes: ZoneNode[], closers: Closer[]) {
    this.fake = fake;
    this.nodes = nodes;
    this.#closers = closers;
  }

  /** Node A (the fake runs in its namespace). */
  get a(): SimulatedNode {
    return this.nodes[0].node;
  }

  /** Node B. */
  get b(): SimulatedNode {
    return this.nodes[1].node;
  }

  /** Node C (`otherZone`), in another zone. */
  get c(): SimulatedNode {
    const c = this.nodes[2];
    if (!c) throw new Error("The cluster was started without otherZone: it has no node C");
    return c.node;
  }

  /** The nodes of the sticky zone (A and B). */
  get zoneNodes(): ZoneNode[] {
    return this.nodes.filter((n) => n.zone === ZONE_A);
  }

  /** Builds the nodes, starts the fake, the relays and the agents; tears down all on failure. */
  static async start(opts: ZoneClusterOptions = {}): Promise<ZoneCluster> {
    const closers: Closer[] = [];
    const closeAll = async () => {
      for (const c of closers.reverse()) await c().catch(() => {});
    };
    try {
      const startNode = async (
        joinVpc: SimulatedNode | null,
        timeouts: Record<string, number>,
        subnetId?: string,
      ) => {
        const node = await SimulatedNode.start({
          subnets: { ipv4: ZONE_SUBNET },
          startAgent: false,
          deviceSimulator: false,
          logLevel: opts.logLevel ?? "debug",
          gc: { intervalSeconds: opts.gcIntervalSeconds ?? 1, graceSeconds: 0 },
          extra: { sticky: { holdSeconds: opts.holdSeconds ?? 3600 } },
          ...(joinVpc ? { joinVpc: joinVpc.vpc } : {}),
          provider: { name: "bce", settings: bceSettings(timeouts, subnetId) },
        });
        closers.push(() => node.close());
        const path = node.sandbox.host("bce-credentials.json");
        await Deno.writeTextFile(
          path,
          JSON.stringify({ accessKeyId: AK, secretAccessKey: ZONE_SECRET }),
          { mode: 0o600 },
        );
        await Deno.chmod(path, 0o600);
        return node;
      };
      const a = await startNode(null, opts.timeouts ?? {});
      const b = await startNode(a, { ...opts.timeouts, ...opts.timeoutsB });
      const c = opts.otherZone ? await startNode(a, opts.timeouts ?? {}, "sbn-stickyc01") : null;
      const nodes: ZoneNode[] = [
        { label: "A", node: a, instanceId: INSTANCES.A, zone: ZONE_A },
        { label: "B", node: b, instanceId: INSTANCES.B, zone: ZONE_A },
        ...(c ? [{ label: "C" as const, node: c, instanceId: INSTANCES.C, zone: ZONE_B }] : []),
      ];
      const socket = await Deno.makeTempFile({ prefix: "enim-sticky-fake-", suffix: ".sock" });
      await Deno.remove(socket);
      closers.push(() => Deno.remove(socket).catch(() => {}));
      const fake = await FakeBceProcess.start({
        nodeNetns: a.vpc.node.name,
        vpcNetns: a.vpc.vpc.name,
        bridge: a.vpc.bridge,
        subnet: { subnetId: "sbn-sticky01", cidr: ZONE_SUBNET, zoneName: ZONE_A },
        ...(c
          ? {
            otherSubnets: [{
              subnetId: "sbn-stickyc01",
              cidr: OTHER_ZONE_SUBNET,
              zoneName: ZONE_B,
            }],
          }
          : {}),
        securityGroups: ["g-sticky01"],
        instanceId: INSTANCES.A,
        zoneName: ZONE_A,
        eniQuota: 12,
        otherNodes: nodes.slice(1).map((n) => ({
          instanceId: n.instanceId,
          nodeNetns: n.node.vpc.node.name,
          eniQuota: 12,
          zoneName: n.zone,
        })),
        unixSocket: socket,
        credentials: [{ accessKeyId: AK, secretAccessKey: ZONE_SECRET }],
      });
      closers.push(() => fake.close());
      for (const n of nodes) {
        let url = fake.url;
        if (n.label !== "A") {
          const relay = await LoopbackRelay.start(n.node.vpc.node.name, socket);
          closers.push(() => relay.close());
          url = `http://127.0.0.1:${relay.port}`;
        }
        await n.node.editConfig((cfg) => {
          const bce = (cfg.provider as { bce: Record<string, unknown> }).bce;
          bce.endpoint = url;
          bce.metadataUrl = `${url}/1.0/meta-data/`;
          bce.instanceId = n.instanceId;
        });
      }
      const cluster = new ZoneCluster(fake, nodes, closers);
      for (const n of nodes) {
        try {
          await n.node.startAgent();
        } catch (err) {
          throw new Error(
            `${(err as Error).message}\n${n.label}:\n${await n.node.agentLog()}\nfake:\n${
              fake.output().join("\n")
            }`,
          );
        }
      }
      return cluster;
    } catch (err) {
      await closeAll();
      throw err;
    }
  }

  /** The instance of one of the cluster's nodes. */
  instanceOf(node: SimulatedNode): string {
    const n = this.nodes.find((x) => x.node === node);
    if (!n) throw new Error("Not a node of this cluster");
    return n.instanceId;
  }

  /** ADD of pod `default/<name>` (sticky unless said otherwise) into `p` on `node`. */
  add(
    node: SimulatedNode,
    p: NetnsHandle,
    containerId: string,
    name: string,
    sticky = true,
  ): Promise<CniOutcome> {
    return this.#cni("ADD", node, p, containerId, name, sticky);
  }

  /** DEL of pod `default/<name>` in `p` on `node`. */
  del(
    node: SimulatedNode,
    p: NetnsHandle,
    containerId: string,
    name: string,
    sticky = true,
  ): Promise<CniOutcome> {
    return this.#cni("DEL", node, p, containerId, name, sticky);
  }

  #cni(
    verb: "ADD" | "DEL",
    node: SimulatedNode,
    p: NetnsHandle,
    containerId: string,
    name: string,
    sticky: boolean,
  ): Promise<CniOutcome> {
    return node.cni(verb, {
      containerId,
      ifName: "eth0",
      netns: p.path,
      args: podArgs(name, sticky),
      config: node.netconf(),
    });
  }

  /** The fake's ENI `eniId` (undefined once deleted). */
  async cloudEni(eniId: string): Promise<FakeBceState["enis"][number] | undefined> {
    return (await this.fake.state()).enis.find((e) => e.eniId === eniId);
  }

  /** The ENI the agent of `node` records for container `containerId`. */
  async eniOfPod(node: SimulatedNode, containerId: string): Promise<string> {
    const e = (await node.client.status()).enis.find((x) => x.owner?.containerId === containerId);
    if (!e) throw new Error(`No ENI recorded for container "${containerId}"`);
    return e.id;
  }

  /**
   * Waits until the cloud and the agents are quiet: no ENI attaching or detaching,
   * no device of a finished attach or detach still to be plugged or unplugged (the
   * fake answers the new status before its device changes), no park or claim in
   * flight on any node.
   */
  settle(ms = 30_000): Promise<void> {
    return waitFor("the cloud and the agents to settle", async () => {
      const st = await this.fake.state();
      if (st.enis.some((e) => e.status === "attaching" || e.status === "detaching")) return false;
      if (st.devicesPending > 0) return false;
      for (const n of this.nodes) {
        if (n.node.agentPid === null) continue;
        const s = await n.node.client.status();
        if (s.sticky.parked.some((p) => p.state === "parking") || s.providerDetails.claiming) {
          return false;
        }
      }
      return true;
    }, ms);
  }

  /** Stops the agents, the relays, the fake and the nodes (everything it created). */
  async close(): Promise<void> {
    for (const c of this.#closers.splice(0).reverse()) await c().catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
