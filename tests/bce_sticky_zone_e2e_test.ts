/**
 * Zone-wide sticky pods end to end (issue 26) on the real kernel: two simulated
 * nodes (two node namespaces on one simulated VPC, each with its own agent on
 * the BCE provider, production permission set) and one fake BCE cloud. The fake
 * runs in node A's namespace; node B's agent reaches it at 127.0.0.1 of its own
 * namespace through a loopback relay (a unix socket crosses namespaces). An ENI
 * the fake attaches to an instance appears as a veth device in that instance's
 * node, on the VPC bridge, so a pod that moved to B really pings its gateway
 * from B with the same MAC and IP. A third node, C, is an instance of another
 * zone: a pod parked in A's zone and re-created there is refused, naming both
 * zones. The harness is `support/zone_cluster.ts`, shared with the zone mode of
 * `deno task stress`, whose cross-node checker the steps assert with.
 *
 * The default profile keeps its sticky pods' ENIs zone-wide with no node hold
 * (the DEL parks at once; the node hold itself is the manager tests').
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import type { CniOutcome, SimulatedNode } from "./support/node.ts";
import {
  attaches,
  INSTANCES,
  said,
  stickyEvents,
  waitFor,
  ZONE_A,
  ZONE_B,
  ZONE_GATEWAY as GATEWAY,
  ZONE_SECRET as SECRET,
  ZoneCluster,
} from "./support/zone_cluster.ts";
import { checkZone, readZoneViews } from "./stress/mod.ts";
import { decodeRecord } from "../providers/bce/_sticky.ts";
import { mulberry32 } from "../lib/rng.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const ROOT = Deno.uid() === 0;
const NODE_A = INSTANCES.A;
const NODE_B = INSTANCES.B;

/** The expiry count of a node's agent. */
const expiries = (node: SimulatedNode) => stickyEvents(node, "expiry");

/**
 * The cross-node invariants kills must never break (`checkZone`, the zone stress's
 * checker): every ENI the cloud shows attached to a node's instance is one that
 * node's agent records, no ENI is recorded by two nodes or on two nodes' kernels,
 * a pod runs on one node at most, a parked ENI is listed by one agent at most.
 */
async function assertAttachmentsRecorded(cluster: ZoneCluster): Promise<void> {
  const found = checkZone(await readZoneViews(cluster));
  assertEquals(found.map((v) => `${v.class} ${v.subject}: ${v.message}`), []);
}

Deno.test({
  name:
    "zone-wide sticky pods on two nodes and one fake cloud: moves keep ENI, MAC and IP; the cloud settles races; kills are finished or rolled back; another zone is refused",
  ignore: !ROOT,
  async fn(t) {
    await using cluster = await ZoneCluster.start({
      otherZone: true,
      timeoutsB: { orphanScanIntervalMs: 1000, parkedExpiryGraceMs: 0 },
    });
    const { a, b, c, fake } = cluster;
    // Each node removes its pods' namespaces when it closes.
    const pod = (node: SimulatedNode, name: string) => node.vpc.pod(name);
    const add = cluster.add.bind(cluster);
    const del = cluster.del.bind(cluster);
    const macOf = (r: CniOutcome) => (r.json!.interfaces as { mac: string }[])[0].mac;
    const ipsOf = (r: CniOutcome) => (r.json!.ips as { address: string }[]).map((i) => i.address);
    const eniOfPod = (node: SimulatedNode, containerId: string) =>
      cluster.eniOfPod(node, containerId);
    const parkedIn = (eniId: string) =>
      waitFor(`ENI ${eniId} parked in the cloud`, async () => {
        const e = await cluster.cloudEni(eniId);
        return e?.status === "available" &&
          decodeRecord(e.description)?.state === "parked";
      });

    await t.step(
      "a sticky pod deleted on A and re-created on B within its hold gets the same ENI, MAC and IPs and pings its gateway from B; A's status no longer shows it",
      async () => {
        const onA = await pod(a, "db0-a");
        const first = await add(a, onA, "c-db0-a", "db-0");
        assertEquals(first.code, 0, said(first) + (await a.agentLog()));
        assert(
          await a.vpc.ping(onA, GATEWAY),
          "the pod pings its gateway on A",
        );
        const eniId = await eniOfPod(a, "c-db0-a");
        const gone = await del(a, onA, "c-db0-a", "db-0");
        assertEquals(gone.code, 0, said(gone));
        await parkedIn(eniId);
        await waitFor(
          "A to list it parked",
          async () =>
            (await a.client.status()).sticky.parked.some((p) =>
              p.eniId === eniId && p.state === "parked"
            ),
        );
        const statusA = await a.enim(["status"]);
        assertStringIncludes(statusA.stdout, "parked in the VPC by this node");
        assertStringIncludes(statusA.stdout, eniId);

        const onB = await pod(b, "db0-b");
        const moved = await add(b, onB, "c-db0-b", "db-0");
        assertEquals(moved.code, 0, said(moved) + (await b.agentLog()));
        assertEquals([macOf(moved), ipsOf(moved)], [
          macOf(first),
          ipsOf(first),
        ]);
        assert(
          await b.vpc.ping(onB, GATEWAY),
          "the pod pings its gateway from B",
        );
        const e = await cluster.cloudEni(eniId);
        assertEquals([e?.status, e?.instanceId], ["inuse", NODE_B]);
        await waitFor(
          "A to drop it from its status",
          async () => (await a.client.status()).sticky.parked.length === 0,
        );
        const statusB = await b.enim(["status"]);
        assertStringIncludes(
          statusB.stdout,
          "claimed by this node from the VPC",
        );
        assertStringIncludes(statusB.stdout, eniId);
        assertEquals(
          (await b.client.status()).sticky.claims.map((
            c,
          ) => [c.eniId, c.pod, c.from]),
          [[eniId, "default/db-0", NODE_A]],
        );
        await assertAttachmentsRecorded(cluster);
      },
    );

    await t.step(
      "a plain pod of the zone profile is not parked: its ENI stays on its node",
      async () => {
        const p = await pod(a, "web0-a");
        const r = await add(a, p, "c-web0-a", "web-0", false);
        assertEquals(r.code, 0, said(r));
        const eniId = await eniOfPod(a, "c-web0-a");
        assertEquals((await del(a, p, "c-web0-a", "web-0", false)).code, 0);
        const e = await cluster.cloudEni(eniId);
        assertEquals([e?.status, e?.instanceId], ["inuse", NODE_A]);
        assert(!decodeRecord(e?.description), "no sticky record");
        assertEquals((await a.client.status()).sticky.parked, []);
        assert(
          (await a.client.enis()).some((x) => x.id === eniId && x.state === "free"),
        );
      },
    );

    await t.step(
      `a sticky pod parked in zone ${ZONE_A} and re-created on a node of zone ${ZONE_B} is refused, naming both zones and the topology constraint; nothing is attached, and its ENI, still parked, is claimed by a node of its zone`,
      async () => {
        const onA = await pod(a, "db5-a");
        const first = await add(a, onA, "c-db5-a", "db-5");
        assertEquals(first.code, 0, said(first));
        const eniId = await eniOfPod(a, "c-db5-a");
        assertEquals((await del(a, onA, "c-db5-a", "db-5")).code, 0);
        await parkedIn(eniId);
        const before = await fake.state();
        const parked = before.enis.find((e) => e.eniId === eniId)!;
        const attachCalls = (st: typeof before) =>
          st.requests.filter((r) => r.path === `/v1/eni/${eniId}` && "attach" in r.query).length;

        const onC = await pod(c, "db5-c");
        const refused = await add(c, onC, "c-db5-c", "db-5");
        assert(refused.code !== 0, said(refused));
        assertEquals(refused.json?.code, 109, said(refused));
        const msg = String(refused.json?.msg);
        for (
          const part of [
            "The sticky pod's ENI is in another zone",
            eniId,
            `zone "${ZONE_A}"`,
            `zone "${ZONE_B}"`,
            INSTANCES.C,
            `Schedule the pod in zone "${ZONE_A}"`,
            'docs/sticky_pods.md, "Keep a StatefulSet in its zone"',
          ]
        ) {
          assertStringIncludes(msg, part);
        }
        // The runtime's DEL of the failed sandbox.
        assertEquals((await del(c, onC, "c-db5-c", "db-5")).code, 0);

        const after = await fake.state();
        assertEquals(attachCalls(after), attachCalls(before), "C never tried to attach it");
        const still = after.enis.find((e) => e.eniId === eniId);
        assertEquals(
          [still?.status, still?.instanceId, still?.description],
          ["available", parked.instanceId, parked.description],
          "the parked ENI is untouched",
        );
        assertEquals(await c.client.enis(), [], "C holds nothing");
        assertEquals(await c.client.attachments(), [], "C recorded nothing");
        assertEquals(
          (await a.client.status()).sticky.parked.map((x) => [x.eniId, x.state]),
          [[eniId, "parked"]],
          "A still lists it parked",
        );

        const onB = await pod(b, "db5-b");
        const moved = await add(b, onB, "c-db5-b", "db-5");
        assertEquals(moved.code, 0, said(moved) + (await b.agentLog()));
        assertEquals([macOf(moved), ipsOf(moved)], [macOf(first), ipsOf(first)]);
        assert(await b.vpc.ping(onB, GATEWAY), "the pod pings its gateway from B");
        await assertAttachmentsRecorded(cluster);
      },
    );

    await t.step(
      "two nodes claiming one parked ENI at once: one wins, the other gets a clear error, nothing attached twice or leaked",
      async () => {
        const p1 = await pod(a, "db1-a");
        assertEquals((await add(a, p1, "c-db1-a", "db-1")).code, 0);
        const eniId = await eniOfPod(a, "c-db1-a");
        assertEquals((await del(a, p1, "c-db1-a", "db-1")).code, 0);
        await parkedIn(eniId);
        const [pa, pb] = [await pod(a, "db1-a2"), await pod(b, "db1-b")];
        const [ra, rb] = await Promise.all([
          add(a, pa, "c-db1-a2", "db-1"),
          add(b, pb, "c-db1-b", "db-1"),
        ]);
        const codes = [ra.code, rb.code].sort();
        assertEquals(codes, [0, 1], `A ${said(ra)}; B ${said(rb)}`);
        const loser = ra.code === 0 ? rb : ra;
        assertEquals(loser.json?.code, 108, said(loser));
        assertStringIncludes(
          String(loser.json?.msg),
          "The sticky pod's ENI is held elsewhere",
        );
        assertStringIncludes(String(loser.json?.msg), eniId);
        const [winner, winnerId, lostNode] = ra.code === 0 ? [a, NODE_A, b] : [b, NODE_B, a];
        const state = await fake.state();
        const e = state.enis.find((x) => x.eniId === eniId)!;
        assertEquals([e.status, e.instanceId], ["inuse", winnerId]);
        assert(attaches(state, eniId).length >= 1);
        assert((await winner.client.enis()).some((x) => x.id === eniId));
        assert(
          !(await lostNode.client.enis()).some((x) => x.id === eniId),
          "the loser keeps nothing",
        );
        const ls = await lostNode.client.status();
        assertEquals(ls.providerDetails.claiming, 0);
        await assertAttachmentsRecorded(cluster);
        const winnerPod = ra.code === 0 ? pa : pb;
        assert(
          await winner.vpc.ping(winnerPod, GATEWAY),
          "the winner's pod pings its gateway",
        );
      },
    );

    await t.step(
      "A's agent killed: while BCE reports A running, B does not take the pod's ENI and says why; once A is stopped, B takes it",
      async () => {
        const p = await pod(a, "db2-a");
        const first = await add(a, p, "c-db2-a", "db-2");
        assertEquals(first.code, 0, said(first));
        const eniId = await eniOfPod(a, "c-db2-a");
        await waitFor(
          "the owned record",
          async () =>
            decodeRecord((await cluster.cloudEni(eniId))?.description)?.state ===
              "owned",
        );
        await a.stopAgent("SIGKILL");
        const onB = await pod(b, "db2-b");
        const refused = await add(b, onB, "c-db2-b1", "db-2");
        assertEquals(refused.json?.code, 108, said(refused));
        for (const part of [eniId, NODE_A, "Running", "never taken"]) {
          assertStringIncludes(String(refused.json?.msg), part);
        }
        assertEquals((await del(b, onB, "c-db2-b1", "db-2")).code, 0);
        assertEquals(
          (await cluster.cloudEni(eniId))?.instanceId,
          NODE_A,
          "left on A",
        );

        await fake.instanceStatus(NODE_A, "Stopped");
        const taken = await add(b, onB, "c-db2-b2", "db-2");
        assertEquals(taken.code, 0, said(taken) + (await b.agentLog()));
        assertEquals([macOf(taken), ipsOf(taken)], [
          macOf(first),
          ipsOf(first),
        ]);
        assert(
          await b.vpc.ping(onB, GATEWAY),
          "the pod pings its gateway from B",
        );

        // A boots again: the ENI is no longer its; it records that, and touches nothing.
        await fake.instanceStatus(NODE_A, "Running");
        await a.startAgent();
        // It shows LOST until the pod's DEL, or until A's GC finds the pod's device gone
        // (its veth left with the ENI) and forgets it first: either way, not A's any more.
        await waitFor(
          "A to see the ENI gone from it",
          async () => !(await a.client.enis()).some((x) => x.id === eniId && x.cloudState === "ok"),
        );
        assertEquals((await del(a, p, "c-db2-a", "db-2")).code, 0);
        assert(!(await a.client.enis()).some((x) => x.id === eniId));
        assertEquals(
          (await cluster.cloudEni(eniId))?.instanceId,
          NODE_B,
          "untouched by A",
        );
        await assertAttachmentsRecorded(cluster);
      },
    );

    await t.step(
      "kill -9 of A mid-park and of B mid-claim: the park is finished, the claim rolled back, never an ENI attached to a node without its record",
      async () => {
        const p = await pod(a, "db4-a");
        assertEquals((await add(a, p, "c-db4-a", "db-4")).code, 0);
        const eniId = await eniOfPod(a, "c-db4-a");
        await fake.delays(1500, 1500);
        assertEquals((await del(a, p, "c-db4-a", "db-4")).code, 0);
        await waitFor(
          "the detach to start",
          async () => (await cluster.cloudEni(eniId))?.status === "detaching",
        );
        await a.stopAgent("SIGKILL");
        await a.startAgent();
        await parkedIn(eniId);
        await waitFor(
          "A to finish the park",
          async () =>
            (await a.client.status()).sticky.parked.some((x) =>
              x.eniId === eniId && x.state === "parked"
            ),
        );
        await assertAttachmentsRecorded(cluster);

        const onB = await pod(b, "db4-b");
        const claiming = add(b, onB, "c-db4-b1", "db-4");
        await waitFor("the attach to start", async () => {
          const e = await cluster.cloudEni(eniId);
          return e?.status === "attaching" && e.instanceId === NODE_B;
        });
        await b.stopAgent("SIGKILL");
        const cut = await claiming;
        assert(cut.code !== 0, said(cut));
        await b.startAgent();
        await waitFor("B to roll the claim back", async () => {
          const e = await cluster.cloudEni(eniId);
          return e?.status === "available" &&
            decodeRecord(e.description)?.state === "parked" &&
            (await b.client.status()).providerDetails.claiming === 0;
        });
        await assertAttachmentsRecorded(cluster);
        await fake.delays(30, 30);
        assertEquals((await del(b, onB, "c-db4-b1", "db-4")).code, 0);
        const back = await add(b, onB, "c-db4-b2", "db-4");
        assertEquals(back.code, 0, said(back) + (await b.agentLog()));
        assertEquals(await eniOfPod(b, "c-db4-b2"), eniId);
        assert(
          await b.vpc.ping(onB, GATEWAY),
          "the pod pings its gateway from B",
        );
        await assertAttachmentsRecorded(cluster);
      },
    );

    await t.step(
      "seeded kills of either agent at random moments while a sticky pod moves between the nodes: reconcile finishes or rolls back, the invariant holds",
      async () => {
        const seed = Number(Deno.env.get("ENIM_STICKY_SEED") ?? 2026);
        const random = mulberry32(seed);
        await fake.delays(600, 600);
        const name = "mv-0";
        const nodes: [SimulatedNode, string][] = [[a, NODE_A], [b, NODE_B]];
        // The pod starts on A.
        let here = 0;
        let podNs = await pod(a, "mv-start");
        let cid = "c-mv-start";
        const first = await add(a, podNs, cid, name);
        assertEquals(first.code, 0, said(first));
        const sticky = await eniOfPod(a, cid);
        const rounds: string[] = [];
        for (let round = 0; round < 6; round++) {
          const [from, to] = [nodes[here][0], nodes[1 - here][0]];
          const toId = nodes[1 - here][1];
          const target = await pod(to, `mv${round}-${here === 0 ? "b" : "a"}`);
          const victim = random() < 0.5 ? from : to;
          const delay = Math.floor(random() * 1500);
          const oldNs = podNs, oldCid = cid;
          let attempts = 0;
          const move = (async () => {
            // The runtime retries a DEL until it succeeds, and a failed ADD with a new sandbox.
            while ((await del(from, oldNs, oldCid, name)).code !== 0) {
              await sleep(200);
            }
            for (;; attempts++) {
              const c = `c-mv${round}-${attempts}`;
              const r = await add(to, target, c, name);
              if (r.code === 0) return c;
              while ((await del(to, target, c, name)).code !== 0) {
                await sleep(200);
              }
              assert(
                attempts < 60,
                `the pod never got an ENI on ${toId}: ${said(r)}`,
              );
              await sleep(200);
            }
          })();
          await sleep(delay);
          await victim.stopAgent("SIGKILL");
          await victim.startAgent();
          cid = await move;
          podNs = target;
          here = 1 - here;
          const eniId = await eniOfPod(to, cid);
          await cluster.settle();
          await assertAttachmentsRecorded(cluster);
          const e = await cluster.cloudEni(eniId);
          assertEquals([e?.status, e?.instanceId], ["inuse", toId]);
          const holders = [];
          for (const [n] of nodes) {
            for (const att of await n.client.attachments()) {
              if (att.pod === `default/${name}` && att.state === "ready") {
                holders.push(att.eniId);
              }
            }
          }
          assertEquals(holders, [eniId], "the pod runs once, with this ENI");
          // Whatever was killed when, a DEL or ADD left half done is finished by a park:
          // the pod keeps its ENI through every move.
          assertEquals(eniId, sticky, `round ${round}: the pod kept its ENI`);
          assert(
            await to.vpc.ping(target, GATEWAY),
            "the moved pod pings its gateway",
          );
          rounds.push(
            `${victim === a ? "A" : "B"} killed ${delay} ms in, ${attempts} retries`,
          );
        }
        await fake.delays(30, 30);
        console.log(
          `seed ${seed} (ENIM_STICKY_SEED), ENI ${sticky}: ${rounds.join("; ")}`,
        );
      },
    );

    await t.step(
      "a parked ENI whose hold expires with no claim is reclaimed once",
      async () => {
        // A short hold: A restarts with sticky.holdSeconds 2.
        await a.stopAgent();
        await a.editConfig((cfg) => {
          cfg.sticky = { holdSeconds: 2 };
        });
        await a.startAgent();
        const before = (await expiries(a)) + (await expiries(b));
        const p = await pod(a, "db3-a");
        assertEquals((await add(a, p, "c-db3-a", "db-3")).code, 0);
        const eniId = await eniOfPod(a, "c-db3-a");
        assertEquals((await del(a, p, "c-db3-a", "db-3")).code, 0);
        await waitFor(
          "the expired ENI to be deleted",
          async () => !(await cluster.cloudEni(eniId)),
        );
        const state = await fake.state();
        const deletes = state.requests.filter((r) =>
          r.method === "DELETE" && r.path === `/v1/eni/${eniId}` &&
          r.status === 200
        );
        assertEquals(deletes.length, 1, "deleted once");
        await waitFor(
          "the expiry to be counted once",
          async () => (await expiries(a)) + (await expiries(b)) === before + 1,
        );
        await waitFor(
          "A's status to drop it",
          async () => !(await a.client.status()).sticky.parked.some((x) => x.eniId === eniId),
        );
        await assertAttachmentsRecorded(cluster);
      },
    );

    await t.step("no secret reached a log line", async () => {
      for (const log of [await a.agentLog(), await b.agentLog()]) {
        assert(!log.includes(SECRET), "the secret key is never logged");
      }
    });
  },
});
