/**
 * `deno task stress` (root): the seeded stress run of issue 17, and with `--fuzz`
 * or `--fuzz-only` the full-size fuzz of the plugin and the API; with `--zone`, the
 * two-node run of zone-wide sticky pods (issue 26). Prints the seed,
 * the figures and every violation; exits 1 on any violation (or fuzz failure),
 * 2 on bad flags or when not root. Ctrl-C / SIGTERM stop the run and remove
 * everything it created.
 *
 * @module
 */
import {
  formatFuzz,
  formatReport,
  formatZoneReport,
  fuzzFailed,
  fuzzOnNewNode,
  parseOptions,
  runStress,
  runZoneStress,
  type StressOptions,
  USAGE,
} from "../tests/stress/mod.ts";

let opts: StressOptions | "help";
try {
  opts = parseOptions(Deno.args);
} catch (err) {
  console.error(`${err instanceof Error ? err.message : err}\n\n${USAGE}`);
  Deno.exit(2);
}
if (opts === "help") {
  console.log(USAGE);
  Deno.exit(0);
}
if (Deno.uid() !== 0) {
  console.error("deno task stress needs root: it creates network namespaces and runs the agent");
  Deno.exit(2);
}

const abort = new AbortController();
const onSignal = (sig: Deno.Signal) => () => {
  if (abort.signal.aborted) return;
  console.error(`\n${sig}: stopping and removing everything the run created…`);
  abort.abort();
};
const signals: [Deno.Signal, () => void][] = [["SIGINT", onSignal("SIGINT")], [
  "SIGTERM",
  onSignal("SIGTERM"),
]];
for (const [s, f] of signals) Deno.addSignalListener(s, f);

const log = (line: string) => console.log(line);
let failed = false;
try {
  if (opts.zone) {
    log(
      `stress --zone: seed ${opts.seed}, ${opts.kills} agent kills, ${opts.pods} sticky pods, ` +
        `${opts.plainPods} plain pods, ${opts.clients} clients, hold ${opts.holdSeconds} s, ` +
        `attach/detach ${opts.cloudDelayMs} ms`,
    );
    const report = await runZoneStress(opts, { log, signal: abort.signal });
    log("");
    log(formatZoneReport(report));
    if (opts.out) {
      await Deno.writeTextFile(opts.out, JSON.stringify(report, null, 2) + "\n");
      log(`report written to ${opts.out}`);
    }
    if (report.violations.length > 0 || report.plants.some((p) => !p.caught)) failed = true;
  } else if (!opts.fuzzOnly) {
    log(
      `stress: seed ${opts.seed}, ${opts.kills} agent kills, ${opts.pluginKills} plugin kills, ` +
        `${opts.clients} clients, ${opts.pods} pods, ${opts.enis} ENIs`,
    );
    const report = await runStress(opts, { log, signal: abort.signal });
    log("");
    log(formatReport(report));
    if (opts.out) {
      await Deno.writeTextFile(opts.out, JSON.stringify(report, null, 2) + "\n");
      log(`report written to ${opts.out}`);
    }
    if (report.violations.length > 0) failed = true;
  }
  if (!opts.zone && (opts.fuzz || opts.fuzzOnly) && !abort.signal.aborted) {
    log("");
    const fuzz = await fuzzOnNewNode({
      seed: opts.seed,
      pluginInputs: opts.fuzzPlugin,
      apiRequests: opts.fuzzApi,
      all: opts.fuzzAll,
      log,
    });
    log(formatFuzz(fuzz));
    if (opts.out) {
      await Deno.writeTextFile(
        opts.out.replace(/(\.json)?$/, ".fuzz.json"),
        JSON.stringify(fuzz, null, 2) + "\n",
      );
    }
    if (fuzzFailed(fuzz)) failed = true;
  }
} finally {
  for (const [s, f] of signals) Deno.removeSignalListener(s, f);
}
Deno.exit(abort.signal.aborted ? 130 : failed ? 1 : 0);
