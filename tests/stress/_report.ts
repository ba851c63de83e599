/**
 * Prints a stress report: the seed and the command that reproduces the run, the
 * figures, and each violation with its context.
 *
 * @module
 */
import { VIOLATION_CLASSES } from "./_checker.ts";
import type { StressReport } from "./_run.ts";
import type { StressOptions } from "./_options.ts";
import { DEFAULT_OP_WEIGHTS } from "./_options.ts";

function pct(xs: number[], p: number): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(s.length * p))];
}

/** The command line that runs the same configuration again. */
export function reproduce(o: StressOptions): string {
  const parts = [
    "deno task stress",
    `--seed ${o.seed}`,
    `--kills ${o.kills}`,
    `--plugin-kills ${o.pluginKills}`,
  ];
  if (o.clients !== 6) parts.push(`--clients ${o.clients}`);
  if (o.pods !== 10) parts.push(`--pods ${o.pods}`);
  if (o.enis !== 6) parts.push(`--enis ${o.enis}`);
  if (o.freshPaths) parts.push("--fresh-paths");
  if (o.staleGc) parts.push("--stale-gc");
  if (o.graceSeconds !== 0) parts.push(`--grace-seconds ${o.graceSeconds}`);
  if (o.startupKillRate !== 0.3) parts.push(`--startup-kill-rate ${o.startupKillRate}`);
  const ops = Object.entries(o.ops).filter(([k, v]) =>
    DEFAULT_OP_WEIGHTS[k as keyof typeof DEFAULT_OP_WEIGHTS] !== v
  );
  if (ops.length) parts.push(`--ops ${ops.map(([k, v]) => `${k}=${v}`).join(",")}`);
  return parts.join(" ");
}

/** The report as text. */
export function formatReport(r: StressReport): string {
  const f = r.figures;
  const lines: string[] = [];
  lines.push(`seed ${r.seed}  (reproduce: ${reproduce(r.options)})`);
  lines.push(
    `${f.rounds} rounds in ${(r.durationMs / 1000).toFixed(0)} s, stopped by ${r.stoppedBy}; ` +
      `${r.options.clients} clients, ${r.options.pods} pods, ${r.options.enis} ENIs`,
  );
  const k = f.kills;
  lines.push(
    `agent SIGKILLs: ${f.killsTotal} (serving with calls in flight ${k.serving_in_flight}, serving idle ${k.serving_idle}, ` +
      `boot ${k.boot}, start-up/reconcile ${k.reconcile}, after reconcile before serving ${k.post_reconcile})`,
  );
  lines.push(
    `plugin SIGKILLs mid-call: ${f.pluginKills} of ${f.pluginCalls} plugin calls` +
      ` (${f.pluginKillAttempts - f.pluginKills} more aimed at calls that ended first; ` +
      `plugin call median ${pct(f.pluginMs, 0.5).toFixed(0)} ms)`,
  );
  lines.push(
    `restart to healthy: median ${pct(f.restartMs, 0.5)} ms, p90 ${pct(f.restartMs, 0.9)} ms, max ${
      pct(f.restartMs, 1)
    } ms (${f.restartMs.length} starts)`,
  );
  lines.push(`invariant checks: ${f.checks}`);
  if (r.options.staleGc || f.gcLeft.young || f.gcLeft.confirmed) {
    lines.push(
      `GC left alone (agent log): ${f.gcLeft.young} young attachments a CNI GC did not list, ` +
        `${f.gcLeft.confirmed} confirmed by an ADD after the pass was asked for; ` +
        `keys a stale list may have taken (past the grace period): ${f.gcLeft.excused}`,
    );
  }
  if (f.delDeferred) {
    lines.push(
      `DELs the plugin acknowledged alone (agent down, namespace gone; left to the GC): ${f.delDeferred}`,
    );
  }
  if (r.logDir) lines.push(`the agent's and the plugin's logs are kept in ${r.logDir}`);
  if (r.finalGc) {
    lines.push(`final GC: reclaimed ${r.finalGc.reclaimed}, failed ${r.finalGc.failed}`);
  }
  lines.push("operations:");
  for (const verb of Object.keys(f.ops).sort()) {
    const outs = Object.entries(f.ops[verb]).sort((a, b) => b[1] - a[1]).map(([o, n]) =>
      `${o} ${n}`
    );
    const total = Object.values(f.ops[verb]).reduce((s, n) => s + n, 0);
    lines.push(`  ${verb.padEnd(18)} ${String(total).padStart(6)}  ${outs.join(", ")}`);
  }
  if (r.plants.length) {
    lines.push("planted violations:");
    for (const p of r.plants) {
      lines.push(
        `  ${p.name.padEnd(16)} expects ${p.expect}: ${
          p.caught === null
            ? `not set up (${p.note})`
            : p.caught
            ? "caught"
            : `MISSED (reported: ${p.reported.join("; ")})`
        }`,
      );
    }
  }
  if (Object.keys(f.anomalies).length) {
    lines.push("anomalies (not violations):");
    for (const [kind, n] of Object.entries(f.anomalies)) {
      lines.push(`  ${kind}: ${n}`);
      for (const ex of r.anomalyExamples[kind] ?? []) lines.push(`    e.g. ${ex.slice(0, 600)}`);
    }
  }
  const byClass = new Map<string, number>();
  for (const v of r.violations) byClass.set(v.class, (byClass.get(v.class) ?? 0) + 1);
  lines.push(
    `violations: ${r.violations.length}${
      r.violations.length ? ` (${[...byClass].map(([c, n]) => `${c} ${n}`).join(", ")})` : ""
    }`,
  );
  for (const v of r.violations) {
    lines.push("");
    lines.push(
      `VIOLATION ${v.class}: ${
        VIOLATION_CLASSES[v.class]
      }\n  seed ${v.seed}, round ${v.round}, after ${v.kills} agent kills` +
        `${v.repeats ? `, seen again in ${v.repeats} later checks` : ""}\n  ${v.message}`,
    );
    lines.push(
      JSON.stringify(v.context, null, 2).split("\n").map((l) => `  ${l}`).join("\n"),
    );
  }
  return lines.join("\n");
}
