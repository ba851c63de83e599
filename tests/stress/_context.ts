/**
 * The state one stress run shares between its driver and its clients: the
 * node, the clients' {@linkcode Model}, the figures, the violations found, and
 * the gate that pauses the clients around each kill and check.
 *
 * @module
 */
import type { SimulatedNode } from "../support/node.ts";
import type { Model } from "./_model.ts";
import type { StressOptions } from "./_options.ts";
import type { Violation, ViolationClass } from "./_checker.ts";
import type { KillPhase } from "./_agent.ts";

/** A violation as reported: where and when it was found. */
export interface FoundViolation extends Violation {
  seed: number;
  round: number;
  /** Agent kills so far when it was found. */
  kills: number;
  /** How many later checks found the same class and subject again. */
  repeats: number;
}

/** The run's figures. */
export interface Figures {
  rounds: number;
  /** Agent kills by the phase they hit. */
  kills: Record<KillPhase, number>;
  killsTotal: number;
  pluginKills: number;
  /** Plugin calls the harness chose to kill (some exit before the kill lands). */
  pluginKillAttempts: number;
  pluginCalls: number;
  /** Each plugin call's duration (ms), for aiming the kills. */
  pluginMs: number[];
  /** Invariant checks run (one per restart, plus the planted and final ones). */
  checks: number;
  /** Operations by `VERB/via` and outcome (`ok`, `code N`, `killed`, …). */
  ops: Record<string, Record<string, number>>;
  /** Milliseconds from spawn to the first healthy answer, per successful start. */
  restartMs: number[];
  /** DELs the plugin acknowledged alone (agent down, namespace gone; GC reclaims later). */
  delDeferred: number;
  /** Things worth knowing that are not violations (GC reclaims that failed, slow calls). */
  anomalies: Record<string, number>;
  /**
   * What GC passes left alone, from the agent's log: young attachments a CNI GC's list
   * did not name, attachments an ADD confirmed after the pass was asked for; and the
   * keys the model excused because a stale list may have taken them past the grace period.
   */
  gcLeft: { young: number; confirmed: number; excused: number };
}

/** The shared state of one run. */
export class StressContext {
  readonly node: SimulatedNode;
  readonly model: Model;
  readonly opts: StressOptions;
  /** The name prefix of every namespace of the run (`enim-t-<hex>`). */
  readonly prefix: string;
  readonly figures: Figures = {
    rounds: 0,
    kills: { boot: 0, reconcile: 0, post_reconcile: 0, serving_in_flight: 0, serving_idle: 0 },
    killsTotal: 0,
    pluginKills: 0,
    pluginKillAttempts: 0,
    pluginCalls: 0,
    pluginMs: [],
    checks: 0,
    ops: {},
    restartMs: [],
    delDeferred: 0,
    anomalies: {},
    gcLeft: { young: 0, confirmed: 0, excused: 0 },
  };
  readonly violations = new Map<string, FoundViolation>();
  /** Examples of each anomaly (the first few). */
  readonly anomalyExamples = new Map<string, string[]>();
  /** Clients start no new operation while paused. */
  paused = true;
  /** Clients end their loop. */
  stopped = false;
  /** Operations in flight. */
  inFlight = 0;
  /** Bumped at every agent kill: an operation that sees it change was in flight at a kill. */
  agentEpoch = 0;
  #gate: { promise: Promise<void>; open: () => void };
  #idleWaiters: (() => void)[] = [];

  constructor(node: SimulatedNode, model: Model, opts: StressOptions) {
    this.node = node;
    this.prefix = node.vpc.node.name.replace(/-node$/, "");
    this.model = model;
    this.opts = opts;
    this.#gate = gate();
  }

  /** Resolves when the clients may go on. */
  whenResumed(): Promise<void> {
    return this.#gate.promise;
  }

  /** Lets the clients run. */
  resume(): void {
    this.paused = false;
    this.#gate.open();
  }

  /** Stops new operations (those in flight go on). */
  pause(): void {
    if (this.paused) return;
    this.paused = true;
    this.#gate = gate();
  }

  /** Ends the client loops. */
  stop(): void {
    this.stopped = true;
    this.paused = true;
    this.#gate.open();
  }

  /** Counts an operation in (returns the function that counts it out). */
  begin(): () => void {
    this.inFlight++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.inFlight--;
      if (this.inFlight === 0) { for (const w of this.#idleWaiters.splice(0)) w(); }
    };
  }

  /** Resolves when no operation is in flight. */
  idle(): Promise<void> {
    if (this.inFlight === 0) return Promise.resolve();
    return new Promise((r) => this.#idleWaiters.push(r));
  }

  /** Counts an operation's outcome. */
  count(verb: string, outcome: string): void {
    const m = (this.figures.ops[verb] ??= {});
    m[outcome] = (m[outcome] ?? 0) + 1;
  }

  /** Counts an anomaly (not a violation) and keeps its first examples. */
  anomaly(kind: string, example: string): void {
    this.figures.anomalies[kind] = (this.figures.anomalies[kind] ?? 0) + 1;
    const ex = this.anomalyExamples.get(kind) ?? [];
    if (ex.length < 3) ex.push(`r${this.model.round}: ${example}`);
    this.anomalyExamples.set(kind, ex);
  }

  /** Records violations (one entry per class and subject; later finds count as repeats). */
  report(vs: Violation[]): FoundViolation[] {
    const fresh: FoundViolation[] = [];
    for (const v of vs) {
      const id = `${v.class}|${v.subject}`;
      const seen = this.violations.get(id);
      if (seen) {
        seen.repeats++;
        continue;
      }
      const f: FoundViolation = {
        ...v,
        seed: this.opts.seed,
        round: this.model.round,
        kills: this.figures.killsTotal,
        repeats: 0,
      };
      this.violations.set(id, f);
      fresh.push(f);
    }
    return fresh;
  }

  /** Records one violation found outside a check (an operation's answer). */
  violation(
    cls: ViolationClass,
    subject: string,
    message: string,
    context: Record<string, unknown>,
  ) {
    return this.report([{ class: cls, subject, message, context }]);
  }
}

function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}
