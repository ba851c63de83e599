import { assertEquals, assertThrows } from "./assert.ts";
import { Counter, Gauge, Histogram, Registry } from "./prometheus.ts";

/**
 * prom-client 15.1.3's exposition of the scenario below, byte for byte: the
 * format enim's /metrics had before this module replaced prom-client.
 */
const PROM_CLIENT_TEXT = `# HELP t_duration_seconds A histogram, by op and phase
# TYPE t_duration_seconds histogram
t_duration_seconds_bucket{le="0.001",op="add",phase="move"} 0
t_duration_seconds_bucket{le="0.01",op="add",phase="move"} 1
t_duration_seconds_bucket{le="0.1",op="add",phase="move"} 2
t_duration_seconds_bucket{le="1",op="add",phase="move"} 2
t_duration_seconds_bucket{le="+Inf",op="add",phase="move"} 3
t_duration_seconds_sum{op="add",phase="move"} 7.1025
t_duration_seconds_count{op="add",phase="move"} 3
t_duration_seconds_bucket{le="0.001",phase="provider",op="add"} 1
t_duration_seconds_bucket{le="0.01",phase="provider",op="add"} 1
t_duration_seconds_bucket{le="0.1",phase="provider",op="add"} 1
t_duration_seconds_bucket{le="1",phase="provider",op="add"} 1
t_duration_seconds_bucket{le="+Inf",phase="provider",op="add"} 1
t_duration_seconds_sum{phase="provider",op="add"} 0.0001
t_duration_seconds_count{phase="provider",op="add"} 1
t_duration_seconds_bucket{le="0.001",op="del",phase="move"} 0
t_duration_seconds_bucket{le="0.01",op="del",phase="move"} 0
t_duration_seconds_bucket{le="0.1",op="del",phase="move"} 0
t_duration_seconds_bucket{le="1",op="del",phase="move"} 1
t_duration_seconds_bucket{le="+Inf",op="del",phase="move"} 1
t_duration_seconds_sum{op="del",phase="move"} 0.3
t_duration_seconds_count{op="del",phase="move"} 1

# HELP t_ops_total Help with a backslash \\\\ and a\\nnewline
# TYPE t_ops_total counter
t_ops_total{op="add",result="ok"} 3
t_ops_total{result="error",op="del"} 1

# HELP t_empty_total Never incremented
# TYPE t_empty_total counter

# HELP t_pool A gauge read at scrape time
# TYPE t_pool gauge
t_pool{state="free"} 3
t_pool{state="owned"} 0.5

# HELP t_plain_total No labels
# TYPE t_plain_total counter
t_plain_total 0.30000000000000004

# HELP t_plain_seconds No labels either
# TYPE t_plain_seconds histogram
t_plain_seconds_bucket{le="1"} 0
t_plain_seconds_bucket{le="2"} 1
t_plain_seconds_bucket{le="+Inf"} 1
t_plain_seconds_sum 1.5
t_plain_seconds_count 1

# HELP t_sync Synchronous collect
# TYPE t_sync gauge
t_sync{kind="quote \\" back \\\\ nl \\n"} -2
t_sync{kind="big"} 1e+21
`;

Deno.test("the exposition is prom-client's, byte for byte", async () => {
  const registry = new Registry();
  const registers = [registry];
  const h = new Histogram({
    name: "t_duration_seconds",
    help: "A histogram, by op and phase",
    labelNames: ["op", "phase"],
    buckets: [0.001, 0.01, 0.1, 1],
    registers,
  });
  const c = new Counter({
    name: "t_ops_total",
    help: "Help with a backslash \\ and a\nnewline",
    labelNames: ["op", "result"],
    registers,
  });
  new Counter({
    name: "t_empty_total",
    help: "Never incremented",
    labelNames: ["result"],
    registers,
  });
  new Gauge({
    name: "t_pool",
    help: "A gauge read at scrape time",
    labelNames: ["state"],
    registers,
    async collect() {
      await Promise.resolve();
      this.set({ state: "free" }, 3);
      this.set({ state: "owned" }, 0.5);
    },
  });
  const plain = new Counter({ name: "t_plain_total", help: "No labels", registers });
  const plainH = new Histogram({
    name: "t_plain_seconds",
    help: "No labels either",
    buckets: [1, 2],
    registers,
  });
  new Gauge({
    name: "t_sync",
    help: "Synchronous collect",
    labelNames: ["kind"],
    registers,
    collect() {
      this.set({ kind: 'quote " back \\ nl \n' }, -2);
      this.set({ kind: "big" }, 1e21);
    },
  });
  h.observe({ op: "add", phase: "move" }, 0.0025);
  h.observe({ op: "add", phase: "move" }, 0.1);
  h.observe({ op: "add", phase: "move" }, 7);
  h.observe({ phase: "provider", op: "add" }, 0.0001);
  h.observe({ op: "del", phase: "move" }, 0.3);
  c.inc({ op: "add", result: "ok" });
  c.inc({ op: "add", result: "ok" }, 2);
  c.inc({ result: "error", op: "del" });
  plain.inc({}, 0.1);
  plain.inc({}, 0.2);
  plainH.observe({}, 1.5);
  assertEquals(await registry.metrics(), PROM_CLIENT_TEXT);
  assertEquals(registry.contentType, "text/plain; version=0.0.4; charset=utf-8");
});

Deno.test("metrics refuse bad names, unknown labels and bad values", () => {
  const registry = new Registry();
  const c = new Counter({ name: "c_total", help: "c", labelNames: ["a"], registers: [registry] });
  assertThrows(() => new Counter({ name: "c_total", help: "again", registers: [registry] }));
  assertThrows(() => new Counter({ name: "bad-name", help: "x" }));
  assertThrows(() => new Counter({ name: "x", help: "x", labelNames: ["bad-label"] }));
  assertThrows(() => new Histogram({ name: "h", help: "h", labelNames: ["le"], buckets: [1] }));
  assertThrows(() => c.inc({ a: "1", b: "2" } as { a: string }));
  assertThrows(() => c.inc({ a: "1" }, -1));
  const h = new Histogram({ name: "h", help: "h", labelNames: ["a"], buckets: [1] });
  assertThrows(() => h.observe({ a: "1" }, Number.NaN));
});
