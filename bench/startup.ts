/**
 * Bench section: the plugin's start-up alone (VERSION), enim's and the reference's,
 * against the floor of any Deno process (an empty `deno run --no-config --no-lock`),
 * all three in one alternating loop.
 *
 * @module
 */
import { type BenchContext, execInNode } from "./_cni.ts";
import { fmt, type Stats, stats, verdict } from "./_stats.ts";

/** Start-up times per contender. */
export interface Startup {
  enim: Stats;
  reference: Stats;
  floor: Stats;
  /** enim's p50 over the floor's. */
  enimOverFloor: number;
}

/** Times VERSION of each contender, alternating, after three untimed rounds. */
export async function measureStartup(ctx: BenchContext): Promise<Startup> {
  const startup = { enim: [] as number[], reference: [] as number[], floor: [] as number[] };
  const starters = [
    ["enim", ctx.contenders.enim.argv],
    ["reference", ctx.contenders.reference.argv],
    ["floor", ctx.floorArgv],
  ] as const;
  for (let i = 0; i < ctx.settings.startupRuns + 3; i++) {
    const order = i % 2 === 0 ? starters : [...starters].reverse();
    for (const [name, argv] of order) {
      const r = await execInNode(
        ctx.node,
        argv,
        { CNI_COMMAND: "VERSION" },
        '{"cniVersion":"1.0.0"}',
      );
      if (r.code !== 0) throw new Error(`${name} VERSION failed: ${r.stdout} ${r.stderr}`);
      if (i >= 3) startup[name].push(r.ms);
    }
  }
  const st = {
    enim: stats(startup.enim),
    reference: stats(startup.reference),
    floor: stats(startup.floor),
  };
  return { ...st, enimOverFloor: st.enim.p50 / st.floor.p50 };
}

/** The goal: enim's start-up p50 at most 1.3× the floor's. */
export const startupGoal = (st: Startup): boolean => st.enimOverFloor <= 1.3;

/** Prints the section. */
export function reportStartup(st: Startup): void {
  console.log(`\nplugin start-up alone (VERSION; ms, spawn to exit, one alternating loop)`);
  console.log(`    enim       ${fmt(st.enim)}`);
  console.log(`    reference  ${fmt(st.reference)}`);
  console.log(`    floor      ${fmt(st.floor)}  (empty deno run --no-config --no-lock)`);
  console.log(
    `    enim / floor p50 ${st.enimOverFloor.toFixed(2)}  (goal ≤ 1.3: ${
      verdict(startupGoal(st))
    })`,
  );
}
