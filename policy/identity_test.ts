/**
 * Whose an address is (issue 42, point 1): on this node the local pod enim gave it to
 * (by uid), and nobody the API names once its DEL took it back; elsewhere the pod the
 * API shows with it, and nobody when two pods claim it. Unit cases, then a property
 * test that drives the compiler with random lives of pods (ADD, status, Terminating,
 * DEL, address reuse, final status, deletion, relists) against a reference reading.
 */
import fc from "fast-check";
import { assert, assertEquals, assertThrows } from "../lib/assert.ts";
import { PodSchema } from "../kube/objects.ts";
import type { Pod } from "../kube/objects.ts";
import { PodNotFoundError, PolicyEngine, type PolicyUpdate } from "./compile.ts";
import { admits } from "./evaluate.ts";
import type { CompiledPolicy } from "./types.ts";
import { namespaceObject, policyObject, viewOf } from "../tests/support/policy_world.ts";
import { applyUpdate, tableOf, type Tables } from "../tests/support/policy_tables.ts";

/** A pod as a test writes it. */
interface P {
  ns: string;
  name: string;
  uid: string;
  app: string;
  ips: string[];
  phase: string;
  /** Its deletion has begun, with this grace period (seconds). */
  deleting?: number;
}

/** The pod's API object, parsed as the agent's cache parses it. */
function podOf(p: P): Pod {
  return PodSchema.parse({
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      name: p.name,
      namespace: p.ns,
      uid: p.uid,
      labels: { app: p.app },
      ...(p.deleting !== undefined
        ? {
          deletionTimestamp: "2026-12-01T10:00:30Z",
          deletionGracePeriodSeconds: p.deleting,
        }
        : {}),
    },
    spec: { nodeName: "node-1", containers: [{ name: "c", image: "x" }] },
    status: {
      phase: p.phase,
      ...(p.ips.length ? { podIP: p.ips[0], podIPs: p.ips.map((ip) => ({ ip })) } : {}),
    },
  });
}

const NAMESPACES = () => [
  namespaceObject("x", { team: "x" }),
  namespaceObject("y", { team: "y" }),
  namespaceObject("z", { team: "z" }),
];

/** x/a admits y's b pods; x/c admits z's e pods. */
const POLICIES = () => [
  policyObject("x", "a", {
    podSelector: { matchLabels: { app: "a" } },
    ingress: [{
      from: [{
        namespaceSelector: { matchLabels: { team: "y" } },
        podSelector: { matchLabels: { app: "b" } },
      }],
    }],
  }),
  policyObject("x", "c", {
    podSelector: { matchLabels: { app: "c" } },
    ingress: [{
      from: [{
        namespaceSelector: { matchLabels: { team: "z" } },
        podSelector: { matchLabels: { app: "e" } },
      }],
    }],
  }),
];

const from = (c: CompiledPolicy, peer: string) =>
  admits(c, { direction: "ingress", peer, protocol: "TCP", port: 8080 });

/** A local pod as the enforcer registers it (its uid from CNI_ARGS `K8S_POD_UID`). */
function local(p: P, ips = p.ips) {
  const l = { namespace: p.ns, name: p.name, ips, uid: p.uid };
  return l;
}

Deno.test("identity: a DEL'd pod whose API object still shows its address Running and Terminating lends that address nothing; its new local owner (another uid) is the address's only identity on this node", () => {
  const A = "10.0.0.2";
  const xa: P = { ns: "x", name: "a", uid: "u-xa", app: "a", ips: ["10.0.0.1"], phase: "Running" };
  const xc: P = { ns: "x", name: "c", uid: "u-xc", app: "c", ips: ["10.0.0.3"], phase: "Running" };
  const yb: P = { ns: "y", name: "b", uid: "u-yb", app: "b", ips: [A], phase: "Running" };
  const world = [xa, xc, yb];
  const engine = new PolicyEngine(viewOf(world.map(podOf), NAMESPACES(), POLICIES()), {
    nodeAddresses: ["10.0.0.254"],
  });
  for (const p of world) engine.addLocal(local(p));
  const a = () => engine.compiled("x", "a")!;
  const c = () => engine.compiled("x", "c")!;
  assert(from(a(), A), "x/a admits y/b");
  assert(!from(c(), A), "x/c does not");

  // Deleted as the API shows it: deletionTimestamp set, still Running, its podIPs kept.
  yb.deleting = 30;
  engine.upsertPod(podOf(yb));
  assert(from(a(), A), "Terminating, it still runs and is still admitted");

  // The runtime's DEL: the address is no longer y/b's here, whatever the API says.
  const del = engine.removeLocal("y", "b");
  const set = a().ingress.entries[0].peer!;
  assertEquals(del.deltas.filter((d) => d.key === set).map((d) => d.ipv4), [{
    add: [],
    delete: [A],
  }]);
  assert(!from(a(), A), "after its DEL, y/b's address is not admitted as y/b's");
  assertEquals(del.retired, [A], "the connections tracked for it were y/b's: they go");

  // z/e gets y/b's ENI, so its address, while the API still shows y/b with it.
  const ze: P = { ns: "z", name: "e", uid: "u-ze", app: "e", ips: [], phase: "Pending" };
  engine.upsertPod(podOf(ze));
  const added = engine.addLocal(local(ze, [A]));
  assert(!from(a(), A), "z/e's address is not y/b's: x/a does not admit it");
  assert(from(c(), A), "z/e's address is z/e's: x/c admits it");
  assertEquals(added.compiled.pod.ipv4, [A]);

  // kubelet writes z/e's status: the API now shows both with the address.
  ze.ips = [A];
  ze.phase = "Running";
  engine.upsertPod(podOf(ze));
  assert(!from(a(), A) && from(c(), A), "both in the API: still z/e's alone here");
  // A relist (the same API state) keeps local truth.
  engine.resync(viewOf([xa, xc, yb, ze].map(podOf), NAMESPACES(), POLICIES()));
  assert(!from(a(), A) && from(c(), A), "after a relist: still z/e's alone here");
  // y/b's status turns final, then its object goes: nothing changes.
  yb.phase = "Succeeded";
  engine.upsertPod(podOf(yb));
  engine.deletePod("y", "b");
  assert(!from(a(), A) && from(c(), A), "y/b gone: z/e's");

  // z/e's DEL: its address leaves x/c at once; nobody's until a new owner.
  engine.removeLocal("z", "e");
  assert(!from(a(), A) && !from(c(), A), "after z/e's DEL: nobody's");
});

Deno.test("identity: an address a local pod holds lends nothing to another pod's API object, of another name or of the same name with another uid", () => {
  const A = "10.0.0.2";
  const xa: P = { ns: "x", name: "a", uid: "u-xa", app: "a", ips: ["10.0.0.1"], phase: "Running" };
  // A stale remote pod whose API object lists the address z/e holds here.
  const stale: P = { ns: "y", name: "old", uid: "u-old", app: "b", ips: [A], phase: "Running" };
  const ze: P = { ns: "z", name: "e", uid: "u-ze", app: "e", ips: [], phase: "Pending" };
  const engine = new PolicyEngine(
    viewOf([xa, stale, ze].map(podOf), NAMESPACES(), POLICIES()),
    { nodeAddresses: [] },
  );
  engine.addLocal(local(xa));
  assert(from(engine.compiled("x", "a")!, A), "nobody holds it here: the API's y/old");
  engine.addLocal(local(ze, [A]));
  assert(!from(engine.compiled("x", "a")!, A), "z/e holds it: not y/old's");

  // A StatefulSet's pod re-created under its name (another uid) while the cache still
  // holds the old one: its policy cannot be compiled from the old pod's object.
  const yb1: P = {
    ns: "y",
    name: "b-0",
    uid: "u-1",
    app: "b",
    ips: ["10.0.0.5"],
    phase: "Running",
  };
  engine.upsertPod(podOf(yb1));
  engine.addLocal(local(yb1));
  engine.removeLocal("y", "b-0");
  const yb2 = local({ ...yb1, uid: "u-2" }, ["10.0.0.6"]);
  const err = assertThrows(() => engine.addLocal(yb2));
  assert(err instanceof PodNotFoundError);
  assertEquals(
    err.message,
    'Cannot compile the policy of pod "y/b-0" (uid "u-2"): the cache holds another pod of that name (uid "u-1")',
  );
  assert(!from(engine.compiled("x", "a")!, "10.0.0.5"), "the old pod let its address go");
  engine.upsertPod(podOf({ ...yb1, uid: "u-2", ips: [], phase: "Pending" }));
  engine.addLocal(yb2);
  assert(from(engine.compiled("x", "a")!, "10.0.0.6"), "the new pod's address, its own");
  assert(!from(engine.compiled("x", "a")!, "10.0.0.5"), "not the old pod's");
});

Deno.test("identity: in the API's view an address two pods claim is neither's; a Terminating pod keeps its address, one deleted without grace or finished does not", () => {
  const A = "10.0.0.2";
  const xa: P = { ns: "x", name: "a", uid: "u-xa", app: "a", ips: ["10.0.0.1"], phase: "Running" };
  const yb: P = { ns: "y", name: "b", uid: "u-yb", app: "b", ips: [A], phase: "Running" };
  const ze: P = { ns: "z", name: "e", uid: "u-ze", app: "e", ips: [A], phase: "Running" };
  const engine = new PolicyEngine(viewOf([xa, yb].map(podOf), NAMESPACES(), POLICIES()), {
    nodeAddresses: [],
  });
  engine.addLocal(local(xa));
  const a = () => engine.compiled("x", "a")!;
  assert(from(a(), A));
  // Remote pods: another node reused y/b's address before y/b's status was final.
  const u = engine.upsertPod(podOf(ze));
  assertEquals(u.deltas.map((d) => d.ipv4), [{ add: [], delete: [A] }]);
  assertEquals(u.retired, [A]);
  assert(!from(a(), A), "claimed by y/b and z/e: admitted as neither");
  // A relist sees the same.
  engine.resync(viewOf([xa, yb, ze].map(podOf), NAMESPACES(), POLICIES()));
  assert(!from(a(), A), "after a relist too");
  // z/e stops listing it: y/b's again.
  engine.upsertPod(podOf({ ...ze, ips: ["10.0.0.9"] }));
  assert(from(a(), A), "y/b's alone again");
  // Terminating with a grace period: it still runs.
  yb.deleting = 30;
  engine.upsertPod(podOf(yb));
  assert(from(a(), A), "Terminating within its grace period: still y/b's");
  // Deleted without grace (a force delete held by a finalizer): none of it runs.
  yb.deleting = 0;
  engine.upsertPod(podOf(yb));
  assert(!from(a(), A), "deleted without grace: nobody's");
  yb.deleting = 30;
  engine.upsertPod(podOf(yb));
  assert(from(a(), A));
  yb.phase = "Failed";
  engine.upsertPod(podOf(yb));
  assert(!from(a(), A), "finished: nobody's");
});

// ---------------------------------------------------------------------------------------
// The property: random lives of pods against a reference reading.

/** What each policy of the property admits, for the reference: by namespace and app. */
interface RefRule {
  ns: string;
  /** The apps it selects (undefined: every pod of its namespace). */
  app?: string;
  dir: "ingress" | "egress";
  /** Peer namespace's team (undefined: the policy's own; "*": any) and app. */
  peerTeam?: string;
  peerApp: string;
}

const REF_RULES: RefRule[] = [
  { ns: "x", app: "a", dir: "ingress", peerTeam: "y", peerApp: "b" },
  { ns: "x", app: "c", dir: "ingress", peerTeam: "z", peerApp: "e" },
  { ns: "z", dir: "ingress", peerTeam: "*", peerApp: "a" },
  { ns: "z", dir: "egress", peerApp: "b" },
];

const PROPERTY_POLICIES = () => [
  ...POLICIES(),
  policyObject("z", "all", {
    podSelector: {},
    policyTypes: ["Ingress", "Egress"],
    ingress: [{ from: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: "a" } } }] }],
    egress: [{ to: [{ podSelector: { matchLabels: { app: "b" } } }] }],
  }),
];

const POOL = ["10.9.1.1", "10.9.1.2", "10.9.1.3"];
const OTHER = "10.9.2.9";
const NODE_ADDR = "10.9.0.254";

Deno.test("identity: after any sequence of ADDs, DELs, reused addresses, status writes, Terminating, final and deleted pods, contested addresses and relists, every local pod admits exactly what the reference reading says, and the deltas keep its sets equal", () => {
  const pod = fc.nat({ max: 3 });
  const app = fc.constantFrom("a", "b", "b", "c", "e", "e");
  const op = fc.oneof(
    {
      arbitrary: fc.record({
        kind: fc.constant("create" as const),
        ns: fc.constantFrom("x", "y", "y", "z", "z"),
        app,
      }),
      weight: 3,
    },
    {
      arbitrary: fc.record({ kind: fc.constant("add" as const), i: pod, slot: fc.nat() }),
      weight: 3,
    },
    { arbitrary: fc.record({ kind: fc.constant("status" as const), i: pod }), weight: 3 },
    {
      arbitrary: fc.record({
        kind: fc.constant("terminate" as const),
        i: pod,
        grace: fc.constantFrom(0, 30, 30),
      }),
      weight: 2,
    },
    { arbitrary: fc.record({ kind: fc.constant("del" as const), i: pod }), weight: 3 },
    { arbitrary: fc.record({ kind: fc.constant("finish" as const), i: pod }), weight: 1 },
    { arbitrary: fc.record({ kind: fc.constant("gone" as const), i: pod }), weight: 1 },
    { arbitrary: fc.record({ kind: fc.constant("relabel" as const), i: pod, app }), weight: 1 },
    {
      arbitrary: fc.record({
        kind: fc.constant("remote" as const),
        who: fc.constantFrom("z/rx", "y/ry"),
        addr: fc.option(fc.constantFrom(...POOL, OTHER), { nil: undefined }),
        app,
      }),
      weight: 3,
    },
    { arbitrary: fc.constant({ kind: "resync" as const }), weight: 1 },
  );
  fc.assert(
    fc.property(fc.array(op, { minLength: 10, maxLength: 40, size: "max" }), (ops) => {
      const team: Record<string, string> = { x: "x", y: "y", z: "z" };
      // The fixed local pods (targets), a remote pod that may claim any address.
      const api = new Map<string, P>();
      const put = (p: P) => api.set(`${p.ns}/${p.name}`, p);
      const fixed: P[] = [
        { ns: "x", name: "a", uid: "u-xa", app: "a", ips: ["10.9.0.1"], phase: "Running" },
        { ns: "x", name: "c", uid: "u-xc", app: "c", ips: ["10.9.0.3"], phase: "Running" },
        { ns: "z", name: "t", uid: "u-zt", app: "t", ips: ["10.9.0.2"], phase: "Running" },
        { ns: "y", name: "rb", uid: "u-rb", app: "b", ips: ["10.9.2.1"], phase: "Running" },
        { ns: "z", name: "rx", uid: "u-rx", app: "e", ips: [], phase: "Running" },
        { ns: "y", name: "ry", uid: "u-ry", app: "b", ips: [], phase: "Running" },
      ];
      for (const p of fixed) put(p);
      const engine = new PolicyEngine(
        viewOf([...api.values()].map(podOf), NAMESPACES(), PROPERTY_POLICIES()),
        { nodeAddresses: [NODE_ADDR] },
      );
      const tables: Tables = new Map();
      /** Local pods: key → the address enim gave it and its uid. */
      const locals = new Map<string, { addr: string; uid: string }>();
      /** `uid|addr`: a pod that let the address go here. */
      const released = new Set<string>();
      for (const p of fixed.slice(0, 3)) {
        const r = engine.addLocal(local(p));
        applyUpdate(engine, tables, r);
        locals.set(`${p.ns}/${p.name}`, { addr: p.ips[0], uid: p.uid });
      }
      const churn: P[] = [];
      let n = 0;
      // The newest pods, mostly: a pod's life is a few steps of the sequence.
      const pick = (i: number) =>
        churn.length ? churn[churn.length - 1 - (i % churn.length)] : undefined;
      const lends = (p: P) => p.phase !== "Succeeded" && p.phase !== "Failed" && p.deleting !== 0;

      /** The pod whose address `addr` is, by the reference reading (undefined: nobody's). */
      const owner = (addr: string): P | undefined => {
        const held = [...locals].find(([, l]) => l.addr === addr);
        if (held) {
          const p = api.get(held[0]);
          return p && p.uid === held[1].uid ? p : undefined;
        }
        const claim = [...api.values()].filter((p) =>
          lends(p) && p.ips.includes(addr) && !released.has(`${p.uid}|${addr}`)
        );
        return claim.length === 1 ? claim[0] : undefined;
      };
      const refAdmits = (target: P, dir: "ingress" | "egress", addr: string): boolean => {
        if (addr === NODE_ADDR || addr === locals.get(`${target.ns}/${target.name}`)?.addr) {
          return true;
        }
        const rules = REF_RULES.filter((r) =>
          r.ns === target.ns && (r.app === undefined || r.app === target.app) && r.dir === dir
        );
        if (rules.length === 0) return true;
        const o = owner(addr);
        return o !== undefined && rules.some((r) =>
          r.peerApp === o.app &&
          (r.peerTeam === "*" || (r.peerTeam ?? team[r.ns]) === team[o.ns])
        );
      };

      for (const o of ops) {
        let u: PolicyUpdate | undefined;
        if (o.kind === "create") {
          const p: P = {
            ns: o.ns,
            name: `p${n++}`,
            uid: `u-${n}`,
            app: o.app,
            ips: [],
            phase: "Pending",
          };
          churn.push(p);
          put(p);
          u = engine.upsertPod(podOf(p));
        } else if (o.kind === "remote") {
          const r = api.get(o.who)!;
          r.ips = o.addr ? [o.addr] : [];
          r.app = o.app;
          u = engine.upsertPod(podOf(r));
        } else if (o.kind === "resync") {
          u = engine.resync(
            viewOf([...api.values()].map(podOf), NAMESPACES(), PROPERTY_POLICIES()),
          );
        } else {
          const p = pick(o.i);
          if (!p) continue;
          const key = `${p.ns}/${p.name}`;
          const inApi = api.get(key) === p;
          const mine = locals.get(key);
          if (o.kind === "add") {
            // A sandbox's ADD, once: a free ENI's address (free: no local pod holds it).
            if (!inApi || mine || !lends(p) || p.ips.length > 0 || released.has(`${p.uid}|*`)) {
              continue;
            }
            const free = POOL.filter((a) => ![...locals.values()].some((l) => l.addr === a));
            if (free.length === 0) continue;
            const addr = free[o.slot % free.length];
            u = engine.addLocal(local(p, [addr]));
            locals.set(key, { addr, uid: p.uid });
          } else if (o.kind === "status") {
            if (!inApi || !mine) continue;
            p.ips = [mine.addr];
            if (p.phase === "Pending") p.phase = "Running";
            u = engine.upsertPod(podOf(p));
          } else if (o.kind === "terminate") {
            if (!inApi || p.deleting !== undefined) continue;
            p.deleting = o.grace;
            u = engine.upsertPod(podOf(p));
          } else if (o.kind === "del") {
            if (!mine) continue;
            u = engine.removeLocal(p.ns, p.name);
            locals.delete(key);
            released.add(`${p.uid}|${mine.addr}`);
            // Its sandbox is gone: it gets no other (a new pod would, with a new name).
            released.add(`${p.uid}|*`);
            applyUpdate(engine, tables, u);
            tables.delete(key);
            u = undefined;
          } else if (o.kind === "finish") {
            if (!inApi) continue;
            p.phase = "Failed";
            u = engine.upsertPod(podOf(p));
          } else if (o.kind === "gone") {
            if (!inApi) continue;
            api.delete(key);
            u = engine.deletePod(p.ns, p.name);
          } else {
            if (!inApi) continue;
            p.app = o.app;
            u = engine.upsertPod(podOf(p));
          }
        }
        if (u) applyUpdate(engine, tables, u);

        // Every local pod the API still shows: what it admits, and its sets as the
        // deltas kept them.
        const universe = [...POOL, OTHER, "10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.2.1"];
        for (const [key, l] of locals) {
          const c = engine.compiled(...(key.split("/") as [string, string]))!;
          assertEquals(tables.get(key), tableOf(c), `${key}'s sets`);
          const p = api.get(key);
          if (!p || p.uid !== l.uid) continue;
          for (const dir of ["ingress", "egress"] as const) {
            for (const addr of universe) {
              const got = admits(c, { direction: dir, peer: addr, protocol: "TCP", port: 8080 });
              assertEquals(
                got,
                refAdmits(p, dir, addr),
                `${key} ${dir} ${addr} (owner ${owner(addr)?.name ?? "none"}) after ${
                  JSON.stringify(o)
                }`,
              );
            }
          }
        }
      }
    }),
    { numRuns: Number(Deno.env.get("IDENTITY_RUNS") ?? 300) },
  );
});
