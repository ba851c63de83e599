/**
 * A NetworkPolicy reachability matrix probed against the one a case of
 * tests/support/policy_cases.ts expects, for the tests that probe it between real pods
 * (tests/network_policy_e2e_test.ts on simulated nodes, tests/k8s_real_node_policy_test.ts
 * on the real node): the cells (every pod to every pod, itself included, on every port of
 * {@linkcode POD_PORTS}, in the families asked), what each cell should do, and the check
 * that probes them, a cell that differs probed again with a longer time before it counts.
 * How the probes are sent (all at once, or in rounds) and what an answer must say are each
 * test's own.
 *
 * @module
 */
import { assertEquals } from "../../lib/assert.ts";
import type { End, Expect } from "./policy_cases.ts";
import { POD_PORTS } from "./policy_cluster.ts";
import { passed, type Probe, type Prober, type ProbeResult } from "./prober.ts";

/** One cell of the matrix: source, destination, protocol, port and family. */
export interface Cell<E extends End = End> {
  s: E;
  d: E;
  proto: "tcp" | "udp";
  port: number;
  fam: 4 | 6;
}

/** A cell and what its probe saw. */
export interface Probed<E extends End = End> {
  cell: Cell<E>;
  result: ProbeResult;
}

/** How a test probes cells, each given `timeoutMs`: every cell's result, in any order. */
export type ProbeCells<E extends End> = (
  cells: Cell<E>[],
  timeoutMs: number,
) => Promise<Probed<E>[]>;

/** The first probe's time. */
export const FIRST_TIMEOUT_MS = 1_000;
/**
 * The second probe's time, for a cell whose first probe differed from the expected (a
 * loaded machine may lose a first packet).
 */
export const AGAIN_TIMEOUT_MS = 3_000;

/** A cell as text, for messages. */
export const cellText = (x: Cell) => `${x.s.id} -> ${x.d.id} ${x.proto}/${x.port} IPv${x.fam}`;

/** Every pod of `ends` to every pod, itself included, on every port, in each of `families`. */
export function matrixCells<E extends End>(ends: E[], families: readonly (4 | 6)[]): Cell<E>[] {
  const cells: Cell<E>[] = [];
  for (const fam of families) {
    for (const s of ends) {
      for (const d of ends) for (const p of POD_PORTS) cells.push({ s, d, ...p, fam });
    }
  }
  return cells;
}

/**
 * Probes `cells` from their sources, each source's all at once through the prober
 * `proberOf` gives it, the sources at the same time.
 */
export async function probeBySource<E extends End>(
  cells: Cell<E>[],
  timeoutMs: number,
  proberOf: (s: E) => Prober,
): Promise<Probed<E>[]> {
  const bySource = new Map<string, Cell<E>[]>();
  for (const cell of cells) bySource.set(cell.s.id, [...(bySource.get(cell.s.id) ?? []), cell]);
  const out: Probed<E>[] = [];
  await Promise.all([...bySource.values()].map(async (list) => {
    const probes: Probe[] = list.map((x) => ({
      proto: x.proto,
      addr: x.fam === 4 ? x.d.v4 : x.d.v6,
      port: x.port,
    }));
    const results = await proberOf(list[0].s).probe(probes, timeoutMs);
    list.forEach((cell, i) => out.push({ cell, result: results[i] }));
  }));
  return out;
}

/**
 * Probes `cells` with `probe` and asserts that each got through (an answer or a TCP reset)
 * exactly when `expect` says (a pod always reaches itself); a cell that differs at first
 * is probed again with {@linkcode AGAIN_TIMEOUT_MS} and counts only if it differs again.
 * Says on stderr how many differed at first. Returns both rounds' results, for the test
 * to check the answers.
 */
export async function assertMatrix<E extends End>(
  cells: Cell<E>[],
  expect: Expect,
  probe: ProbeCells<E>,
): Promise<{ first: Probed<E>[]; again: Probed<E>[] }> {
  const want = (x: Cell<E>) => x.s.id === x.d.id || expect(x.s, x.d, x.proto, x.port, x.fam);
  const first = await probe(cells, FIRST_TIMEOUT_MS);
  const wrong = first.filter((r) => passed(r.result) !== want(r.cell));
  if (wrong.length) {
    console.error(
      `${wrong.length} of ${cells.length} cells differed at first (probed again): ${
        wrong.slice(0, 5).map((r) => `${cellText(r.cell)}: ${r.result}`).join("; ")
      }`,
    );
  }
  const again = wrong.length ? await probe(wrong.map((r) => r.cell), AGAIN_TIMEOUT_MS) : [];
  const still = again.filter((r) => passed(r.result) !== want(r.cell));
  assertEquals(
    still.map((r) => `${cellText(r.cell)}: ${r.result}, want ${want(r.cell) ? "pass" : "drop"}`),
    [],
    `${still.length} of ${cells.length} cells differ from the expected matrix`,
  );
  return { first, again };
}
