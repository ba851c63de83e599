/**
 * A deny-probe loop, for the NetworkPolicy chaos test: each source pod's
 * {@linkcode Prober} sends its batch of probes (every one a packet the policies in
 * force deny) over and over, a batch every probe timeout (or as soon as the last has
 * ended, when it took longer), while the test breaks things. Every probe is counted by kind (protocol, pod address or ClusterIP,
 * same node or across, family); one that gets through (an answer or a TCP reset) is a
 * breach, kept with its flight time and the faults under way then
 * ({@linkcode Timeline}).
 *
 * @module
 */
import { passed, type Probe, type Prober, type ProbeResult } from "./prober.ts";

/** One probe a source sends each round, and what it stands for. */
export interface DenyProbe extends Probe {
  /** The pod it is sent to (`namespace/name`). */
  target: string;
  /** To the pod's own address, or to a ClusterIP in front of it. */
  path: "pod" | "clusterip";
  /** The target is on the source's node, or another's. */
  where: "same" | "cross";
  family: 4 | 6;
}

/** The kind a probe is counted under: `tcp pod same v4`, … */
export const kindOf = (p: DenyProbe): string => `${p.proto} ${p.path} ${p.where} v${p.family}`;

/** A probe that got through. */
export interface Breach {
  source: string;
  target: string;
  kind: string;
  to: string;
  result: ProbeResult;
  /** When its batch started and ended (ms since the loop's start). */
  from: number;
  until: number;
  /** The faults under way during its flight (and, as `after …`, those just ended). */
  faults: string[];
  /** Its likely cause: {@linkcode Timeline.cause}. */
  cause: string;
}

/** How long after a fault's end a breach is still shown as its aftermath. */
export const AFTERMATH_MS = 3_000;

/**
 * The breaches grouped by their cause ({@linkcode Timeline.cause}), each with its count,
 * kinds, sources, targets and time range.
 */
export function breachSummary(breaches: Breach[]): string[] {
  const groups = new Map<string, Breach[]>();
  for (const b of breaches) {
    const list = groups.get(b.cause) ?? [];
    list.push(b);
    groups.set(b.cause, list);
  }
  const uniq = (xs: string[]) => [...new Set(xs)].sort().join(", ");
  return [...groups].map(([cause, list]) =>
    `${list.length} through, cause ${cause}, ${list[0].from}-${list.at(-1)!.until} ms: ` +
    `kinds [${uniq(list.map((b) => b.kind))}], sources [${uniq(list.map((b) => b.source))}], ` +
    `targets [${uniq(list.map((b) => b.target))}]`
  );
}

/** A fault's span (ms since the start). */
interface Span {
  name: string;
  from: number;
  until: number | null;
}

/** The faults of a run, each with when it began and ended. */
export class Timeline {
  readonly t0 = performance.now();
  /** The start as wall-clock time (to find a moment in the agents' logs). */
  readonly wallClock = new Date();
  readonly spans: Span[] = [];

  /** Milliseconds since the start. */
  now(): number {
    return performance.now() - this.t0;
  }

  /** Runs `fn` as the fault `name`: its span is from the call to its end. */
  async during<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const span: Span = { name, from: this.now(), until: null };
    this.spans.push(span);
    try {
      return await fn();
    } finally {
      span.until = this.now();
    }
  }

  /** Begins a fault that {@linkcode end} (the returned function) ends. */
  begin(name: string): () => void {
    const span: Span = { name, from: this.now(), until: null };
    this.spans.push(span);
    return () => span.until ??= this.now();
  }

  /**
   * The likely cause of what happened in [from, until]: of the faults under way at
   * `from`, the one begun last; else the first begun during the flight; else the one
   * ended last before it (`after …`, within {@linkcode AFTERMATH_MS}).
   */
  cause(from: number, until: number): string {
    let at: Span | undefined, during: Span | undefined, before: Span | undefined;
    for (const s of this.spans) {
      const end = s.until ?? Infinity;
      if (s.from <= from && end >= from) {
        if (!at || s.from >= at.from) at = s;
      } else if (s.from > from && s.from <= until) {
        if (!during || s.from < during.from) during = s;
      } else if (end < from && end >= from - AFTERMATH_MS) {
        if (!before || end > (before.until ?? 0)) before = s;
      }
    }
    if (at) return at.name;
    if (during) return during.name;
    return before ? `after ${before.name}` : "(no fault under way)";
  }

  /**
   * The faults whose span meets [from, until], and (as `after …`) those that ended less
   * than {@linkcode AFTERMATH_MS} before it.
   */
  overlapping(from: number, until: number): string[] {
    const out: string[] = [];
    for (const s of this.spans) {
      if (s.from > until) continue;
      const end = s.until ?? Infinity;
      if (end >= from) out.push(s.name);
      else if (end >= from - AFTERMATH_MS) out.push(`after ${s.name}`);
    }
    return out;
  }
}

/** One source's loop. */
interface Source {
  id: string;
  prober: Prober;
  probes: DenyProbe[];
  stop: boolean;
  done: Promise<void>;
}

/** The loop: sources come and go; counts and breaches are kept for all. */
export class DenyLoop {
  readonly #timeline: Timeline;
  readonly #timeoutMs: number;
  readonly #sources = new Map<string, Source>();
  /** Probes made, by kind. */
  readonly counts = new Map<string, number>();
  /** Probes made, by source. */
  readonly bySource = new Map<string, number>();
  readonly breaches: Breach[] = [];
  /** A prober that failed (its process ended): the source stops, and this says why. */
  readonly errors: string[] = [];
  /** Batches sent. */
  batches = 0;

  /** `timeoutMs`: how long each batch waits for what got through. */
  constructor(timeline: Timeline, timeoutMs: number) {
    this.#timeline = timeline;
    this.#timeoutMs = timeoutMs;
  }

  /** All probes made. */
  get total(): number {
    let n = 0;
    for (const v of this.counts.values()) n += v;
    return n;
  }

  /** Starts probing from `id` (a pod holding its address now), `probes` each round. */
  add(id: string, prober: Prober, probes: DenyProbe[]): void {
    if (this.#sources.has(id)) throw new Error(`The source "${id}" probes already`);
    const s: Source = { id, prober, probes, stop: false, done: Promise.resolve() };
    s.done = this.#run(s);
    this.#sources.set(id, s);
  }

  /** Stops probing from `id` (before its address goes): resolves once its last batch ended. */
  async remove(id: string): Promise<void> {
    const s = this.#sources.get(id);
    if (!s) return;
    this.#sources.delete(id);
    s.stop = true;
    await s.done;
  }

  /** Stops every source. */
  async stop(): Promise<void> {
    await Promise.all([...this.#sources.keys()].map((id) => this.remove(id)));
  }

  async #run(s: Source): Promise<void> {
    while (!s.stop) {
      const from = this.#timeline.now();
      let results: ProbeResult[];
      try {
        results = await s.prober.probe(s.probes, this.#timeoutMs);
      } catch (err) {
        this.errors.push(`${s.id}: ${(err as Error).message}`);
        return;
      }
      const until = this.#timeline.now();
      // Paced: a batch that got through at once is not followed by a storm of them (the
      // counts stay comparable between a run that leaks and one that does not).
      if (!s.stop && until - from < this.#timeoutMs) {
        await new Promise((ok) => setTimeout(ok, this.#timeoutMs - (until - from)));
      }
      this.batches++;
      this.bySource.set(s.id, (this.bySource.get(s.id) ?? 0) + results.length);
      results.forEach((r, i) => {
        const p = s.probes[i];
        const kind = kindOf(p);
        this.counts.set(kind, (this.counts.get(kind) ?? 0) + 1);
        if (!passed(r)) return;
        this.breaches.push({
          source: s.id,
          target: p.target,
          kind,
          to: `${p.addr}:${p.port}`,
          result: r,
          from: Math.round(from),
          until: Math.round(until),
          faults: this.#timeline.overlapping(from, until),
          cause: this.#timeline.cause(from, until),
        });
      });
    }
  }
}
