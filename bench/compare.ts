/**
 * Two commits' benches in one alternating run (a check to run by hand, as root; not a test):
 * enim at `--base` (default `295bf8b`, before the NetworkPolicy hardening) against this work
 * tree, each running its own bench files and its own built bundle, in pairs whose order flips
 * (base, this; this, base; …) so that the machine's drift lands on both sides. Each pair runs,
 * per tree:
 *
 * - `bench/main.ts --quick --no-cri --soak 0`: the serial CNI ADD/DEL against the running
 *   agent (policy off: the bench's agent has no kubeconfig), and the start-up floor;
 * - `bench/policy_agent.ts` (`--pods`, `--policies`, `--adds`, `--policy-rounds` are passed
 *   on): the first sync, event to enforcement, CPU per event, ADD p50 with policy on and off.
 *
 * It prints each figure per run and the median of the runs per tree, with this tree's
 * median minus the base's, and writes them to `--out` (default `bench-compare.json`).
 *
 *     deno run -A --config tests/deno.json bench/compare.ts [--base REF] [--pairs N]
 *       [--pods N] [--policies N] [--adds N] [--policy-rounds N] [--iterations N]
 *       [--skip-policy] [--out FILE]
 *
 * `--iterations` is bench/main.ts's (timed serial iterations; `--quick` gives 15);
 * `--skip-policy` runs bench/main.ts alone.
 *
 * The base is checked out into a temporary git worktree, removed at the end.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { ROOT } from "../scripts/_paths.ts";
import { aptNeedsOf, ensureApt, isRoot } from "../scripts/_deps.ts";
import { addWorktree } from "../scripts/_worktree.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    base: { type: "string", default: "295bf8b" },
    pairs: { type: "string", default: "2" },
    pods: { type: "string", default: "30000" },
    policies: { type: "string", default: "3000" },
    adds: { type: "string", default: "20" },
    "policy-rounds": { type: "string", default: "2" },
    iterations: { type: "string" },
    "skip-policy": { type: "boolean", default: false },
    out: { type: "string", default: join(ROOT, "bench-compare.json") },
  },
});
if (!isRoot()) {
  console.error("The bench builds network namespaces and needs root: run it as root.");
  Deno.exit(2);
}
const PAIRS = Number(values.pairs);
// This tree's list of what the benches need, installed once for both trees: an older base may
// lack a package its own bench uses but never installed (295bf8b's bench ran nft without
// installing nftables).
const unmet = await ensureApt([...aptNeedsOf("bench"), ...aptNeedsOf("test")]);
if (unmet.length > 0) {
  console.error(`The benches need ${unmet.join(", ")}, which could not be installed.`);
  Deno.exit(2);
}

/** One figure: where it is in a run's results, and its unit. */
interface Figure {
  name: string;
  unit: string;
  /** Reads it from one run's results (undefined: that run has no such figure). */
  of: (r: RunResult) => number | undefined;
}

/** What one tree's run produced. */
interface RunResult {
  // deno-lint-ignore no-explicit-any
  bench: Record<string, any>;
  // deno-lint-ignore no-explicit-any
  policy: Record<string, any>;
}

const FIGURES: Figure[] = [
  {
    name: "CNI ADD p50, policy off (bench serial)",
    unit: "ms",
    of: (r) => r.bench.serial?.enim?.ADD?.p50,
  },
  {
    name: "CNI DEL p50, policy off (bench serial)",
    unit: "ms",
    of: (r) => r.bench.serial?.enim?.DEL?.p50,
  },
  {
    name: "reference host-device ADD p50 (machine drift)",
    unit: "ms",
    of: (r) => r.bench.serial?.reference?.ADD?.p50,
  },
  {
    name: "CNI ADD p50 over the reference's (bench serial)",
    unit: "×",
    of: (r) => r.bench.ratio?.ADD?.p50,
  },
  {
    name: "the agent's ADD alone through its API, p50 (bench agent API)",
    unit: "ms",
    of: (r) => r.bench.agentApiAlone?.ADD?.p50,
  },
  {
    name: "the agent's ADD operation, mean (bench serial)",
    unit: "ms",
    of: (r) => r.bench.agentOperationMeanMs?.add,
  },
  { name: "policy bench: first sync", unit: "ms", of: (r) => r.policy.firstSync?.ms },
  ...(["p50", "p90", "p99"] as const).map((q): Figure => ({
    name: `policy bench: API write to status enforced, ${q}`,
    unit: "ms",
    of: (r) => r.policy.eventToEnforcement?.all?.[q],
  })),
  { name: "policy bench: CPU per event", unit: "ms", of: (r) => r.policy.cpuPerEventMs },
  {
    name: "policy bench: ADD p50, policy off",
    unit: "ms",
    of: (r) => r.policy.add?.policyOff?.p50,
  },
  {
    name: "policy bench: ADD p50, policy on, selected",
    unit: "ms",
    of: (r) => r.policy.add?.policyOn?.p50,
  },
  {
    name: "policy bench: ADD p50, policy on, not selected",
    unit: "ms",
    of: (r) => r.policy.add?.policyOnNotSelected?.p50,
  },
  {
    name: "policy bench: settled ADD p50, policy off",
    unit: "ms",
    of: (r) => r.policy.add?.settled?.policyOff?.p50,
  },
  {
    name: "policy bench: settled ADD p50, policy on, selected",
    unit: "ms",
    of: (r) => r.policy.add?.settled?.policyOn?.p50,
  },
  { name: "policy bench: agent VmHWM at its peak", unit: "MB", of: (r) => r.policy.end?.vmHwmMB },
];

async function run(cmd: string[], cwd: string): Promise<string> {
  const out = await new Deno.Command(cmd[0], {
    args: cmd.slice(1),
    cwd,
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!out.success) throw new Error(`${cmd.join(" ")} in ${cwd} exited ${out.code}`);
  return new TextDecoder().decode(out.stdout);
}

/** `deno run -A --config tests/deno.json <script> <args>` in `tree`: its stdout. */
function denoRun(tree: string, script: string, args: string[]): Promise<string> {
  return run([Deno.execPath(), "run", "-A", "--config", "tests/deno.json", script, ...args], tree);
}

/** Runs both benches in one tree and returns their results. */
async function runTree(tree: string, label: string, n: number): Promise<RunResult> {
  const benchOut = await Deno.makeTempFile({ prefix: "enim-compare-", suffix: ".json" });
  try {
    console.error(`--- run ${n}: ${label}: bench/main.ts --quick --no-cri --soak 0`);
    await denoRun(tree, "bench/main.ts", [
      "--quick",
      "--no-cri",
      "--soak",
      "0",
      "--out",
      benchOut,
      ...(values.iterations ? ["--iterations", values.iterations] : []),
    ]);
    const bench = JSON.parse(await Deno.readTextFile(benchOut));
    if (values["skip-policy"]) return { bench, policy: {} };
    console.error(`--- run ${n}: ${label}: bench/policy_agent.ts`);
    const text = await denoRun(tree, "bench/policy_agent.ts", [
      "--pods",
      values.pods,
      "--policies",
      values.policies,
      "--adds",
      values.adds,
      "--rounds",
      values["policy-rounds"],
    ]);
    const policy = JSON.parse(text.slice(text.indexOf("{")));
    return { bench, policy };
  } finally {
    await Deno.remove(benchOut).catch(() => {});
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
/** A figure as printed: two decimals below 10 (a ratio), else one. */
const fmt = (v: number | undefined) =>
  v === undefined
    ? "–"
    : String(Math.round(v * (Math.abs(v) < 10 ? 100 : 10)) / (Math.abs(v) < 10 ? 100 : 10));

const head = (await run(["git", "rev-parse", "--short", "HEAD"], ROOT)).trim();
const baseRev = (await run(["git", "rev-parse", "--short", values.base], ROOT)).trim();
const base = await addWorktree(baseRev, { prefix: "enim-base-" });
const baseTree = base.path;
const results: Record<"base" | "head", RunResult[]> = { base: [], head: [] };
const failed: string[] = [];
try {
  for (let p = 0; p < PAIRS; p++) {
    const order: ("base" | "head")[] = p % 2 === 0 ? ["base", "head"] : ["head", "base"];
    for (const which of order) {
      const tree = which === "base" ? baseTree : ROOT;
      const label = which === "base" ? `base ${baseRev}` : `head ${head}`;
      const n = results.base.length + results.head.length + failed.length + 1;
      // A run that fails (a bench of either tree may be flaky) is tried once more, then left
      // out, said, and the rest goes on: the runs already made are not lost.
      const r = await runTree(tree, label, n).catch((err) => {
        console.error(`--- run ${n}: ${label} failed (${err.message}); once more`);
        return runTree(tree, label, n);
      }).catch((err) => {
        console.error(`--- run ${n}: ${label} failed again, left out: ${err.message}`);
        failed.push(`run ${n}: ${label}: ${err.message}`);
        return null;
      });
      if (r) results[which].push(r);
    }
  }
} finally {
  await base.remove();
}

const table: Record<string, unknown>[] = [];
console.log(
  `\nbase ${baseRev} against head ${head}, ${PAIRS} alternating pairs (medians of the runs)`,
);
for (const f of failed) console.log(`  left out: ${f}`);
for (const f of FIGURES) {
  const b = results.base.map(f.of).filter((v): v is number => typeof v === "number");
  const h = results.head.map(f.of).filter((v): v is number => typeof v === "number");
  const mb = b.length ? median(b) : undefined;
  const mh = h.length ? median(h) : undefined;
  const delta = mb !== undefined && mh !== undefined ? mh - mb : undefined;
  table.push({
    figure: f.name,
    unit: f.unit,
    base: b,
    head: h,
    baseMedian: mb,
    headMedian: mh,
    delta,
  });
  console.log(
    `  ${f.name} (${f.unit}): base ${b.map(fmt).join(", ")} → median ${fmt(mb)}; head ${
      h.map(fmt).join(", ")
    } → median ${fmt(mh)}; head − base ${fmt(delta)}`,
  );
}
await Deno.writeTextFile(
  values.out,
  JSON.stringify(
    { base: baseRev, head, pairs: PAIRS, failed, figures: table, runs: results },
    null,
    2,
  ) +
    "\n",
);
console.log(`written to ${values.out}`);
