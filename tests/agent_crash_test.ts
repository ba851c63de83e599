/**
 * The crash test: the real agent, driven through its API by a seeded PRNG, is
 * killed with SIGKILL at random points and restarted on the same state file;
 * after each restart (reconcile runs before the API answers) the state must hold:
 *
 * - no ENI is owned twice, and every ENI is free or owned by exactly one live
 *   attachment (and that attachment holds it);
 * - nothing is left half done (no attachment `adding` or `deleting`);
 * - every ADD the client was told succeeded (and not DELeted since) is still
 *   there with the same ENI; every acknowledged DEL stays gone.
 *
 * ENIM_CRASH_SEED and ENIM_CRASH_KILLS change the seed and the number of kills.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { type AddRequest, ApiError } from "../api/schema.ts";
import { AgentUnreachableError, SocketAgentClient } from "../api/client.ts";
import { type AgentProcess, fakeDevicesConfig, prng, startAgent } from "./support/agent_proc.ts";
import { withSandbox } from "./support/run_dir.ts";

const SEED = Number(Deno.env.get("ENIM_CRASH_SEED") ?? 20261122);
const KILLS = Number(Deno.env.get("ENIM_CRASH_KILLS") ?? 60);
const PODS = 10;
const ENIS = 8;

/** What the client knows about one attachment key. */
type Known =
  | { state: "added"; eniId: string } // ADD acknowledged
  | { state: "deleted" } // DEL acknowledged (or never added)
  | { state: "unknown" }; // the agent died (or refused) mid-request

function addReq(pod: number, gen: number): AddRequest {
  return {
    containerId: `ctr-${pod}-${gen}`,
    ifName: "eth0",
    netns: `/run/netns/pod-${pod}`,
    network: "enim-net",
    pod: { namespace: "crash", name: `pod-${pod}` },
    mode: "interface",
  };
}

/** Checks the invariants against the restarted agent. */
async function checkInvariants(c: SocketAgentClient, known: Map<string, Known>, round: number) {
  const [atts, enis] = await Promise.all([c.attachments(), c.enis()]);
  const where = `after restart ${round}`;
  const byEni = new Map<string, string[]>();
  for (const a of atts) {
    assert(
      a.state === "ready" || a.state === "recycling",
      `${where}: ${a.containerId} left in state "${a.state}"`,
    );
    if (a.eniId) byEni.set(a.eniId, [...(byEni.get(a.eniId) ?? []), a.containerId]);
  }
  for (const [eni, holders] of byEni) {
    assertEquals(holders.length, 1, `${where}: ${eni} owned by ${holders.join(", ")}`);
  }
  for (const e of enis) {
    const holders = byEni.get(e.id) ?? [];
    if (e.state === "free") {
      assertEquals(holders, [], `${where}: ${e.id} is free but recorded for ${holders}`);
    } else {
      assertEquals(
        holders.length,
        1,
        `${where}: ${e.id} owned by the provider but by no attachment`,
      );
      assertEquals(e.owner?.containerId, holders[0], `${where}: ${e.id} owner mismatch`);
    }
  }
  const attByKey = new Map(atts.map((a) => [a.containerId, a]));
  for (const [key, k] of known) {
    const a = attByKey.get(key);
    if (k.state === "added") {
      assert(a, `${where}: acknowledged ADD ${key} was lost`);
      assertEquals(a.eniId, k.eniId, `${where}: ${key} changed ENI`);
    } else if (k.state === "deleted") {
      assertEquals(a, undefined, `${where}: acknowledged DEL ${key} came back`);
    }
  }
}

Deno.test({
  name: `the agent survives ${KILLS} SIGKILLs at random points (seed ${SEED})`,
  fn: async () => {
    await withSandbox(async (dir, sb) => {
      const rand = prng(SEED);
      const pick = (n: number) => Math.floor(rand() * n);
      const config = fakeDevicesConfig(
        dir,
        { enis: ENIS, preattached: ENIS / 2, attachLatencyMs: 2, seed: SEED },
        { statePath: `${dir}/enim.db`, log: { level: "warn" } },
      );
      const known = new Map<string, Known>();
      /** Per pod: the generation of its current container id. */
      const gen = Array.from({ length: PODS }, () => 0);
      let inFlightKills = 0;
      let ops = 0;
      let agent: AgentProcess | undefined;
      try {
        for (let round = 0; round < KILLS; round++) {
          agent = await startAgent(sb, config);
          const c = new SocketAgentClient(agent.socket, 5000);
          if (round > 0) await checkInvariants(c, known, round);
          // Settle what the last kill left unknown: a DEL (idempotent) resolves both ways.
          for (const [key, k] of known) {
            if (k.state !== "unknown") continue;
            await c.del({ containerId: key, ifName: "eth0" });
            known.set(key, { state: "deleted" });
          }
          // A burst of concurrent operations, and a kill at a random moment inside it.
          const burst = 2 + pick(7);
          const pending: Promise<void>[] = [];
          let settled = 0;
          const usedPods = new Set<number>();
          for (let i = 0; i < burst; i++) {
            const pod = pick(PODS);
            if (usedPods.has(pod)) continue; // one operation per pod per burst
            usedPods.add(pod);
            const cur = `ctr-${pod}-${gen[pod]}`;
            const holds = known.get(cur)?.state === "added";
            const doAdd = !holds || rand() < 0.3;
            ops++;
            if (doAdd) {
              // A new container for the pod (the old one, if any, stays until its DEL).
              if (holds) gen[pod]++;
              const key = `ctr-${pod}-${gen[pod]}`;
              known.set(key, { state: "unknown" });
              pending.push(
                c.add(addReq(pod, gen[pod])).then(
                  (r) => void known.set(key, { state: "added", eniId: r.eniId }),
                  (err) => {
                    // A refused ADD (pool empty) leaves nothing; the runtime DELs anyway.
                    if (!(err instanceof ApiError || err instanceof AgentUnreachableError)) {
                      throw err;
                    }
                  },
                ).finally(() => void settled++),
              );
            } else {
              // DEL the pod's current container, or one of its older ones still held.
              const olds = [...known].filter(([k, v]) =>
                k.startsWith(`ctr-${pod}-`) && v.state === "added"
              );
              const key = olds[pick(olds.length)][0];
              known.set(key, { state: "unknown" });
              pending.push(
                c.del({ containerId: key, ifName: "eth0" }).then(
                  () => void known.set(key, { state: "deleted" }),
                  (err) => {
                    if (!(err instanceof ApiError || err instanceof AgentUnreachableError)) {
                      throw err;
                    }
                  },
                ).finally(() => void settled++),
              );
            }
          }
          // Skewed towards early kills, while requests are still in flight.
          await new Promise((r) => setTimeout(r, Math.floor(rand() * rand() * 15)));
          if (settled < pending.length) inFlightKills++;
          await agent.stop("SIGKILL");
          await Promise.all(pending);
        }
        // Last restart: the invariants hold, then everything can be DELeted cleanly.
        agent = await startAgent(sb, config);
        const c = new SocketAgentClient(agent.socket, 5000);
        await checkInvariants(c, known, KILLS);
        for (const key of known.keys()) await c.del({ containerId: key, ifName: "eth0" });
        const end = await c.status();
        assertEquals(end.pool.owned, 0);
        assertEquals(await c.attachments(), []);
        console.log(
          `crash test: seed ${SEED}, ${KILLS} SIGKILLs (${inFlightKills} with requests in flight), ` +
            `${ops} operations`,
        );
      } finally {
        await agent?.stop("SIGKILL");
      }
    });
  },
});
