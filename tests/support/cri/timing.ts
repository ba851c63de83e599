/**
 * Timing what kubelet waits for around a pod's network: RunPodSandbox, and StopPodSandbox +
 * RemovePodSandbox, through containerd's CRI, for several runtime handlers of one containerd
 * that differ only in their CNI config (tests/support/cri/containerd.ts `handlers`). The reference is
 * Debian's host-device moving a pre-made veth into the pod with `static` IPAM (IPv4 only:
 * Debian's static waits for IPv6 duplicate address detection, which enim turns off).
 *
 * Used by tests/containerd_test.ts (printed, never asserted); usable from a bench.
 *
 * @module
 */
import type { SimulatedNode } from "../node.ts";
import type { Containerd } from "./containerd.ts";

/** The reference network's conflist: host-device on `device`, `static` IPv4 address. */
export function referenceConflist(device: string, address: string, gateway: string): string {
  return JSON.stringify({
    cniVersion: "1.0.0",
    name: "reference",
    plugins: [{
      type: "host-device",
      device,
      ipam: { type: "static", addresses: [{ address, gateway }], routes: [{ dst: "0.0.0.0/0" }] },
    }],
  });
}

/** Creates the veth pair `name`/`<name>p` in the node namespace for the reference. */
export async function makeReferenceVeth(node: SimulatedNode, name: string): Promise<void> {
  const out = await node.vpc.exec(node.vpc.node, [
    "/usr/sbin/ip",
    "link",
    "add",
    name,
    "type",
    "veth",
    "peer",
    "name",
    `${name}p`,
  ]);
  if (out.code !== 0) throw new Error(`Cannot create veth "${name}": ${out.stderr.trim()}`);
}

/** Samples (ms) of one handler. */
export interface SandboxTimes {
  /** RunPodSandbox. */
  run: number[];
  /** StopPodSandbox then RemovePodSandbox. */
  stopRemove: number[];
  /** StopPodSandbox alone (its CNI DEL has the namespace). */
  stop: number[];
  /** RemovePodSandbox alone (its CNI DEL has `CNI_NETNS=""`). */
  remove: number[];
}

/** Options for {@linkcode timeSandboxes}. */
export interface TimeSandboxesOptions {
  /** Measured rounds (each runs every handler once; the order flips every round). */
  rounds: number;
  /** Unmeasured rounds first (default 1). */
  warmup?: number;
  /** Called with each sandbox while it runs (outside the timed spans), to check it. */
  check?: (label: string, id: string) => Promise<void>;
  /**
   * Called after each sandbox's Stop+Remove (outside the timed spans): waits for work a
   * handler goes on with after answering (enim's DEL), so the next one is not timed beside it.
   */
  settle?: (label: string) => Promise<void>;
}

/**
 * Runs one pod per handler and round, timing RunPodSandbox and Stop+Remove. `handlers` maps a
 * label to a runtime handler name ("" is containerd's default).
 */
export async function timeSandboxes(
  cd: Containerd,
  handlers: Record<string, string>,
  opts: TimeSandboxesOptions,
): Promise<Record<string, SandboxTimes>> {
  const labels = Object.keys(handlers);
  const times: Record<string, SandboxTimes> = Object.fromEntries(
    labels.map((l) => [l, { run: [], stopRemove: [], stop: [], remove: [] }]),
  );
  const warmup = opts.warmup ?? 1;
  for (let round = 0; round < warmup + opts.rounds; round++) {
    const order = round % 2 ? [...labels].reverse() : labels;
    for (const label of order) {
      const config = cd.sandboxConfig({
        name: `t-${label.toLowerCase().replace(/[^a-z0-9-]/g, "-")}-${round}`,
        namespace: "timing",
        uid: crypto.randomUUID(),
      });
      const t0 = performance.now();
      const id = await cd.cri.runPodSandbox(config, handlers[label]);
      const t1 = performance.now();
      await opts.check?.(label, id);
      const t2 = performance.now();
      await cd.cri.stopPodSandbox(id);
      const stopped = performance.now();
      await cd.cri.removePodSandbox(id);
      const t3 = performance.now();
      await opts.settle?.(label);
      if (round >= warmup) {
        times[label].run.push(t1 - t0);
        times[label].stopRemove.push(t3 - t2);
        times[label].stop.push(stopped - t2);
        times[label].remove.push(t3 - stopped);
      }
    }
  }
  return times;
}

/** Median and range of samples in ms, for printing. */
export function summary(xs: number[]): string {
  if (xs.length === 0) return "no samples";
  const s = [...xs].sort((a, b) => a - b);
  const med = s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
  return `median ${med.toFixed(0).padStart(4)} ms (min ${s[0].toFixed(0)}, max ${
    s[s.length - 1].toFixed(0)
  }, n=${s.length})`;
}
