/**
 * Bench section: the kernel's cost of moving a veth end between two namespaces, with
 * no process per move — what both plugins' ADD pays once — and the bound it sets,
 * with Deno's start-up, on enim's ADD against the reference's.
 *
 * @module
 */
import type { SimulatedNode } from "../tests/support/node.ts";

/**
 * 3 batches of 20 `link set … netns` lines in one `ip -batch` each, between two
 * namespaces of the VPC fixture made for this; ms per move, per batch.
 */
export async function measureKernelMove(node: SimulatedNode): Promise<number[]> {
  const a = await node.vpc.pod("mvfa"), b = await node.vpc.pod("mvfb");
  const dir = await Deno.makeTempDir({ prefix: "enim-bench-move-" });
  try {
    const batch = async (lines: string[]) => {
      const file = `${dir}/${crypto.randomUUID()}`;
      await Deno.writeTextFile(file, lines.join("\n") + "\n");
      const t = performance.now();
      const out = await node.vpc.exec(a, ["/usr/sbin/ip", "-batch", file]);
      if (out.code !== 0) throw new Error(`ip -batch in ${a.name} failed: ${out.stderr}`);
      return performance.now() - t;
    };
    const n = 20, perBatch: number[] = [];
    await batch(
      Array.from({ length: 3 * n }, (_, i) => `link add mvf${i} type veth peer name mvfp${i}`),
    );
    for (let k = 0; k < 3; k++) {
      const ms = await batch(
        Array.from({ length: n }, (_, i) => `link set dev mvf${k * n + i} netns ${b.path}`),
      );
      perBatch.push(ms / n);
    }
    return perBatch;
  } finally {
    await node.vpc.deletePod(a).catch(() => {});
    await node.vpc.deletePod(b).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

/** Prints the section: the moves, and the floor's start-up plus one move against the reference's ADD. */
export function reportKernelMove(moveFloor: number[], floorP50: number, refAddP50: number): void {
  const moveMs = [...moveFloor].sort((x, y) => x - y)[1];
  console.log(
    `\nthe kernel's netns move alone (3 batches of 20 in one ip -batch each; ms per move): ${
      moveFloor.map((m) => m.toFixed(1)).join(", ")
    }`,
  );
  console.log(
    `  both ADDs pay one move; enim's also pays a Deno start-up: empty deno run + one move = ${
      (floorP50 + moveMs).toFixed(1)
    } ms, ${
      ((floorP50 + moveMs) / refAddP50).toFixed(2)
    }× the reference's ADD p50 before enim does anything else`,
  );
}
