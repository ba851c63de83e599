/**
 * The enforcer driven by random sequences (issue 42, point 5): namespaces relabelled,
 * pods created, relabelled, readdressed and deleted, policies written and deleted, the
 * node's addresses changing, ADDs (a second sandbox of a pod too, and ADDs of a pod the
 * cluster does not have), DELs, force deletes of local pods (the Pod object gone, the
 * attachment still there), loads that fail, and agent restarts (the manager's hand-over
 * before or after the caches' sync). It runs over the test API server (the real client
 * and caches) and a device layer whose loads go into a model of nftables
 * (tests/support/nft_model.ts: each load one transaction, refused where the kernel
 * refuses it).
 *
 * After each step, once the enforcer is idle, what the model holds must do what a fresh
 * compile of the same world renders (policy/compile_test.ts shows a fresh compile means
 * what the API says): each local pod's table in its namespace, and the node's table, read
 * as what they do (the reachable rules and the members of the sets they use). A local
 * pod the cluster does not have (force-deleted, or restored without its Pod) keeps its
 * last rules: its tables' rules must stay as they were when it went. During a restart,
 * every load of the node's table must keep each local pod's chains (the last loaded or
 * the new ones, never none). And no promise rejection may go unhandled.
 *
 * The seed and the number of steps: `-- --seed=N --steps=N` after the test file, or the
 * environment's `ENIM_PROPERTY_SEED` and `ENIM_PROPERTY_STEPS` (docs/testing.md).
 */
import fc from "fast-check";
import { assert, assertEquals } from "../../lib/assert.ts";
import { poll } from "../../lib/async.ts";
import { makeTestPki, type TestPki } from "../../tests/support/kube_pki.ts";
import { testKube } from "../../tests/support/enforcer_fixtures.ts";
import { KubeApiServer, type Obj, type Resource } from "../../tests/support/kube_apiserver.ts";
import { makeNamespace, makePod } from "../../tests/support/kube_objects.ts";
import { ModelDeviceLayer, type TableView } from "../../tests/support/nft_model.ts";
import { NODE } from "../../netns/fake.ts";
import { NamespaceSchema, NetworkPolicySchema, PodSchema } from "../../kube/objects.ts";
import { ApiError } from "../../api/schema.ts";
import {
  DEFAULT_JUDGED_MARK,
  type NodePod,
  nodeRuleset,
  podRuleset,
  PolicyEngine,
} from "../../policy/mod.ts";
import type { RestoredPolicyPod } from "../../manager/types.ts";
import { PolicyEnforcer } from "./enforcer.ts";

/** `--name=value` after the test file's `--`, else the environment's `ENIM_PROPERTY_<NAME>`. */
function knob(name: string, fallback: number): number {
  const arg = Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
  const raw = arg ?? Deno.env.get(`ENIM_PROPERTY_${name.toUpperCase()}`);
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isSafeInteger(n)) throw new Error(`Invalid --${name} "${raw}": expected an integer`);
  return n;
}

const SEED = knob("seed", 42);
const STEPS = knob("steps", 150);

const NAMESPACES = ["alpha", "beta"];
const POD_NAMES = NAMESPACES.flatMap((ns) => ["p0", "p1", "p2"].map((n) => `${ns}/${n}`));
const NODE_ADDRESSES = [["10.0.0.254"], ["10.0.0.254", "10.0.0.253"], ["10.0.0.252", "fd00::fe"]];
const LOCAL_POOL = Array.from({ length: 10 }, (_, i) => `10.1.0.${i + 1}`);
const REMOTE_POOL = Array.from({ length: 6 }, (_, i) => `10.2.0.${i + 1}`);
const PORTS = [
  { name: "http", containerPort: 8080, protocol: "TCP" },
  { name: "dns", containerPort: 53, protocol: "UDP" },
];

// ---- the steps ----

const labelValue = fc.option(fc.constantFrom("web", "db", "front"), { nil: undefined });
const selector = fc.record({
  matchLabels: fc.option(
    fc.dictionary(fc.constantFrom("app", "tier"), fc.constantFrom("web", "db", "front"), {
      maxKeys: 1,
    }),
    { nil: undefined },
  ),
}, { requiredKeys: [] });
const nsSelector = fc.record({
  matchLabels: fc.option(
    fc.dictionary(fc.constantFrom("team", "env"), fc.constantFrom("a", "b", "prod"), {
      maxKeys: 1,
    }),
    { nil: undefined },
  ),
}, { requiredKeys: [] });
const peer = fc.oneof(
  fc.record({ podSelector: selector }),
  fc.record({ namespaceSelector: nsSelector }),
  fc.record({ namespaceSelector: nsSelector, podSelector: selector }),
  fc.record({ ipBlock: fc.constantFrom({ cidr: "10.1.0.0/28", except: ["10.1.0.4/30"] }) }),
);
const port = fc.constantFrom(
  { port: 8080 },
  { port: "http" },
  { protocol: "UDP", port: "dns" },
  { port: 5000, endPort: 9000 },
);
const rule = fc.record({
  peers: fc.option(fc.array(peer, { maxLength: 2 }), { nil: undefined }),
  ports: fc.option(fc.array(port, { maxLength: 2 }), { nil: undefined }),
});
const policySpec = fc.record({
  podSelector: selector,
  ingress: fc.option(fc.array(rule, { maxLength: 2 }), { nil: undefined }),
  egress: fc.option(fc.array(rule, { maxLength: 1 }), { nil: undefined }),
  policyTypes: fc.option(fc.constantFrom(["Ingress"], ["Egress"], ["Ingress", "Egress"]), {
    nil: undefined,
  }),
});

const step = fc.oneof(
  {
    arbitrary: fc.record({
      kind: fc.constant("ns" as const),
      ns: fc.constantFrom(...NAMESPACES),
      key: fc.constantFrom("team", "env"),
      value: fc.option(fc.constantFrom("a", "b", "prod"), { nil: undefined }),
    }),
    weight: 2,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant("pod" as const),
      pod: fc.constantFrom(...POD_NAMES),
      key: fc.constantFrom("app", "tier"),
      value: labelValue,
      ip: fc.nat(REMOTE_POOL.length - 1),
    }),
    weight: 4,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant("podGone" as const),
      pod: fc.constantFrom(...POD_NAMES),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant("policy" as const),
      ns: fc.constantFrom(...NAMESPACES),
      name: fc.constantFrom("np0", "np1"),
      spec: policySpec,
    }),
    weight: 3,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant("policyGone" as const),
      ns: fc.constantFrom(...NAMESPACES),
      name: fc.constantFrom("np0", "np1"),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant("node" as const),
      which: fc.nat(NODE_ADDRESSES.length - 1),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant("add" as const),
      pod: fc.constantFrom(...POD_NAMES),
      withObject: fc.boolean(),
    }),
    weight: 4,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant("del" as const),
      which: fc.nat(),
      keepObject: fc.boolean(),
    }),
    weight: 3,
  },
  { arbitrary: fc.record({ kind: fc.constant("force" as const), which: fc.nat() }), weight: 1 },
  {
    arbitrary: fc.record({
      kind: fc.constant("restart" as const),
      lateHandOver: fc.boolean(),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant("fail" as const),
      times: fc.integer({ min: 1, max: 3 }),
    }),
    weight: 1,
  },
);
type Step = typeof step extends fc.Arbitrary<infer T> ? T : never;

// ---- the world ----

/** Each local attachment's table (a frozen pod's: its chains alone), and the node's. */
interface Tables {
  pods: Map<string, TableView["chains"] | TableView>;
  node: TableView;
}

/** A local attachment, as the manager keeps it. */
interface Local {
  key: string;
  pod: string;
  ip: string;
  end: string;
  netns: string;
  seq: number;
}

/** What a local pod's tables held when the cluster lost it (its rules stay). */
interface Frozen {
  /** Per attachment key: its pod table's chains. */
  pod: Map<string, Record<string, string[]>>;
  /** Per node end: its node chains' rules. */
  node: Map<string, string[][]>;
}

class World implements AsyncDisposable {
  readonly devices = new ModelDeviceLayer();
  readonly objects = {
    pods: new Map<string, Obj>(),
    namespaces: new Map<string, Obj>(),
    networkpolicies: new Map<string, Obj>(),
  };
  readonly nsLabels: Record<string, Record<string, string>> = {
    alpha: { team: "a" },
    beta: { team: "b" },
  };
  readonly locals: Local[] = [];
  /** Pods with attachments the cluster does not have. */
  readonly frozen = new Map<string, Frozen>();
  readonly lastRv = new Map<Resource, number>();
  enforcer!: PolicyEnforcer;
  #seq = 0;
  #ends = 0;

  private constructor(readonly pki: TestPki, readonly server: KubeApiServer) {}

  static async start(): Promise<World> {
    const pki = await makeTestPki();
    const w = new World(pki, KubeApiServer.start({ pki }));
    w.devices.nodeAddrs = { addresses: NODE_ADDRESSES[0], primary: {} };
    for (const ns of NAMESPACES) w.put("namespaces", makeNamespace(ns, w.nsLabels[ns]));
    w.enforcer = w.#enforcer();
    w.enforcer.restore([]);
    assert(await w.enforcer.waitSynced(10_000), "the first enforcer synced");
    return w;
  }

  #enforcer(): PolicyEnforcer {
    return new PolicyEnforcer({
      kube: testKube(this.server),
      devices: this.devices,
      syncWaitMs: 5_000,
      getPodTimeoutMs: 2_000,
      nodeAddressesEveryMs: 10,
      retry: { initialMs: 5, maxMs: 40 },
    });
  }

  put(resource: Resource, obj: Obj): void {
    const stored = this.server.put(resource, obj);
    const key = `${obj.metadata.namespace ?? ""}/${obj.metadata.name}`;
    this.objects[resource].set(key, stored);
    this.lastRv.set(resource, Number(stored.metadata.resourceVersion));
  }

  remove(resource: Resource, key: string): void {
    const [ns, name] = key.split("/");
    if (this.server.remove(resource, ns || undefined, name)) {
      this.lastRv.set(resource, Number(this.server.resourceVersion));
    }
    this.objects[resource].delete(key);
  }

  podObject(pod: string, labels: Record<string, string>, ip?: string, nodeName = "n2"): Obj {
    const [namespace, name] = pod.split("/");
    return makePod({ namespace, name, labels, nodeName, ip, ports: PORTS });
  }

  labelsOf(pod: string): Record<string, string> {
    return { ...(this.objects.pods.get(`${pod}`)?.metadata.labels ?? { app: "web" }) };
  }

  newestOf(pod: string): Local | undefined {
    return this.locals.filter((l) => l.pod === pod).sort((a, b) => b.seq - a.seq)[0];
  }

  restored(): RestoredPolicyPod[] {
    return this.locals.map((l) => ({
      pod: l.pod,
      key: l.key,
      addresses: { ipv4: l.ip },
      eniIfName: "eth0",
      nodeIfName: l.end,
      netns: l.netns,
    }));
  }

  /** The pods' tables and node chains of `pod` as they are now (it is losing its Pod). */
  freeze(pod: string): void {
    if (this.frozen.has(pod)) return;
    const f: Frozen = { pod: new Map(), node: new Map() };
    for (const l of this.locals.filter((x) => x.pod === pod)) {
      f.pod.set(l.key, this.devices.model.view(l.netns).chains);
      f.node.set(l.end, this.nodeChains(l.end));
    }
    this.frozen.set(pod, f);
  }

  nodeChains(end: string): string[][] {
    const links = this.devices.model.nodeLinks(NODE, end);
    return [links.ingress, links.egress].map((c) => (c && this.devices.model.rules(NODE, c)) || []);
  }

  /** Applies one step; what it did, for the failure message. */
  async apply(s: Step): Promise<string> {
    switch (s.kind) {
      case "ns": {
        const labels = this.nsLabels[s.ns];
        if (s.value === undefined) delete labels[s.key];
        else labels[s.key] = s.value;
        this.put("namespaces", makeNamespace(s.ns, labels));
        return `namespace ${s.ns} ${JSON.stringify(labels)}`;
      }
      case "pod": {
        const had = this.objects.pods.get(s.pod);
        const labels = this.labelsOf(s.pod);
        if (s.value === undefined) delete labels[s.key];
        else labels[s.key] = s.value;
        const local = this.newestOf(s.pod);
        if (local) {
          // A local pod: its labels change, its address is enim's (the newest attachment's).
          this.put("pods", this.podObject(s.pod, labels, local.ip, "n1"));
          this.frozen.delete(s.pod);
          return `local pod ${s.pod} ${JSON.stringify(labels)}${
            had ? "" : " (back in the cluster)"
          }`;
        }
        const ip = REMOTE_POOL[s.ip];
        this.put("pods", this.podObject(s.pod, labels, ip));
        return `remote pod ${s.pod} ${JSON.stringify(labels)} ${ip}`;
      }
      case "podGone": {
        if (this.newestOf(s.pod) || !this.objects.pods.has(s.pod)) return "nothing";
        this.remove("pods", s.pod);
        return `remote pod ${s.pod} deleted`;
      }
      case "policy": {
        const spec = {
          podSelector: s.spec.podSelector,
          ...(s.spec.ingress
            ? { ingress: s.spec.ingress.map((r) => ({ from: r.peers, ports: r.ports })) }
            : {}),
          ...(s.spec.egress
            ? { egress: s.spec.egress.map((r) => ({ to: r.peers, ports: r.ports })) }
            : {}),
          ...(s.spec.policyTypes ? { policyTypes: s.spec.policyTypes } : {}),
        };
        this.put("networkpolicies", { metadata: { namespace: s.ns, name: s.name }, spec });
        return `policy ${s.ns}/${s.name} ${JSON.stringify(spec)}`;
      }
      case "policyGone":
        this.remove("networkpolicies", `${s.ns}/${s.name}`);
        return `policy ${s.ns}/${s.name} deleted`;
      case "node":
        this.devices.nodeAddrs = { addresses: NODE_ADDRESSES[s.which], primary: {} };
        return `node addresses ${NODE_ADDRESSES[s.which]}`;
      case "add":
        return await this.#add(s.pod, s.withObject);
      case "del": {
        if (this.locals.length === 0) return "nothing";
        const l = this.locals[s.which % this.locals.length];
        await this.enforcer.removed(l.key);
        this.locals.splice(this.locals.indexOf(l), 1);
        this.devices.deleteNetns(l.netns);
        this.devices.model.tables.delete(l.netns);
        const next = this.newestOf(l.pod);
        if (!next) {
          this.frozen.delete(l.pod);
          if (this.objects.pods.has(l.pod)) {
            // The pod goes, or waits for its next sandbox without an address.
            if (s.keepObject) {
              this.put("pods", this.podObject(l.pod, this.labelsOf(l.pod), undefined, "n1"));
            } else this.remove("pods", l.pod);
          }
        } else if (this.objects.pods.has(l.pod)) {
          this.put("pods", this.podObject(l.pod, this.labelsOf(l.pod), next.ip, "n1"));
        }
        return `DEL ${l.key} (${l.pod} ${l.ip})`;
      }
      case "force": {
        const pods = [...new Set(this.locals.map((l) => l.pod))].filter((p) =>
          this.objects.pods.has(p)
        );
        if (pods.length === 0) return "nothing";
        const pod = pods[s.which % pods.length];
        this.freeze(pod);
        this.remove("pods", pod);
        return `force-deleted ${pod}`;
      }
      case "restart": {
        await this.enforcer.close();
        const must = new Map(this.locals.map((l) => [l.end, this.nodeChains(l.end)]));
        const lost: string[] = [];
        this.devices.onLoad = (where) => {
          if (where !== NODE) return;
          for (const [end, had] of must) {
            const now = this.nodeChains(end);
            if (had[0].length > 0 && now[0].length === 0) lost.push(`${end} ingress`);
            if (had[1].length > 0 && now[1].length === 0) lost.push(`${end} egress`);
          }
        };
        this.enforcer = this.#enforcer();
        // What reconcile finds in the state: before the caches have synced, or after.
        if (s.lateHandOver) {
          await poll(
            () => Promise.resolve(this.enforcer.status().caches.every((c) => c.synced) || null),
            { timeoutMs: 10_000, intervalMs: 5 },
          );
        }
        this.enforcer.restore(this.restored());
        assert(await this.enforcer.waitSynced(10_000), "the restarted enforcer synced");
        assert(await this.enforcer.idle(10_000), "the restarted enforcer settled");
        this.devices.onLoad = null;
        // Pods the cluster does not have keep their rules (the restart found them so).
        for (const l of this.locals) if (!this.objects.pods.has(l.pod)) this.freeze(l.pod);
        assertEquals(lost, [], "a node load during the restart left a pod without its chains");
        return `restart (hand-over ${s.lateHandOver ? "after" : "before"} the sync)`;
      }
      case "fail":
        this.devices.failOn("nft", undefined, s.times);
        return `the next ${s.times} loads fail`;
    }
  }

  async #add(pod: string, withObject: boolean): Promise<string> {
    const used = new Set(this.locals.map((l) => l.ip));
    const ip = LOCAL_POOL.find((a) => !used.has(a));
    if (!ip) return "nothing (no free address)";
    const present = this.objects.pods.has(pod);
    if (!present && withObject) {
      // kubelet's Pod first: a pod the cluster had lost is back, whatever the ADD answers.
      this.put("pods", this.podObject(pod, this.labelsOf(pod), undefined, "n1"));
      this.frozen.delete(pod);
    }
    const end = `enimh${++this.#ends}`;
    const key = `c-${end}/eth0`;
    const netns = `/run/netns/${end}`;
    this.devices.addNetns(netns);
    const call = {
      pod,
      key,
      addresses: { ipv4: ip },
      eniIfName: "eth0",
      nodeIfName: end,
      nodeAddresses: this.devices.nodeAddrs.addresses,
    };
    try {
      const r = await this.enforcer.prepare(call);
      assert(r, "policy is on");
      const text = await r.podRuleset();
      // The plug's load, in the pod's namespace.
      if (text !== "") this.devices.model.apply(netns, text);
      await this.enforcer.committed(key, netns);
    } catch (err) {
      this.devices.deleteNetns(netns);
      this.devices.model.tables.delete(netns);
      if (!(err instanceof ApiError)) throw err;
      await this.enforcer.removed(key);
      if (!present && !withObject) {
        assertEquals(err.code, "policy_unavailable", err.message);
        return `ADD of ${pod} without its Pod: ${err.code}`;
      }
      // A load that failed (`fail`): the ADD fails, and is rolled back.
      assertEquals(err.code, "device_error", err.message);
      return `ADD of ${pod} failed: ${err.message}`;
    }
    if (!present && !withObject) throw new Error(`The ADD of ${pod}, not in the cluster, answered`);
    const l: Local = { key, pod, ip, end, netns, seq: ++this.#seq };
    this.locals.push(l);
    // kubelet writes the address the ADD answered.
    this.put("pods", this.podObject(pod, this.labelsOf(pod), ip, "n1"));
    this.frozen.delete(pod);
    return `ADD ${key} (${pod} ${ip})`;
  }

  /** What the tables must do now: each local pod's, and the node's. */
  expected(): Tables {
    const engine = new PolicyEngine({
      pods: () => [...this.objects.pods.values()].map((o) => PodSchema.parse(o)),
      namespaces: () => [...this.objects.namespaces.values()].map((o) => NamespaceSchema.parse(o)),
      networkPolicies: () =>
        [...this.objects.networkpolicies.values()].map((o) => NetworkPolicySchema.parse(o)),
    }, { nodeAddresses: this.devices.nodeAddrs.addresses });
    const model = new ModelDeviceLayer().model;
    const pods = new Map<string, TableView["chains"] | TableView>();
    const nodePods: NodePod[] = [];
    const locals = [...this.locals].sort((a, b) => a.seq - b.seq);
    // Every local pod first, with enim's addresses: a pod's sets hold the others'.
    for (const l of locals) {
      if (this.frozen.has(l.pod)) continue;
      const [namespace, name] = l.pod.split("/");
      engine.addLocal({ namespace, name, ips: [this.newestOf(l.pod)!.ip] });
    }
    for (const l of locals) {
      const frozen = this.frozen.get(l.pod);
      if (frozen) {
        pods.set(l.key, frozen.pod.get(l.key) ?? {});
        continue;
      }
      const [namespace, name] = l.pod.split("/");
      const c = engine.compiled(namespace, name)!;
      if (c.ingress.isolated || c.egress.isolated) {
        model.apply(l.key, podRuleset(c, { eni: "eth0" }));
        nodePods.push({ nodeEnd: l.end, policy: c });
      }
      pods.set(l.key, model.view(l.key));
    }
    const split = { ipv4: [] as string[], ipv6: [] as string[] };
    for (const a of this.devices.nodeAddrs.addresses) {
      (a.includes(":") ? split.ipv6 : split.ipv4).push(a);
    }
    model.apply(
      NODE,
      nodeRuleset(nodePods, { node: split, judgedMark: DEFAULT_JUDGED_MARK }),
    );
    return { pods, node: model.view(NODE) };
  }

  /** What the tables do now, as {@linkcode expected} reads them. */
  loaded(): Tables {
    const pods = new Map<string, TableView["chains"] | TableView>();
    for (const l of this.locals) {
      const v = this.devices.model.view(l.netns);
      pods.set(l.key, this.frozen.has(l.pod) ? v.chains : v);
    }
    const kept = this.locals.filter((l) => this.frozen.has(l.pod)).map((l) => l.end);
    return { pods, node: this.devices.model.view(NODE, { exclude: kept }) };
  }

  /** The frozen pods' node chains now and as they were. */
  frozenChains(): { now: Record<string, string[][]>; then: Record<string, string[][]> } {
    const now: Record<string, string[][]> = {}, then: Record<string, string[][]> = {};
    for (const l of this.locals) {
      const f = this.frozen.get(l.pod);
      if (!f) continue;
      now[l.end] = this.nodeChains(l.end);
      then[l.end] = f.node.get(l.end) ?? [[], []];
    }
    return { now, then };
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.enforcer.close();
    await this.server.close();
    await Deno.remove(this.pki.dir, { recursive: true });
  }
}

/** JSON with every object's keys sorted: equal text, equal value. */
function canonical(v: unknown): string {
  return JSON.stringify(
    v,
    (_k, x) =>
      x && typeof x === "object" && !Array.isArray(x)
        ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0))
        : x,
  );
}

/** Whether the enforcer's caches have every write of the world (its watch has brought them). */
function caughtUp(w: World): boolean {
  const s = w.enforcer.status();
  return [...w.lastRv].every(([resource, rv]) => {
    const c = s.caches.find((x) => x.resource === resource);
    return Number(c?.enforcedResourceVersion ?? 0) >= rv;
  });
}

Deno.test({
  name:
    `the enforcer's tables do what a fresh compile of the world says after each of ${STEPS} random steps (seed ${SEED}): ADD, DEL, force deletes, restarts, node addresses, failed loads; nothing unhandled`,
  // The enforcer's timers (the node's addresses every 10 ms) run between the steps.
  sanitizeOps: true,
  sanitizeResources: true,
  async fn() {
    const unhandled: unknown[] = [];
    const onUnhandled = (e: PromiseRejectionEvent) => {
      e.preventDefault();
      unhandled.push(e.reason);
    };
    globalThis.addEventListener("unhandledrejection", onUnhandled);
    const steps = fc.sample(step, { seed: SEED, numRuns: STEPS });
    const started = performance.now();
    const done: string[] = [];
    try {
      await using w = await World.start();
      let slowest = { ms: 0, step: "" };
      for (const [i, s] of steps.entries()) {
        const t0 = performance.now();
        const what = await w.apply(s);
        done.push(`${i}: ${what}`);
        let last:
          | { want: Tables; got: Tables; frozen: ReturnType<World["frozenChains"]> }
          | undefined;
        const ok = await poll(async () => {
          if (!caughtUp(w) || !(await w.enforcer.idle(2_000))) return null;
          const want = w.expected(), got = w.loaded();
          const frozen = w.frozenChains();
          last = { want, got, frozen };
          const same = canonical([...want.pods]) === canonical([...got.pods]) &&
            canonical(want.node) === canonical(got.node) &&
            canonical(frozen.now) === canonical(frozen.then);
          return same || null;
        }, { timeoutMs: 15_000, intervalMs: 5 });
        if (!ok && !last) {
          throw new Error(
            `after step ${i} (seed ${SEED}) the enforcer did not settle: ${
              caughtUp(w) ? "idle() stayed false" : "its caches lag"
            }; the last steps:\n${done.slice(-12).join("\n")}\nstatus: ${
              JSON.stringify(w.enforcer.status())
            }`,
          );
        }
        if (!ok) {
          const { want, got, frozen } = last!;
          const tail = done.slice(-12).join("\n");
          assertEquals(
            { pods: Object.fromEntries(got.pods), node: got.node, frozen: frozen.now },
            { pods: Object.fromEntries(want.pods), node: want.node, frozen: frozen.then },
            `after step ${i} (seed ${SEED}), the last steps:\n${tail}\nrefused loads: ${
              JSON.stringify(w.devices.refused.slice(-3))
            }`,
          );
        }
        assertEquals(unhandled, [], `unhandled rejections after step ${i}: ${done.at(-1)}`);
        const ms = performance.now() - t0;
        if (ms > slowest.ms) slowest = { ms, step: done.at(-1)! };
      }
      const s = w.enforcer.status();
      console.log(
        `${STEPS} steps (seed ${SEED}) in ${
          ((performance.now() - started) / 1000).toFixed(1)
        } s: ` +
          `${w.locals.length} local attachments, ${s.loadFailures} failed loads, ${w.devices.refused.length} refused by the model; ` +
          `the slowest step ${Math.round(slowest.ms)} ms (${slowest.step})`,
      );
    } finally {
      globalThis.removeEventListener("unhandledrejection", onUnhandled);
    }
    assertEquals(unhandled, []);
  },
});
