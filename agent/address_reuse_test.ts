/**
 * The reuse wait against the test API server's pods (kube/ cache): when a freed ENI's
 * addresses may go to another pod.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { testKube, until, withTestApiServer } from "../tests/support/enforcer_fixtures.ts";
import { makePod } from "../tests/support/kube_objects.ts";
import { nullLogger } from "../lib/log.ts";
import { ReuseWaits } from "./address_reuse.ts";

/** Whether `p` settles within `ms`. */
async function settles(p: Promise<void>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<boolean>((r) => timer = setTimeout(() => r(false), ms));
  try {
    return await Promise.race([p.then(() => true), late]);
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("a freed ENI's addresses wait while the API shows a running pod with them: until its final status, its deletion, the bound, or the agent's stop", async () => {
  await withTestApiServer(async (server) => {
    const kube = testKube(server);
    const stop = new AbortController();
    try {
      const b = makePod({ namespace: "y", name: "b", nodeName: "n1", ip: "10.0.0.2" });
      server.put("pods", b);
      assert(await kube.pods.waitSynced(10_000));
      const waits = new ReuseWaits(kube.pods);
      /** Waits until the cache holds the object's resourceVersion of `key`. */
      const seen = async (key: string) => {
        const rv = server.get("pods", key)!.metadata.resourceVersion;
        await until(
          `${key} at ${rv} in the cache`,
          () => kube.pods.get(key)?.metadata.resourceVersion === rv,
        );
      };
      const o = { boundMs: 60_000, signal: stop.signal, log: nullLogger };
      assertEquals(waits.wait(["10.0.0.9"], o), null, "nobody holds it: at once");
      assertEquals(waits.wait(["10.0.0.2"], { ...o, boundMs: 0 }), null, "the wait is off");

      // Terminating within its grace period: it still holds the address.
      b.metadata.deletionTimestamp = new Date().toISOString();
      b.metadata.deletionGracePeriodSeconds = 30;
      server.put("pods", b);
      await seen("y/b");
      const w1 = waits.wait(["10.0.0.2"], o)!;
      assert(w1 !== null && !(await settles(w1, 300)), "it waits");
      b.status.phase = "Failed";
      server.put("pods", b);
      assert(await settles(w1, 10_000), "its final status ends the wait");

      // Deleted without grace: none of it runs.
      const c = makePod({ namespace: "y", name: "c", nodeName: "n1", ip: "10.0.0.3" });
      c.metadata.deletionTimestamp = new Date().toISOString();
      c.metadata.deletionGracePeriodSeconds = 0;
      server.put("pods", c);
      const d = makePod({ namespace: "y", name: "d", nodeName: "n1", ip: "10.0.0.4" });
      server.put("pods", d);
      await seen("y/c");
      await seen("y/d");
      const w2 = waits.wait(["10.0.0.4"], o)!;
      assert(w2 !== null, "d holds its address");
      assertEquals(waits.wait(["10.0.0.3"], o), null, "c, deleted without grace, holds nothing");
      server.remove("pods", "y", "d");
      assert(await settles(w2, 10_000), "d's deletion ends the wait");

      // The bound.
      const e = makePod({ namespace: "y", name: "e", nodeName: "n1", ip: "10.0.0.5" });
      server.put("pods", e);
      await seen("y/e");
      const w3 = waits.wait(["10.0.0.5"], { ...o, boundMs: 300 })!;
      assert(w3 !== null && await settles(w3, 10_000), "bounded");

      // The agent stops.
      const g = makePod({ namespace: "y", name: "g", nodeName: "n1", ip: "10.0.0.6" });
      server.put("pods", g);
      await seen("y/g");
      const w5 = waits.wait(["10.0.0.6"], o)!;
      stop.abort();
      assert(await settles(w5, 1_000), "stopping ends it");
    } finally {
      stop.abort();
      await kube.close();
    }
  });
});
