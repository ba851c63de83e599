/**
 * What the reuse wait (`networkPolicy.reuseWaitSeconds`, docs/network_policy.md "Whose an
 * address is") costs a full node's pod starts: a node whose 3 ENIs are all in use, the
 * oldest pod deleted as kubelet deletes one (Terminating in the API, then its DEL), and
 * at once a new pod's ADD, which can only get the ENI just freed. Timed: the new pod's
 * ADD, from its call to its answer, in four cases:
 *
 * - `off`: no wait (`reuseWaitSeconds: 0`); kubelet writes the old pod's final status
 *   right after its DEL;
 * - `kubelet`: the wait on; kubelet's final status right after the DEL (its status
 *   manager writes the terminal phase once the sandbox is stopped), then the object goes;
 * - `late`: the wait on; that status 500 ms after the DEL;
 * - `stuck`: the wait on with a bound of 5 s; the old pod never leaves the API (a stuck
 *   finalizer).
 *
 * The four nodes run at once, their rounds alternating.
 *
 * `deno run -A --config tests/deno.json bench/reuse_wait.ts [--rounds 10]` (as root:
 * real network namespaces, the shipped bundle; `deno task build` first).
 *
 * @module
 */
import { parseArgs } from "node:util";
import { PolicyCluster } from "../tests/support/policy_cluster.ts";
import type { ClusterPod } from "../tests/support/policy_cluster.ts";
import { stats } from "./_stats.ts";

const { values } = parseArgs({ options: { rounds: { type: "string", default: "10" } } });
const ROUNDS = Number(values.rounds);

type Case = { name: string; waitSeconds: number; finalAfterMs: number | null };
const CASES: Case[] = [
  { name: "off", waitSeconds: 0, finalAfterMs: 0 },
  { name: "kubelet", waitSeconds: 30, finalAfterMs: 0 },
  { name: "late", waitSeconds: 30, finalAfterMs: 500 },
  { name: "stuck", waitSeconds: 5, finalAfterMs: null },
];

/** One case's node, its pods, and one round of it. */
interface Bench {
  c: PolicyCluster;
  round(): Promise<number>;
}

/** A cluster of one node of 3 ENIs, all in use, configured for case `k`. */
async function setUp(k: Case): Promise<Bench> {
  const c = await PolicyCluster.start();
  c.namespace("w", { team: "w" });
  const node = await c.node("node-a", {
    mock: { enis: 3 },
    extra: { networkPolicy: { reuseWaitSeconds: k.waitSeconds } },
  });
  // Selected by a policy (the usual case where it matters).
  c.put("networkpolicies", {
    metadata: { namespace: "w", name: "in" },
    spec: { podSelector: {}, ingress: [{ from: [{ podSelector: {} }] }] },
  });
  const live: ClusterPod[] = [];
  let n = 0;
  for (; n < 3; n++) live.push(await c.pod(node, "node-a", "w", `p${n}`, { app: "p" }, []));
  await c.settle();
  const round = async () => {
    const old = live.shift()!;
    const o = c.podObject("w", old.name, old.labels, "node-a", [], { v4: old.v4, v6: old.v6 });
    o.metadata.deletionTimestamp = new Date(Date.now() + 30_000).toISOString();
    o.metadata.deletionGracePeriodSeconds = 30;
    c.put("pods", o);
    await c.settle();
    // The new pod's object and sandbox, ready before the DEL (kubelet's order).
    const name = `p${n++}`;
    c.put("pods", c.podObject("w", name, { app: "p" }, "node-a", []));
    const next = {
      name,
      ns: await node.vpc.pod(`w-${name}`),
      containerId: `c-w-${name}`,
      args: await c.cniArgs("w", name),
    };
    await c.del(old);
    const final = () => {
      o.status.phase = "Failed";
      c.put("pods", o);
      c.remove("pods", "w", old.name);
    };
    if (k.finalAfterMs === 0) final();
    const later = k.finalAfterMs ? setTimeout(final, k.finalAfterMs) : undefined;
    const t0 = performance.now();
    const res = await node.add(next.ns, {
      containerId: next.containerId,
      args: next.args,
      config: c.netconf(node),
    });
    const ms = performance.now() - t0;
    clearTimeout(later);
    if (k.finalAfterMs === null) final();
    const addr = (fam: 4 | 6) =>
      res.ips.map((x) => x.address.split("/")[0]).find((x) => x.includes(":") === (fam === 6))!;
    if (addr(4) !== old.v4) throw new Error(`The new pod got ${addr(4)}, not ${old.v4}`);
    c.put("pods", c.podObject("w", name, { app: "p" }, "node-a", [], { v4: addr(4), v6: addr(6) }));
    live.push({ ...old, ...next, v4: addr(4), v6: addr(6) });
    await node.vpc.deletePod(old.ns);
    await c.settle();
    return ms;
  };
  return { c, round };
}

// Every case's node at once, their rounds alternating (the order turned each round), so
// that the machine's drift lands on each alike; the first round of each warms up.
const benches: Bench[] = [];
try {
  for (const k of CASES) benches.push(await setUp(k));
  const samples: number[][] = CASES.map(() => []);
  for (let i = 0; i < ROUNDS + 1; i++) {
    for (let j = 0; j < CASES.length; j++) {
      const at = (i + j) % CASES.length;
      const ms = await benches[at].round();
      if (i > 0) samples[at].push(ms);
    }
  }
  const addMs = Object.fromEntries(CASES.map((k, i) => [k.name, stats(samples[i])]));
  console.log(JSON.stringify({ rounds: ROUNDS, addMs }, null, 2));
} finally {
  for (const b of benches) await b.c.close().catch(() => {});
}
