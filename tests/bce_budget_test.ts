/**
 * The BCE provider's API-call budget, measured against the fake BCE server and
 * printed (never asserted as a number: only its structure is checked).
 *
 * Time runs 1000× faster: every period of the provider's default config is
 * divided by 1000 (the pool pass every 30 s while something changes, backing off
 * to 5 min while nothing does, ±20 % jitter; the whole-VPC orphan scan once an
 * hour), so one simulated hour takes 3.6 s. The VPC holds 8000 ENIs of other
 * nodes (1000 nodes × 8), so an orphan scan reads 8 pages of 1000, as it would
 * in a region with 1000 such nodes.
 *
 * Each pod's life costs what the agent makes it cost: the ADD, then (after the
 * ADD has answered, as the manager queues it) the description naming the pod;
 * the DEL, then the description put back. Two `modifyAttribute` calls per pod.
 *
 * Scenarios, each one simulated hour after a warm-up:
 * - steady: no pod comes or goes;
 * - rolling churn: a pod every minute, each living 5 minutes (60 ADD + 60 DEL);
 * - bursty churn: 6 pods at once every 10 minutes, each living 5 minutes (the
 *   warm pool, minIdle 1 / maxIdle 2, grows and shrinks each time).
 *
 * Zone-wide sticky pods (issue 26) are measured on two nodes sharing the fake:
 * what one re-create costs (the DEL's park on one node, the ADD's claim on the
 * other, both records), and an hour of a sticky pod moving to the other node
 * every minute, with BCE's list name filter honoured, and ignored (the lookups
 * then share one index of the VPC).
 *
 * Run: `deno test -A --config tests/deno.json tests/bce_budget_test.ts` (the figures are printed).
 */
import { assert, assertEquals } from "../lib/assert.ts";
import type { Owner } from "../providers/contract.ts";
import { INSTANCE, setup, startFake, type TestEnv } from "./support/bce_harness.ts";
import type { FakeBce, FakeRequestRecord } from "./support/bce_fake.ts";

/** Real milliseconds per simulated second. */
const MS_PER_S = 1;
const S = (seconds: number) => seconds * MS_PER_S;
const HOUR = S(3600);
const NODES = 1000;
const ENIS_PER_NODE = 8;

/** The provider's default timings (config.ts), scaled. */
const TIMEOUTS = {
  requestMs: 2000,
  totalMs: 10_000,
  maxAttempts: 5,
  baseDelayMs: S(1),
  maxDelayMs: S(10),
  // Not scaled: a bound on a stuck attach, not a period. Scaled to 60 ms, a busy
  // event loop (six parallel ADDs) made a healthy attach look stuck now and then.
  attachMs: 60_000,
  detachMs: S(60),
  escalateMs: S(15),
  createVisibilityMs: S(10),
  deviceMs: 2000,
  pollMs: S(1),
  poolIntervalMs: S(30),
  idleIntervalMs: S(300),
  orphanScanIntervalMs: S(3600),
  quarantineRetryMs: S(600),
  minPassGapMs: S(5),
  jitter: 0.2,
};

/** The operation of a recorded request, as bce-sdk-go names it. */
function opOf(r: FakeRequestRecord): string {
  if (r.path === "/v1/eni" && r.method === "GET") {
    if ("name" in r.query) return "ListEni(sticky lookup)";
    return "instanceId" in r.query ? "ListEni(node)" : "ListEni(VPC scan page)";
  }
  if (r.path === "/v1/eni" && r.method === "POST") return "CreateEni";
  if (r.path.startsWith("/v1/eni/") && r.method === "GET") {
    return "GetEniDetail";
  }
  if (r.method === "PUT") {
    if ("attach" in r.query) return "AttachEni";
    if ("detach" in r.query) return "DetachEni";
    if ("modifyAttribute" in r.query) return "UpdateEni(description)";
    if ("bindSg" in r.query || "bindEsg" in r.query) {
      return "UpdateEniSecurityGroup";
    }
  }
  if (r.method === "DELETE") return "DeleteEni";
  return `${r.method} ${r.path.replace(/\/[^/]+$/, "/{id}")}`;
}

interface Figures {
  scenario: string;
  perNodeHour: number;
  byOp: Record<string, number>;
  passes: number;
  nodeLists: number;
  scans: number;
  descriptions: number;
  adds: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function measure(
  scenario: string,
  drive: (
    alloc: (o: Owner) => Promise<void>,
    free: (o: Owner) => Promise<void>,
  ) => Promise<number>,
): Promise<Figures> {
  const fake: FakeBce = startFake({
    instances: { [INSTANCE]: { eniQuota: 16 } },
    attachDelayMs: S(2),
    detachDelayMs: S(2),
    maxKeysCap: 1000,
    // No young-ENI refusal: at 1 ms per simulated second the harness's 30 ms is 30 s of
    // refusals per new ENI, and the bursty scenario then finds the node's slots held by
    // pool refills still in flight (the figures here count calls, not that case).
    youngEniRefusesAttachMs: 0,
  });
  for (let n = 0; n < NODES - 1; n++) {
    for (let i = 0; i < ENIS_PER_NODE; i++) {
      fake.seedEni({
        name: `enim/i-node${n}/e${i}`,
        instanceId: `i-node${n}`,
        status: "inuse",
      });
    }
  }
  // Descriptions queued per ENI (below): all settled before the provider closes, also when
  // the scenario fails (its error is the test's, not a description cut off by the close).
  const tails = new Map<string, Promise<void>>();
  const env = await setup({
    withFake: fake,
    maxEnisPerNode: ENIS_PER_NODE,
    warmPool: { minIdle: 1, maxIdle: 2 },
    timeouts: TIMEOUTS,
  });
  try {
    await env.provider.start();
    // Warm-up: the pool fills, the first orphan scan runs, the period backs off. Then on
    // until the pool has settled (no call but a list for 5 simulated minutes), however slow
    // the machine is: at 1 ms a simulated second a loaded one stretches the refills.
    await sleep(S(900));
    const settling = () => fake.requests.filter((r) => !opOf(r).startsWith("ListEni")).length;
    for (let i = 0, n = settling(); i < 20; i++) {
      await sleep(S(300));
      if (settling() === n) break;
      n = settling();
    }
    const from = fake.requests.length;
    const passes0 = env.provider.passes;
    // Descriptions are queued per ENI, after the ADD or DEL has answered, as the
    // manager's Describer does: never on the pod's path.
    const held = new Map<string, string>();
    const describe = (id: string, text: string | null) =>
      tails.set(
        id,
        (tails.get(id) ?? Promise.resolve()).then(() => env.provider.describeENI(id, text)),
      );
    const adds = await drive(
      async (o) => {
        const eni = await env.provider.allocateNextENI(o, {
          ips: [],
          ranges: [],
        });
        held.set(o.containerId, eni.id);
        describe(eni.id, `${o.pod} on node-1`);
      },
      async (o) => {
        await env.provider.deallocateENI(o);
        const id = held.get(o.containerId);
        if (id) describe(id, null);
      },
    );
    // Every description settled before the provider closes (a failed one is the figure's
    // failure, not an uncaught rejection of the others cut off by the close).
    const settled = await Promise.allSettled(tails.values());
    const failed = settled.filter((r) => r.status === "rejected").map((r) => String(r.reason));
    if (failed.length) throw new Error(`${failed.length} descriptions failed: ${failed[0]}`);
    const window = fake.requests.slice(from);
    const byOp: Record<string, number> = {};
    for (const r of window) byOp[opOf(r)] = (byOp[opOf(r)] ?? 0) + 1;
    return {
      scenario,
      perNodeHour: window.length,
      byOp,
      passes: env.provider.passes - passes0,
      nodeLists: window.filter((r) => opOf(r) === "ListEni(node)").length,
      scans: window.filter((r) => opOf(r) === "ListEni(VPC scan page)" && !("marker" in r.query))
        .length,
      descriptions: window.filter((r) => opOf(r) === "UpdateEni(description)").length,
      adds,
    };
  } finally {
    await Promise.allSettled(tails.values());
    await env.close();
    await fake.close();
  }
}

const owner = (i: number): Owner => ({
  pod: `default/churn-${i}`,
  containerId: `c${i}`,
  ifName: "eth0",
});

Deno.test({
  name:
    "the BCE API-call budget per node per hour (steady state and churn), extrapolated to 1000 nodes",
  async fn() {
    const results: Figures[] = [];
    results.push(
      await measure("steady (no pods come or go)", async () => {
        await sleep(HOUR);
        return 0;
      }),
    );
    results.push(
      await measure(
        "rolling churn (1 pod/min, 5 min each)",
        async (alloc, free) => {
          const lives: Promise<void>[] = [];
          for (let i = 0; i < 60; i++) {
            const o = owner(i);
            await alloc(o);
            lives.push(sleep(S(300)).then(() => free(o)));
            await sleep(S(60));
          }
          await Promise.all(lives);
          return 60;
        },
      ),
    );
    results.push(
      await measure(
        "bursty churn (6 pods every 10 min, 5 min each)",
        async (alloc, free) => {
          let n = 0;
          for (let burst = 0; burst < 6; burst++) {
            const pods = Array.from({ length: 6 }, () => owner(n++));
            await Promise.all(pods.map(alloc));
            await sleep(S(300));
            for (const o of pods) await free(o);
            await sleep(S(300));
          }
          return n;
        },
      ),
    );

    const lines = [
      "",
      `BCE API budget, measured against the fake (1 simulated hour each; ${NODES} nodes × ${ENIS_PER_NODE} ENIs in the VPC; default periods):`,
    ];
    for (const r of results) {
      const region = r.perNodeHour * NODES;
      lines.push(
        `  ${r.scenario}: ${r.perNodeHour} calls/node/hour → ×${NODES} nodes: ${region} calls/hour = ${
          (region / 3600).toFixed(1)
        }/s  [${
          Object.entries(r.byOp).sort(([a], [b]) => (a < b ? -1 : 1)).map((
            [k, v],
          ) => `${k} ${v}`)
            .join(", ")
        }; ${r.passes} passes, ${r.scans} VPC scans, ${r.adds} ADDs]`,
      );
    }
    lines.push(
      `  before issue 14: 2 lists per 30 s pass = 240 lists/node/hour → ×${NODES}: 240000/hour = 66.7/s`,
      `  before issue 18 (no descriptions): steady 19, rolling churn 76, bursty churn 365 calls/node/hour`,
    );
    console.log(lines.join("\n"));

    for (const r of results) {
      // Structure, not speed: one list per pass at most (a pass lists this node's ENIs,
      // or starts one whole-VPC scan), and nothing but lists when nothing happens.
      assert(
        r.nodeLists + r.scans <= r.passes + 1,
        `${r.scenario}: ${r.nodeLists} node lists + ${r.scans} scans for ${r.passes} passes`,
      );
    }
    for (const r of results) {
      // Two description calls per pod: set after the ADD, put back after the DEL.
      assertEquals(
        r.descriptions,
        2 * r.adds,
        `${r.scenario}: description calls`,
      );
    }
    const steady = results[0];
    assertEquals(
      Object.keys(steady.byOp).filter((k) => !k.startsWith("ListEni")),
      [],
      "steady state makes list calls only",
    );
  },
});

const NODE_B = "i-fake0002";
const ZONE = { clusterId: "c1", sticky: { scope: "zone", nodeHoldSeconds: 0 } };

/** Counts of `requests` by operation. */
function countOps(requests: FakeRequestRecord[]): Record<string, number> {
  const byOp: Record<string, number> = {};
  for (const r of requests) byOp[opOf(r)] = (byOp[opOf(r)] ?? 0) + 1;
  return byOp;
}

function showOps(byOp: Record<string, number>): string {
  return Object.entries(byOp).sort(([a], [b]) => (a < b ? -1 : 1)).map((
    [k, v],
  ) => `${k} ${v}`)
    .join(", ");
}

/** Waits (polling) until `fn` holds. */
async function until(
  fn: () => Promise<boolean> | boolean,
  what: string,
): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await sleep(2);
  }
}

interface StickyFigures {
  filter: string;
  /** One re-create, the pool loops stopped: what the pod's move itself costs. */
  once: Record<string, number>;
  /** One simulated hour of a move every minute, both nodes' loops running. */
  hour: Record<string, number>;
  hourTotal: number;
  moves: number;
  /** The same hour on the same two nodes with no pod at all (their steady cost). */
  idle: number;
}

/** A sticky pod moving between two nodes of one zone, against a VPC of 1000 nodes. */
async function measureSticky(
  nameFilter: "exact" | "ignore",
): Promise<StickyFigures> {
  const fake: FakeBce = startFake({
    instances: { [INSTANCE]: { eniQuota: 16 }, [NODE_B]: { eniQuota: 16 } },
    attachDelayMs: S(2),
    detachDelayMs: S(2),
    maxKeysCap: 1000,
    nameFilter,
  });
  for (let n = 0; n < NODES - 2; n++) {
    for (let i = 0; i < ENIS_PER_NODE; i++) {
      fake.seedEni({
        name: `enim/i-node${n}/e${i}`,
        instanceId: `i-node${n}`,
        status: "inuse",
      });
    }
  }
  const node = (instanceId: string) =>
    setup({
      withFake: fake,
      maxEnisPerNode: ENIS_PER_NODE,
      warmPool: { minIdle: 1, maxIdle: 2 },
      timeouts: TIMEOUTS,
      config: { ...ZONE, instanceId },
    });
  const nodes: TestEnv[] = [await node(INSTANCE), await node(NODE_B)];
  try {
    const pod = "default/db-0";
    let seq = 0;
    const o = (): Owner => ({ pod, containerId: `s${seq}`, ifName: "eth0" });
    const owned = (env: TestEnv, id: string) =>
      until(
        async () =>
          (await env.provider.list()).find((e) => e.id === id)?.description
            ?.includes(" owned ") ??
            false,
        "the owned record",
      );
    // The manager's ADD: allocate, then the description (a zone-sticky pod's: its record).
    const add = async (env: TestEnv) => {
      seq++;
      const eni = await env.provider.allocateNextENI(o(), {
        ips: [],
        ranges: [],
        sticky: true,
      });
      await env.provider.describeENI(
        eni.id,
        `${pod} on ${env === nodes[0] ? "a" : "b"}`,
      );
      await owned(env, eni.id);
      return eni;
    };
    // The manager's DEL with no node hold: the park (the detach finishes in the background).
    const del = async (env: TestEnv, eniId: string) => {
      await env.provider.parkENI(o(), { until: Date.now() + 3_600_000 });
      await until(
        () => fake.enis.get(eniId)?.status === "available",
        "the park",
      );
    };
    let eni = await add(nodes[0]);
    let here = 0;
    const from = fake.requests.length;
    await del(nodes[here], eni.id);
    here = 1 - here;
    eni = await add(nodes[here]);
    const once = countOps(fake.requests.slice(from));

    for (const n of nodes) await n.provider.start();
    await sleep(S(900));
    const idleFrom = fake.requests.length;
    await sleep(S(600));
    const idle = Math.round((fake.requests.length - idleFrom) * 6);
    const hourFrom = fake.requests.length;
    let moves = 0;
    const end = Date.now() + HOUR;
    while (Date.now() < end) {
      await del(nodes[here], eni.id);
      here = 1 - here;
      eni = await add(nodes[here]);
      moves++;
      await sleep(S(60));
    }
    const window = fake.requests.slice(hourFrom);
    return {
      filter: nameFilter,
      once,
      hour: countOps(window),
      hourTotal: window.length,
      moves,
      idle,
    };
  } finally {
    for (const n of nodes) await n.close();
    await fake.close();
  }
}

Deno.test({
  name:
    "zone-wide stickiness's API-call budget: per sticky re-create and per hour, with BCE's name filter and without",
  async fn() {
    const results = [
      await measureSticky("exact"),
      await measureSticky("ignore"),
    ];
    const lines = [
      "",
      `Zone-wide sticky pods, two nodes of one zone in a VPC of ${NODES} nodes × ${ENIS_PER_NODE} ENIs (default periods, 1000× faster):`,
    ];
    for (const r of results) {
      const once = Object.values(r.once).reduce((a, b) => a + b, 0);
      lines.push(
        `  name filter ${
          r.filter === "exact" ? "honoured" : "IGNORED by BCE"
        }: one re-create (park on one node + claim on the other) = ${once} calls [${
          showOps(r.once)
        }]`,
        `    an hour with the pod moving every minute: ${r.moves} moves, ${r.hourTotal} calls for both nodes (${
          (r.hourTotal / 2).toFixed(0)
        }/node/hour; the same two nodes idle: ${r.idle}/hour) [${showOps(r.hour)}]`,
      );
    }
    console.log(lines.join("\n"));
    const [exact, ignored] = results;
    // Structure, not speed: a re-create is one name-filtered lookup and never a VPC scan,
    // one attach, one detach, and two records (parked, owned).
    assertEquals(exact.once["ListEni(sticky lookup)"], 1);
    assertEquals(exact.once["ListEni(VPC scan page)"] ?? 0, 0);
    assertEquals([exact.once.AttachEni, exact.once.DetachEni], [1, 1]);
    assertEquals(exact.once["UpdateEni(description)"], 2);
    // With the filter ignored, the lookups share the index: far fewer VPC scans than moves.
    const scans = (ignored.hour["ListEni(VPC scan page)"] ?? 0) /
      Math.ceil(NODES * ENIS_PER_NODE / 1000);
    assert(scans < ignored.moves, `${scans} scans for ${ignored.moves} moves`);
  },
});
