/**
 * Bench section: what kubelet waits for — RunPodSandbox and Stop+Remove through
 * containerd's CRI, enim against host-device + static on a pre-made veth
 * (tests/support/cri/timing.ts), as two runtime handlers of one containerd inside the
 * node. The conflist is the one `deno task install` stages.
 *
 * @module
 */
import type { SimulatedNode } from "../tests/support/node.ts";
import type { Containerd as ContainerdType } from "../tests/support/cri/containerd.ts";
import { stats, verdict } from "./_stats.ts";

/** The section's samples: containerd's version and the times per handler. */
export type Cri = Awaited<ReturnType<typeof measureCri>>;

/** Runs `rounds` sandboxes per handler. */
export async function measureCri(node: SimulatedNode, rounds: number) {
  const { Containerd } = await import("../tests/support/cri/containerd.ts");
  const { makeReferenceVeth, referenceConflist, timeSandboxes } = await import(
    "../tests/support/cri/timing.ts"
  );
  const { install } = await import("../scripts/install.ts");
  const { pluginDir } = await import("../tests/support/clients.ts");
  const dir = await Deno.makeTempDir({ prefix: "enim-bench-cri-" });
  let cd: ContainerdType | null = null;
  try {
    const refVeth = `enimref${crypto.randomUUID().slice(0, 6)}`;
    await Deno.mkdir(`${dir}/ref`);
    await Deno.writeTextFile(
      `${dir}/ref/10-reference.conflist`,
      referenceConflist(refVeth, "192.168.99.250/24", "192.168.99.1"),
    );
    await install({ prefix: `${dir}/stage`, launcher: true, log: () => {} });
    await pluginDir(`${dir}/bin`, ["loopback", "host-device", "static"]);
    cd = await Containerd.start(node, {
      binDir: `${dir}/bin`,
      confDir: `${dir}/stage/etc/cni/net.d`,
      handlers: { reference: `${dir}/ref` },
      env: { ENIM_LOG_FILE: node.sandbox.inner("cni.log") },
      label: "bench",
    });
    await makeReferenceVeth(node, refVeth);
    const v = await cd.cri.version();
    const times = await timeSandboxes(cd, { enim: "", reference: "reference" }, {
      rounds,
      // enim's DEL answers before its device's move home: a read of the agent's state waits.
      settle: async (label) => void (label === "enim" && await node.client.status()),
    });
    return { version: `${v.runtimeName} ${v.runtimeVersion}`, times };
  } finally {
    await cd?.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

/** enim's p50 over the reference's, for RunPodSandbox and for Stop+Remove. */
export function criRatio(cri: Cri): { run: number; stopRemove: number } {
  return {
    run: stats(cri.times.enim.run).p50 / stats(cri.times.reference.run).p50,
    stopRemove: stats(cri.times.enim.stopRemove).p50 /
      stats(cri.times.reference.stopRemove).p50,
  };
}

/** The goals: each ratio at most 1.3 (met when the section did not run). */
export function criGoals(cri: Cri | null): { criRun: boolean; criStopRemove: boolean } {
  const r = cri ? criRatio(cri) : null;
  return { criRun: r === null || r.run <= 1.3, criStopRemove: r === null || r.stopRemove <= 1.3 };
}

/** Prints the section. */
export function reportCri(cri: Cri, rounds: number): void {
  const ratio = criRatio(cri), goals = criGoals(cri);
  console.log(
    `\ncontainerd ${cri.version} CRI, ${rounds} rounds (ms; what kubelet waits for)`,
  );
  for (const [k, t] of Object.entries(cri.times)) {
    console.log(
      `  ${k.padEnd(9)} RunPodSandbox ${stats(t.run).p50.toFixed(0)} ms p50, Stop+Remove ${
        stats(t.stopRemove).p50.toFixed(0)
      } ms p50 (Stop ${stats(t.stop).p50.toFixed(0)}, Remove ${
        stats(t.remove).p50.toFixed(0)
      }: its DEL has CNI_NETNS="", nothing left to undo)`,
    );
  }
  console.log(
    `  enim / reference p50: RunPodSandbox ${ratio.run.toFixed(2)}, Stop+Remove ${
      ratio.stopRemove.toFixed(2)
    }  (goal ≤ 1.3: ${verdict(goals.criRun)}, ${verdict(goals.criStopRemove)})`,
  );
}
