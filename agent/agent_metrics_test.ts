/**
 * GET /metrics of a running agent (real manager, mock provider, fake devices)
 * carries the per-phase histograms, operation counters, provider latency and
 * pool gauges once an ADD and a DEL went through. No timing assertions: only
 * that each series exists and counted the operation.
 */
import { assert, assertMatch } from "../lib/assert.ts";
import { runAgent } from "./agent.ts";
import { defaultDeps } from "./deps.ts";
import { resolveConfig } from "./config.ts";
import { SocketAgentClient } from "../api/client.ts";
import { Logger } from "../lib/log.ts";
import { withRunDir } from "../tests/support/run_dir.ts";

Deno.test("GET /metrics carries the phase histograms after an ADD and a DEL", async () => {
  await withRunDir(async (dir) => {
    const cfg = resolveConfig({
      file: {
        path: "agent.jsonc",
        text: JSON.stringify({
          socket: `${dir}/enim.sock`,
          statePath: `${dir}/enim.db`,
          provider: { name: "mock", mock: { enis: 2 } },
          gc: { intervalSeconds: 3600 },
          devices: "fake",
        }),
      },
    });
    const abort = new AbortController();
    let ready!: () => void;
    const served = new Promise<void>((r) => ready = r);
    const running = runAgent(cfg, {
      deps: defaultDeps,
      log: new Logger(() => {}),
      signal: abort.signal,
      onReady: () => ready(),
    });
    try {
      await served;
      const client = new SocketAgentClient(cfg.socket, 10_000);
      const key = { containerId: "c-metrics", ifName: "eth0" };
      await client.add({
        ...key,
        netns: `${dir}/netns-a`,
        network: "net",
        pod: { namespace: "default", name: "a" },
        mode: "interface",
      });
      const afterAdd = await client.metrics();
      for (
        const phase of [
          "queue_wait",
          "netns_check",
          "provider",
          "move",
          "configure",
          "state_write",
        ]
      ) {
        assertMatch(
          afterAdd,
          new RegExp(`enim_phase_duration_seconds_count\\{op="add",phase="${phase}"\\} 1\\n`),
        );
      }
      assertMatch(
        afterAdd,
        /enim_phase_duration_seconds_bucket\{le="\+Inf",op="add",phase="move"\} 1/,
      );
      // The device layer knew the device's node name: an interface ADD looks nothing up.
      assert(!/op="add",phase="device_lookup"/.test(afterAdd), "no device_lookup on ADD");
      assertMatch(afterAdd, /enim_operations_total\{op="add",result="ok"\} 1/);
      assertMatch(afterAdd, /enim_operation_duration_seconds_count\{op="add",result="ok"\} 1/);
      assertMatch(
        afterAdd,
        /enim_provider_call_duration_seconds_count\{provider="mock",call="allocate",result="ok"\} 1/,
      );
      assertMatch(afterAdd, /enim_pool_enis\{profile="default",state="owned"\} 1/);
      assertMatch(afterAdd, /enim_pool_enis\{profile="default",state="free"\} 1/);
      assertMatch(afterAdd, /# TYPE enim_gc_reclaims_total counter/);

      await client.del({ ...key, netns: `${dir}/netns-a` });
      const afterDel = await client.metrics();
      assertMatch(afterDel, /enim_phase_duration_seconds_count\{op="del",phase="move"\} 1/);
      assertMatch(afterDel, /enim_phase_duration_seconds_count\{op="del",phase="provider"\} 1/);
      assertMatch(afterDel, /enim_operations_total\{op="del",result="ok"\} 1/);
      assertMatch(afterDel, /enim_pool_enis\{profile="default",state="owned"\} 0/);
    } finally {
      abort.abort();
      await running;
    }
  });
});
