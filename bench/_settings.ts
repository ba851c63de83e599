/**
 * `deno task bench`'s flags and the sizes they set: `--quick` (a short run),
 * `--iterations N`, `--warmup N`, `--soak N` (0 skips it), `--rounds N`, `--no-cri`,
 * `--host-link on|off` (enim's pods get their host link to the node, as Kubernetes pods
 * do by default; off: the ENI alone), `--out FILE`.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { ROOT } from "../scripts/_paths.ts";

/** How big a run is and what it includes. */
export interface Settings {
  quick: boolean;
  /** Timed iterations of each serial section. */
  iterations: number;
  /** Untimed iterations before them. */
  warmup: number;
  /** Timed rounds of the concurrency section. */
  rounds: number;
  /** ADD/DEL cycles of the soak (0 skips it). */
  soak: number;
  /** Pods per concurrency round. */
  parallel: number;
  /** `/usr/bin/time` runs of each plugin per verb. */
  rssRuns: number;
  /** containerd CRI rounds (0: `--no-cri`). */
  criRounds: number;
  /** Timed VERSION runs of each start-up contender. */
  startupRuns: number;
  /** Whether enim's pods get their host link. */
  hostLink: boolean;
  /** Where the JSON results go. */
  out: string;
}

/**
 * Parses the bench's argv; an unknown flag throws (node:util's parseArgs), a bad
 * `--host-link` value is reported as the returned error.
 */
export function parseSettings(args: string[]): Settings | { error: string } {
  const { values: flags } = parseArgs({
    args,
    options: {
      quick: { type: "boolean", default: false },
      iterations: { type: "string" },
      warmup: { type: "string" },
      soak: { type: "string" },
      rounds: { type: "string" },
      out: { type: "string", default: `${ROOT}/bench-results.json` },
      "no-cri": { type: "boolean", default: false },
      "host-link": { type: "string", default: "on" },
    },
  });
  if (flags["host-link"] !== "on" && flags["host-link"] !== "off") {
    return { error: `--host-link takes "on" or "off", not "${flags["host-link"]}"` };
  }
  const num = (v: string | undefined, dflt: number) => (v === undefined ? dflt : Number(v));
  return {
    quick: flags.quick,
    iterations: num(flags.iterations, flags.quick ? 15 : 60),
    warmup: num(flags.warmup, flags.quick ? 3 : 8),
    rounds: num(flags.rounds, flags.quick ? 2 : 5),
    soak: num(flags.soak, flags.quick ? 200 : 1000),
    parallel: 16,
    rssRuns: flags.quick ? 5 : 10,
    criRounds: flags["no-cri"] ? 0 : flags.quick ? 3 : 20,
    startupRuns: flags.quick ? 10 : 30,
    hostLink: flags["host-link"] === "on",
    out: flags.out,
  };
}
