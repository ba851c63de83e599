/**
 * The matrix check of the policy tests without a kernel: a probe function that answers
 * from a table stands in for the probers.
 */
import { assert, assertEquals, assertRejects } from "../../lib/assert.ts";
import type { End } from "./policy_cases.ts";
import { POD_PORTS } from "./policy_cluster.ts";
import {
  AGAIN_TIMEOUT_MS,
  assertMatrix,
  type Cell,
  cellText,
  FIRST_TIMEOUT_MS,
  matrixCells,
  type Probed,
} from "./policy_matrix.ts";
import type { ProbeResult } from "./prober.ts";

const END = (id: string): End => {
  const [ns, app] = id.split("/");
  return { id, ns, app, v4: `10.0.0.${id.length}`, v6: `fd00::${id.length}` };
};
const ENDS = [END("a/web"), END("a/db"), END("b/web")];

/** A probe function whose results `answer` gives, recording each call's cells and time. */
function fakeProbe(answer: (x: Cell, timeoutMs: number) => ProbeResult) {
  const calls: { cells: string[]; timeoutMs: number }[] = [];
  const probe = (cells: Cell[], timeoutMs: number): Promise<Probed[]> => {
    calls.push({ cells: cells.map(cellText), timeoutMs });
    return Promise.resolve(cells.map((cell) => ({ cell, result: answer(cell, timeoutMs) })));
  };
  return { calls, probe };
}

/** Only a/db is isolated: nothing reaches it but itself. */
const expect = (_s: End, d: End) => d.id !== "a/db";
const truth = (x: Cell): ProbeResult =>
  x.s.id === x.d.id || expect(x.s, x.d) ? `open ${x.d.id}` : "timeout";

Deno.test("matrixCells() gives every end to every end, itself included, on every port, per family", () => {
  const v4 = matrixCells(ENDS, [4]);
  assertEquals(v4.length, 3 * 3 * POD_PORTS.length);
  assertEquals(matrixCells(ENDS, [4, 6]).length, 2 * v4.length);
  assertEquals(new Set(v4.map(cellText)).size, v4.length);
  assert(v4.some((x) => x.s === x.d));
});

Deno.test("assertMatrix() probes once when every cell is as expected", async () => {
  const cells = matrixCells(ENDS, [4]);
  const { calls, probe } = fakeProbe(truth);
  const { first, again } = await assertMatrix(cells, expect, probe);
  assertEquals(calls.map((c) => [c.cells.length, c.timeoutMs]), [[cells.length, FIRST_TIMEOUT_MS]]);
  assertEquals(first.length, cells.length);
  assertEquals(again, []);
});

Deno.test("assertMatrix() probes again, with the longer time, only the cells that differed, and passes when they then agree", async () => {
  const cells = matrixCells(ENDS, [4]);
  const lost = (x: Cell) => x.s.id === "b/web" && x.d.id === "a/web" && x.proto === "udp";
  const { calls, probe } = fakeProbe((x, ms) =>
    lost(x) && ms === FIRST_TIMEOUT_MS ? "timeout" : truth(x)
  );
  const { again } = await assertMatrix(cells, expect, probe);
  assertEquals(calls.length, 2);
  assertEquals(calls[1].timeoutMs, AGAIN_TIMEOUT_MS);
  assertEquals(calls[1].cells, cells.filter(lost).map(cellText));
  assertEquals(again.map((r) => r.result), ["open a/web", "open a/web"]);
});

Deno.test("assertMatrix() fails on a cell that differs twice, naming it; a pod always reaches itself", async () => {
  const cells = matrixCells(ENDS, [4]);
  // a/db admits b/web on TCP 5432 though it should not; a/db's probes to itself pass.
  const leak = (x: Cell) => x.s.id === "b/web" && x.d.id === "a/db" && x.port === 5432;
  const { probe } = fakeProbe((x) => leak(x) ? "refused" : truth(x));
  const err = await assertRejects(() => assertMatrix(cells, expect, probe));
  assert(
    String(err).includes("b/web -> a/db tcp/5432 IPv4: refused, want drop"),
    String(err),
  );
  assert(String(err).includes(`1 of ${cells.length} cells differ`), String(err));
});
