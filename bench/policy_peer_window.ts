/**
 * How long a new pod on another node is denied by a policy that admits it (issue 42
 * point 10), and how long a deleted one's address is still admitted, measured with the
 * real agent (a check to run by hand, as root; not a test). A simulated node's agent
 * (the shipped bundle, the production permission set) enforces, for its pod `secure/db`,
 * a policy admitting TCP 5432 from pods `app=client` of any namespace. A machine of the
 * VPC stands in for a pod of another node: each round its Pod object (`open/client-N`
 * on `node-x`) is created as the scheduler leaves it (no address), then, as kubelet's
 * status write does, given the machine's address; the round measures
 *
 * - from that write to the agent's status showing it enforced (polled every 5 ms), and
 *   to the first TCP probe from the machine that gets through (a probe every ~100 ms:
 *   the figure is the start of the first probe through, ±100 ms);
 * - from the Pod's delete to the first probe dropped again (a deleted pod's address).
 *
 *     deno run -A --config tests/deno.json bench/policy_peer_window.ts [--rounds N]
 *
 * kubelet's part (the pod's sandbox made to its status write with the address) is not
 * simulated: see docs/network_policy.md, "Windows that remain".
 *
 * @module
 */
import { parseArgs } from "node:util";
import { poll } from "../lib/async.ts";
import { PolicyCluster } from "../tests/support/policy_cluster.ts";
import { passed } from "../tests/support/prober.ts";
import { stats } from "./_stats.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: { rounds: { type: "string", default: "20" } },
});
const rounds = Number(values.rounds);

/** Polls until `check` is true; returns ms since `t0` at the poll that saw it. */
async function until(t0: number, check: () => Promise<boolean>, every: number): Promise<number> {
  const got = await poll(async () => (await check()) ? performance.now() - t0 : null, {
    timeoutMs: 30_000,
    intervalMs: every,
  });
  if (got === null) throw new Error("Timed out");
  return got;
}

const c = await PolicyCluster.start();
try {
  c.namespace("secure", { team: "s" });
  c.namespace("open", { team: "o" });
  const a = await c.node("node-a", { nodeNic: true, mock: { enis: 3 } });
  const db = await c.pod(a, "node-a", "secure", "db", { app: "db" }, [{
    name: "sql",
    containerPort: 5432,
  }]);
  c.put("networkpolicies", {
    metadata: { namespace: "secure", name: "db" },
    spec: {
      podSelector: { matchLabels: { app: "db" } },
      ingress: [{
        from: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: "client" } } }],
        ports: [{ port: 5432 }],
      }],
    },
  });
  await c.settle();
  const remote = await a.vpc.host("remote", 60);
  const prober = await c.prober(remote.ns.name);
  const probe = async () =>
    passed((await prober.probe([{ proto: "tcp", addr: db.v4, port: 5432 }], 100))[0]);
  if (await probe()) throw new Error("The remote machine reaches db before it is a client pod");

  const enforcedAt = (rv: number) => async () => {
    const s = (await a.client.status()).policy;
    const pods = s?.caches.find((x) => x.resource === "pods");
    return Number(pods?.enforcedResourceVersion ?? 0) >= rv && s?.pendingEvents === 0;
  };
  const admitStatus: number[] = [];
  const admitProbe: number[] = [];
  const denyStatus: number[] = [];
  const denyProbe: number[] = [];
  for (let k = 0; k < rounds; k++) {
    const name = `client-${k}`;
    c.put("pods", c.podObject("open", name, { app: "client" }, "node-x", []));
    await c.settle();
    if (await probe()) throw new Error("Admitted before its address was written");
    let t0 = performance.now();
    const stored = c.server.put(
      "pods",
      c.podObject("open", name, { app: "client" }, "node-x", [], { v4: remote.ipv4 }),
    );
    const rv = Number(stored.metadata.resourceVersion);
    const probing = until(t0, probe, 0);
    admitStatus.push(await until(t0, enforcedAt(rv), 5));
    admitProbe.push(await probing);
    t0 = performance.now();
    c.remove("pods", "open", name);
    const delRv = Number(c.server.resourceVersion);
    const dropping = until(t0, async () => !(await probe()), 0);
    denyStatus.push(await until(t0, enforcedAt(delRv), 5));
    denyProbe.push(await dropping);
  }
  const ms = (xs: number[]) => {
    const s = stats(xs);
    return { p50: Math.round(s.p50), p90: Math.round(s.p90), max: Math.round(s.max) };
  };
  console.log(JSON.stringify(
    {
      rounds,
      "status write with the address → agent status enforced (ms)": ms(admitStatus),
      "status write with the address → first probe through (ms, ±100)": ms(admitProbe),
      "delete → agent status enforced (ms)": ms(denyStatus),
      "delete → first probe dropped (ms, probes take 100 ms when dropped)": ms(denyProbe),
    },
    null,
    2,
  ));
} catch (err) {
  for (const n of c.nodes) console.error(await n.agentLog());
  throw err;
} finally {
  await c.close();
}
