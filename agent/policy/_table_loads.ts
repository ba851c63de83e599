/**
 * The loads of the policy tables: each table (a pod's namespace, or the node's) gets its
 * loads one at a time and in order, a whole render superseding what is queued for it and
 * not started; at most {@linkcode PARALLEL_LOADS} pod loads and
 * {@linkcode PARALLEL_RENDERS} whole renders run at once.
 *
 * @module
 */
import type { DeviceLayer } from "../../netns/types.ts";
import { Slots } from "../../lib/async.ts";

/**
 * The most pod namespaces loaded at once (set edits, the drop counters' reads): a
 * namespace's label change edits every local pod's sets, and fifty `nft` processes at
 * once only share the same CPUs, each with its spawn's buffers in the agent.
 */
const PARALLEL_LOADS = 8;
/** The most whole renders at once: each holds its pod's sets' members and text in memory. */
const PARALLEL_RENDERS = 2;

/** One load waiting for its table: `run` loads (and renders, when it is whole); true when it loaded. */
interface TableWork {
  run: () => Promise<boolean>;
  /** A whole render: what is queued before it and has not started is superseded. */
  whole: boolean;
  /** Never superseded: runs after the whole render that would have (a conntrack flush). */
  keep?: boolean;
  /** Not a load (a check of the table): not counted in `runs`. */
  uncounted?: boolean;
  resolve: (ok: boolean) => void;
}

/** A table's loads, in order: one at a time. */
interface TableQueue {
  items: TableWork[];
  /** The loop running them, while it runs. */
  running: Promise<void> | null;
}

/** Where a failed load was. */
export type LoadPlace = "pod" | "node";

/** The tables' loads (see the module doc). */
export class TableLoads {
  readonly #devices: DeviceLayer;
  readonly #failed: (place: LoadPlace, netns: string | null, err: unknown) => void;
  /** Each table's chain of loads: a pod's namespace path, or "" for the node. */
  readonly #tables = new Map<string, TableQueue>();
  /** Per table, how many of its loads have run (a check of the table compares against the last). */
  readonly #runs = new Map<string, number>();
  /** Whole renders (at most {@linkcode PARALLEL_RENDERS} at once). */
  readonly renders = new Slots(PARALLEL_RENDERS);
  /** The loads in pods' namespaces other than whole renders: set edits, counter reads. */
  readonly podLoads = new Slots(PARALLEL_LOADS);

  /** `failed` is told of every load that failed (it is the caller's to retry). */
  constructor(
    devices: DeviceLayer,
    failed: (place: LoadPlace, netns: string | null, err: unknown) => void,
  ) {
    this.#devices = devices;
    this.#failed = failed;
  }

  /**
   * Queues a load for a table (a pod's namespace path, or null: the node) after whatever
   * was queued for it before, one at a time; a whole render supersedes what is queued and
   * not started (it renders when it runs, from the engine's state then, so a burst of
   * changes costs one render, and no text waits in memory). What is queued with `keep`
   * (a flush of tracked connections, which must run after the table's next load) is never
   * superseded: it runs after the whole render.
   */
  enqueue(
    netns: string | null,
    run: () => Promise<boolean>,
    whole = false,
    keep = false,
    uncounted = false,
  ): Promise<boolean> {
    const key = netns ?? "";
    let q = this.#tables.get(key);
    if (!q) this.#tables.set(key, q = { items: [], running: null });
    const queue = q;
    return new Promise<boolean>((resolve) => {
      const kept = whole ? queue.items.filter((it) => it.keep) : [];
      if (whole) { for (const it of queue.items.splice(0)) if (!it.keep) it.resolve(true); }
      queue.items.push(
        { run, whole, resolve, ...(keep ? { keep } : {}), ...(uncounted ? { uncounted } : {}) },
        ...kept,
      );
      queue.running ??= (async () => {
        while (queue.items.length > 0) {
          const it = queue.items.shift()!;
          // A load that throws, even synchronously, is a failed load: the table goes on.
          let ok = false;
          try {
            ok = await it.run();
          } catch { /* its caller renders it again (a whole render marks it stale) */ }
          if (!it.uncounted) this.#runs.set(key, (this.#runs.get(key) ?? 0) + 1);
          it.resolve(ok);
        }
        queue.running = null;
        if (this.#tables.get(key) === queue) this.#tables.delete(key);
      })();
    });
  }

  /**
   * Loads `text` in a table, queued after its earlier loads; true when it loaded. A
   * `quiet` load that fails is not told to `failed`: its caller loads something else
   * instead at once (a set edit whose element went meanwhile: its sets whole), and only
   * that is a failure when it fails too.
   */
  load(netns: string | null, text: string, opts: { quiet?: boolean } = {}): Promise<boolean> {
    const load = () =>
      this.#devices.loadRuleset(netns, text).then(() => true, (err) => {
        if (!opts.quiet) this.#failed(netns === null ? "node" : "pod", netns, err);
        return false;
      });
    // The node's table (an ADD may be waiting for it) never queues behind the pods'.
    return this.enqueue(netns, netns === null ? load : () => this.podLoads.run(load));
  }

  /**
   * How many loads of a table (a pod's namespace path, or null: the node) have run, what
   * a check of the table reads to know whether what it sees is still what was loaded
   * (`netns/table_check.ts`).
   */
  runs(netns: string | null): number {
    return this.#runs.get(netns ?? "") ?? 0;
  }

  /** Resolves once no table has a load queued or running. */
  async idle(): Promise<void> {
    while (this.#tables.size > 0) {
      await Promise.all([...this.#tables.values()].map((q) => q.running));
    }
  }
}
