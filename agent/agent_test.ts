import { z } from "zod";
import { DatabaseSync } from "node:sqlite";
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { type AgentDeps, runAgent, startPeriodic } from "./agent.ts";
import { resolveConfig } from "./config.ts";
import { SocketAgentClient } from "../api/client.ts";
import { FakeManager } from "../tests/support/fake_manager.ts";
import { Logger } from "../lib/log.ts";
import { FakeDeviceLayer } from "../netns/fake.ts";
import { defaultProfile, type Eni, type Provider } from "../providers/contract.ts";
import { withRunDir } from "../tests/support/run_dir.ts";

function fakeProvider(closed: string[]): Provider {
  return {
    name: "mock",
    list: () => Promise.resolve([] as Eni[]),
    allocateNextENI: () => Promise.reject(new Error("unused")),
    deallocateENI: () => Promise.resolve(),
    status: () =>
      Promise.resolve({
        name: "mock",
        free: 0,
        owned: 0,
        attachable: 0,
        details: {},
        profiles: {},
      }),
    profiles: () => [defaultProfile()],
    close: () => {
      closed.push("provider");
      return Promise.resolve();
    },
  };
}

Deno.test("the agent starts, reconciles, serves, runs GC, and shuts down in order", async () => {
  await withRunDir(async (dir) => {
    const cfg = resolveConfig({
      file: {
        path: "agent.jsonc",
        text: JSON.stringify({
          socket: `${dir}/api/enim.sock`,
          statePath: `${dir}/state/enim.db`,
          provider: { name: "mock", mock: { enis: 2 } },
          gc: { intervalSeconds: 0.05 },
          devices: "fake",
        }),
      },
    });
    const m = new FakeManager();
    const closed: string[] = [];
    // A source the wiring adds (as a Kubernetes one would be).
    const extra = { name: "kubernetes-example", dead: () => Promise.resolve(new Map()) };
    let providerConfig: unknown;
    const deps: AgentDeps = {
      openDatabase: (p) => new DatabaseSync(p),
      loadProvider: () =>
        Promise.resolve({
          configSchema: z.object({ enis: z.number() }),
          create: (c) => {
            providerConfig = c;
            return Promise.resolve(fakeProvider(closed));
          },
        }),
      createDevices: () => Promise.resolve({ devices: new FakeDeviceLayer() }),
      loadDeviceSimulator: () => Promise.resolve(undefined),
      livenessSources: () => [extra],
      createManager: (o) => {
        assertEquals(o.gcGraceMs, 30_000);
        assertEquals(o.livenessSources?.map((s) => s.name), [
          "unfinished",
          "netns",
          "cni-gc",
          "recycling",
          "kubernetes-example",
        ]);
        const close = m.close.bind(m);
        m.close = () => {
          closed.push("manager");
          return close();
        };
        return m;
      },
    };
    const lines: string[] = [];
    const stop = new AbortController();
    let ready!: () => void;
    const isReady = new Promise<void>((r) => (ready = r));
    const running = runAgent(cfg, {
      deps,
      log: new Logger((l) => lines.push(l), "debug"),
      signal: stop.signal,
      onReady: () => ready(),
    });
    await isReady;
    try {
      assertEquals(providerConfig, { enis: 2 });
      assertEquals((await Deno.stat(`${dir}/state`)).mode! & 0o777, 0o700);
      assertEquals(m.calls[0].op, "reconcile");
      const c = new SocketAgentClient(cfg.socket);
      assertEquals((await c.status()).ready, true);
      // GC runs once at start-up and then periodically.
      for (let i = 0; i < 100 && m.calls.filter((x) => x.op === "gc").length < 2; i++) {
        await new Promise((r) => setTimeout(r, 20));
      }
      assert(m.calls.filter((x) => x.op === "gc").length >= 2, "GC did not run periodically");
    } finally {
      stop.abort();
      await running;
    }
    assertEquals(closed, ["manager", "provider"]);
    assert(m.closed);
    let gone = false;
    try {
      await Deno.lstat(cfg.socket);
    } catch {
      gone = true;
    }
    assert(gone, "the socket file was left behind");
    assertMatch(lines.join("\n"), /"msg":"stopped"/);
  });
});

Deno.test("startPeriodic never overlaps a slow pass", async () => {
  let active = 0;
  let maxActive = 0;
  let runs = 0;
  const p = startPeriodic(1, async () => {
    active++;
    runs++;
    maxActive = Math.max(maxActive, active);
    await new Promise((r) => setTimeout(r, 15));
    active--;
  });
  await new Promise((r) => setTimeout(r, 80));
  await p.stop();
  assertEquals(maxActive, 1);
  assert(runs >= 2 && runs <= 6, `runs: ${runs}`);
  assertEquals(active, 0);
});
