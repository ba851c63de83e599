/**
 * The enforcer's life, from its start to its stop, as one small state machine whose
 * phases and transitions are written down in docs/network_policy.md ("The enforcer's
 * life"):
 *
 * | phase         | the tables                                  | an ADD                     |
 * | ------------- | ------------------------------------------- | -------------------------- |
 * | `waiting`     | untouched: the kernel keeps what was loaded | waits, then answers 11     |
 * | `taking-over` | the first render of every table, in order   | served (queued behind it)  |
 * | `running`     | kept in step with the cluster               | served                     |
 * | `stopping`    | the loads queued finish; nothing new starts | refused (`busy`)           |
 * | `stopped`     | untouched: the kernel keeps them            | refused (`busy`)           |
 *
 * `waiting` → `taking-over` once the node's addresses are listed, the caches have synced
 * and the manager has handed over the node's pods ({@linkcode PolicyLifecycle.restored}),
 * in any order; the take-over then runs in that same turn (no cache event slips in
 * between). A first render made before the manager's hand-over would hold no pod, and the
 * node's table would be rendered without their chains. A take-over that throws is tried
 * again (1 s doubling to 30 s) and the phase stays `waiting`. `taking-over` → `running`
 * once the first render has settled. Any phase → `stopping` on
 * {@linkcode PolicyLifecycle.stop}; → `stopped` once drained.
 *
 * @module
 */
import type { Logger } from "../../lib/log.ts";
import { userMessage } from "../../lib/message.ts";
import { sleep } from "../../lib/async.ts";

/** The enforcer's phases, in the order it goes through them. */
export const PHASES = ["waiting", "taking-over", "running", "stopping", "stopped"] as const;
/** One of {@linkcode PHASES}. */
export type PolicyPhase = typeof PHASES[number];

/** What `waiting` waits for. */
export type Precondition = "node-addresses" | "caches" | "restore";

/** What the lifecycle runs: the enforcer's steps. */
export interface LifecycleSteps {
  /** Lists the node's addresses, trying again until it can; returns early when `signal` aborts. */
  nodeAddresses(signal: AbortSignal): Promise<void>;
  /** Waits for the caches' first full sync; returns early when `signal` aborts. */
  sync(signal: AbortSignal): Promise<void>;
  /**
   * Takes over, synchronously up to its first `await` (subscribe to the caches, build
   * the compiler, queue the first render); resolves once that render has settled.
   */
  takeOver(): Promise<void>;
  /** Starts what runs while `running` (the node's addresses listed again now and then). */
  run(signal: AbortSignal): void;
  /** Drains: the caches closed, the queue and the tables' loads finished. */
  drain(): Promise<void>;
}

/** Options of {@linkcode PolicyLifecycle}. */
export interface LifecycleOptions {
  log: Logger;
  /** The wait after a failed take-over (default 1 s); it doubles up to `retryMaxMs`. */
  retryInitialMs?: number;
  /** The longest wait between two take-overs (default 30 s). */
  retryMaxMs?: number;
}

/** The enforcer's lifecycle (see the module doc). */
export class PolicyLifecycle {
  readonly #steps: LifecycleSteps;
  readonly #log: Logger;
  readonly #stop = new AbortController();
  readonly #initialMs: number;
  readonly #maxMs: number;
  #phase: PolicyPhase = "waiting";
  readonly #missing = new Set<Precondition>(["node-addresses", "caches", "restore"]);
  #restored!: () => void;
  readonly #restoredP = new Promise<void>((r) => (this.#restored = r));
  #served!: () => void;
  readonly #servedP = new Promise<void>((r) => (this.#served = r));
  readonly #life: Promise<void>;
  #stopped: Promise<void> | null = null;
  readonly #changes: ((p: PolicyPhase) => void)[] = [];

  /** Starts the life: `waiting` until its three preconditions hold. */
  constructor(steps: LifecycleSteps, o: LifecycleOptions) {
    this.#steps = steps;
    this.#log = o.log;
    this.#initialMs = o.retryInitialMs ?? 1_000;
    this.#maxMs = o.retryMaxMs ?? 30_000;
    this.#life = this.#live();
  }

  /** The phase now. */
  get phase(): PolicyPhase {
    return this.#phase;
  }

  /** What `waiting` still waits for (empty once it has taken over). */
  get waitingFor(): Precondition[] {
    return [...this.#missing];
  }

  /** Whether the enforcer serves ADDs: it has taken over and is not stopping. */
  get serving(): boolean {
    return this.#phase === "taking-over" || this.#phase === "running";
  }

  /** Whether {@linkcode stop} was called. */
  get stopping(): boolean {
    return this.#stop.signal.aborted;
  }

  /** Aborted once {@linkcode stop} is called. */
  get signal(): AbortSignal {
    return this.#stop.signal;
  }

  /** Calls `fn` with each new phase (tests). */
  onPhase(fn: (p: PolicyPhase) => void): void {
    this.#changes.push(fn);
  }

  /** The manager has handed over the node's pods (only the first call counts). */
  restored(): void {
    this.#restored();
  }

  /** Waits until it serves ADDs; false after `timeoutMs` or once stopping. */
  async served(timeoutMs: number): Promise<boolean> {
    if (this.serving) return true;
    if (this.stopping) return false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onAbort!: () => void;
    const late = new Promise<void>((r) => (timer = setTimeout(r, timeoutMs)));
    const stop = new Promise<void>((r) => {
      onAbort = r;
      this.#stop.signal.addEventListener("abort", onAbort, { once: true });
    });
    try {
      await Promise.race([this.#servedP, late, stop]);
      return this.serving;
    } finally {
      clearTimeout(timer);
      this.#stop.signal.removeEventListener("abort", onAbort);
    }
  }

  /** Stops: `stopping` at once, `stopped` once drained (idempotent). */
  stop(): Promise<void> {
    this.#stopped ??= (async () => {
      this.#stop.abort();
      this.#enter("stopping");
      await this.#life;
      await this.#steps.drain();
      this.#enter("stopped");
    })();
    return this.#stopped;
  }

  async #live(): Promise<void> {
    const signal = this.#stop.signal;
    const stopped = new Promise<void>((r) => {
      if (signal.aborted) r();
      else signal.addEventListener("abort", () => r(), { once: true });
    });
    const met = (p: Precondition, step: Promise<void>) =>
      step.then(() => {
        if (!signal.aborted) this.#missing.delete(p);
      }, (err) => {
        // The steps try again themselves; one that fails is a bug: it stays unmet.
        this.#log.error("NetworkPolicy: a start-up step failed", {
          step: p,
          error: userMessage(err),
        });
        return stopped;
      });
    // Each step ends early on `stop`; the race ends the wait at once.
    await Promise.race([
      Promise.all([
        met("node-addresses", this.#steps.nodeAddresses(signal)),
        met("caches", this.#steps.sync(signal)),
        met("restore", Promise.race([this.#restoredP, stopped])),
      ]),
      stopped,
    ]);
    for (
      let waitMs = this.#initialMs;
      !signal.aborted;
      waitMs = Math.min(waitMs * 2, this.#maxMs)
    ) {
      let first: Promise<void>;
      try {
        // One turn: no await between the preconditions' check and the take-over's start.
        first = this.#steps.takeOver();
      } catch (err) {
        this.#log.error("NetworkPolicy: taking over failed; trying again", {
          error: userMessage(err),
          retryInMs: waitMs,
        });
        await sleep(waitMs, signal);
        continue;
      }
      this.#enter("taking-over");
      this.#served();
      try {
        await first;
      } catch (err) {
        // The first render's own failures are retried by the enforcer; this is a bug's.
        this.#log.error("NetworkPolicy: the first render failed", { error: userMessage(err) });
      }
      if (signal.aborted) return;
      this.#enter("running");
      this.#steps.run(signal);
      return;
    }
  }

  #enter(p: PolicyPhase): void {
    if (this.#phase === p || this.#phase === "stopped") return;
    this.#phase = p;
    for (const fn of this.#changes) fn(p);
  }
}
