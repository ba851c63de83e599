/**
 * A small Prometheus client: counters, gauges (optionally read at scrape time)
 * and histograms with fixed buckets, all with labels, exposed in the text format
 * 0.0.4 exactly as prom-client 15 writes it (the same lines, label order and
 * number spelling), which is what enim used before.
 *
 * Why not prom-client: it requires Node's cluster, http, https, zlib, v8 and
 * perf_hooks modules, which cost the agent ~3 MB of memory at start for the
 * handful of metrics it keeps (issue 11: the agent must stay under 80 MB).
 *
 * @example
 * ```ts
 * const registry = new Registry();
 * const ops = new Counter({
 *   name: "ops_total",
 *   help: "Operations",
 *   labelNames: ["op"],
 *   registers: [registry],
 * });
 * ops.inc({ op: "add" });
 * console.log(await registry.metrics()); // # HELP ops_total Operations …
 * ```
 *
 * @module
 */

/** A metric's label values, by label name. */
export type Labels<L extends string> = { [K in L]: string };

/** Anything a {@linkcode Registry} can expose. */
interface Exposable {
  readonly name: string;
  /** The metric's HELP, TYPE and sample lines. */
  exposition(): Promise<string>;
}

/** The text format's content type. */
const CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

/** A set of metrics exposed together (the agent's `GET /metrics`). */
export class Registry {
  /** The content type of {@linkcode Registry.metrics}'s text. */
  readonly contentType: string = CONTENT_TYPE;
  readonly #metrics = new Map<string, Exposable>();

  /**
   * Adds a metric (metrics do so themselves through their `registers` option).
   *
   * @throws {Error} when another metric of that name is registered
   */
  register(metric: Exposable): void {
    const known = this.#metrics.get(metric.name);
    if (known !== undefined && known !== metric) {
      throw new Error(`A metric named "${metric.name}" is already registered`);
    }
    this.#metrics.set(metric.name, metric);
  }

  /** The text exposition of every metric, in registration order (collect callbacks run first). */
  async metrics(): Promise<string> {
    const parts = await Promise.all([...this.#metrics.values()].map((m) => m.exposition()));
    return `${parts.join("\n\n")}\n`;
  }
}

/** What every metric is created with. */
export interface MetricOptions<L extends string> {
  /** The metric's name (`[a-zA-Z_:][a-zA-Z0-9_:]*`). */
  name: string;
  /** Its HELP text. */
  help: string;
  /** Its label names (`[a-zA-Z_][a-zA-Z0-9_]*`); none by default. */
  labelNames?: readonly L[];
  /** The registries that expose it. */
  registers?: readonly Registry[];
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** A sample value as the text format spells it (prom-client's spelling: NaN is "Nan"). */
function formatValue(value: number): string {
  if (Number.isNaN(value)) return "Nan";
  if (!Number.isFinite(value)) return value < 0 ? "-Inf" : "+Inf";
  return `${value}`;
}

/** HELP text with backslashes and line feeds escaped. */
function escapeText(text: string): string {
  return text.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
}

/** `name="value"` pairs for a label set, in the label set's own key order. */
function formatLabels(labels: Readonly<Record<string, string>>): string[] {
  return Object.entries(labels).map(([k, v]) => `${k}="${escapeText(v).replace(/"/g, '\\"')}"`);
}

/** One sample line: `name{labels} value`. */
function sampleLine(name: string, pairs: string[], value: number): string {
  return `${name}${pairs.length > 0 ? `{${pairs.join(",")}}` : ""} ${formatValue(value)}`;
}

/** What the three metric types share: name, help, labels, series and registration. */
abstract class Metric<L extends string, S> implements Exposable {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly L[];
  abstract readonly type: "counter" | "gauge" | "histogram";
  readonly #sortedLabelNames: readonly L[];
  /** The series by label key, in the order they first appeared. */
  protected readonly series = new Map<string, { labels: Labels<L>; value: S }>();

  constructor(opts: MetricOptions<L>) {
    if (!METRIC_NAME.test(opts.name)) throw new Error(`Invalid metric name "${opts.name}"`);
    if (!opts.help) throw new Error(`Metric "${opts.name}" has no help text`);
    const labelNames = opts.labelNames ?? [];
    for (const l of labelNames) {
      if (!LABEL_NAME.test(l)) throw new Error(`Invalid label name "${l}" of "${opts.name}"`);
    }
    this.name = opts.name;
    this.help = opts.help;
    this.labelNames = labelNames;
    this.#sortedLabelNames = [...labelNames].sort();
    for (const r of opts.registers ?? []) r.register(this);
  }

  /**
   * The series of `labels`, created with `initial()` when new.
   *
   * @throws {Error} for a label the metric was not created with
   */
  protected seriesOf(labels: Labels<L>, initial: () => S): { labels: Labels<L>; value: S } {
    for (const k in labels) {
      if (!this.labelNames.includes(k)) {
        throw new Error(`Label "${k}" is not among the labels of "${this.name}"`);
      }
    }
    let key = "";
    for (const k of this.#sortedLabelNames) {
      if (labels[k] !== undefined) key += `${k}:${labels[k]},`;
    }
    let s = this.series.get(key);
    if (s === undefined) {
      s = { labels, value: initial() };
      this.series.set(key, s);
    }
    return s;
  }

  /** Forgets every series (for a collect callback that sets the current ones again). */
  reset(): void {
    this.series.clear();
    if (this.labelNames.length === 0) this.seriesOf({} as Labels<L>, () => this.zero());
  }

  /** The value a new series starts at. */
  protected abstract zero(): S;

  /** The sample lines of the current series. */
  protected abstract samples(): string[];

  /** Runs before each exposition (a gauge's collect callback). */
  protected beforeExposition(): void | Promise<void> {}

  /** The metric's HELP, TYPE and sample lines. */
  async exposition(): Promise<string> {
    await this.beforeExposition();
    const name = escapeText(this.name);
    return [`# HELP ${name} ${escapeText(this.help)}`, `# TYPE ${name} ${this.type}`]
      .concat(this.samples()).join("\n");
  }
}

/** What a counter is created with. */
export interface CounterOptions<L extends string> extends MetricOptions<L> {
  /**
   * Sets the counter's values before each exposition from a count kept elsewhere (the
   * kernel's, a cache's), with {@linkcode Counter.mirror} (`this` is the counter).
   */
  collect?: (this: Counter<L>) => void | Promise<void>;
}

/** A counter: a value per label set that only goes up. */
export class Counter<L extends string = never> extends Metric<L, number> {
  readonly type = "counter";
  readonly #collect?: (this: Counter<L>) => void | Promise<void>;

  constructor(opts: CounterOptions<L>) {
    super(opts);
    this.#collect = opts.collect;
    if (this.labelNames.length === 0) this.seriesOf({} as Labels<L>, () => 0);
  }

  protected zero(): number {
    return 0;
  }

  protected override beforeExposition(): void | Promise<void> {
    return this.#collect?.call(this);
  }

  /**
   * Sets the series of `labels` to a total counted elsewhere (a collect callback's); a
   * smaller value than before reads as the source's reset, as Prometheus takes it.
   *
   * @throws {TypeError} for a value that is not a finite number
   */
  mirror(labels: Labels<L>, value: number): void {
    if (!Number.isFinite(value)) throw new TypeError(`Value is not a valid number: ${value}`);
    this.seriesOf(labels, () => 0).value = value;
  }

  /**
   * Adds `value` (default 1) to the series of `labels`.
   *
   * @throws {TypeError} for a value that is not a finite number
   * @throws {Error} for a negative value
   */
  inc(labels: Labels<L>, value = 1): void {
    if (!Number.isFinite(value)) throw new TypeError(`Value is not a valid number: ${value}`);
    if (value < 0) throw new Error(`A counter cannot decrease (${this.name}: ${value})`);
    this.seriesOf(labels, () => 0).value += value;
  }

  protected samples(): string[] {
    return [...this.series.values()].map((s) =>
      sampleLine(this.name, formatLabels(s.labels), s.value)
    );
  }
}

/** What a gauge is created with. */
export interface GaugeOptions<L extends string> extends MetricOptions<L> {
  /** Sets the gauge's values before each exposition (`this` is the gauge). */
  collect?: (this: Gauge<L>) => void | Promise<void>;
}

/** A gauge: a value per label set, set directly or by a collect callback at scrape time. */
export class Gauge<L extends string = never> extends Metric<L, number> {
  readonly type = "gauge";
  readonly #collect?: (this: Gauge<L>) => void | Promise<void>;

  constructor(opts: GaugeOptions<L>) {
    super(opts);
    this.#collect = opts.collect;
    if (this.labelNames.length === 0) this.seriesOf({} as Labels<L>, () => 0);
  }

  protected zero(): number {
    return 0;
  }

  /**
   * Sets the series of `labels` to `value`.
   *
   * @throws {TypeError} for a value that is not a number
   */
  set(labels: Labels<L>, value: number): void {
    if (typeof value !== "number") throw new TypeError(`Value is not a valid number: ${value}`);
    const s = this.seriesOf(labels, () => value);
    s.labels = labels;
    s.value = value;
  }

  protected override beforeExposition(): void | Promise<void> {
    return this.#collect?.call(this);
  }

  protected samples(): string[] {
    return [...this.series.values()].map((s) =>
      sampleLine(this.name, formatLabels(s.labels), s.value)
    );
  }
}

/** What a histogram is created with. */
export interface HistogramOptions<L extends string> extends MetricOptions<L> {
  /** The buckets' upper bounds, ascending (the `+Inf` bucket is implied). */
  buckets: readonly number[];
}

/** One histogram series: the count in each bucket (not cumulative), sum and count. */
interface HistogramValue {
  counts: number[];
  sum: number;
  count: number;
}

/** A histogram with fixed buckets, per label set. */
export class Histogram<L extends string = never> extends Metric<L, HistogramValue> {
  readonly type = "histogram";
  readonly buckets: readonly number[];

  constructor(opts: HistogramOptions<L>) {
    super(opts);
    if (this.labelNames.includes("le" as L)) {
      throw new Error(`"le" is a reserved label name (histogram "${this.name}")`);
    }
    this.buckets = [...opts.buckets];
    if (this.labelNames.length === 0) this.seriesOf({} as Labels<L>, () => this.#empty());
  }

  #empty(): HistogramValue {
    return { counts: this.buckets.map(() => 0), sum: 0, count: 0 };
  }

  protected zero(): HistogramValue {
    return this.#empty();
  }

  /**
   * Records one observation in the series of `labels`.
   *
   * @throws {TypeError} for a value that is not a finite number
   */
  observe(labels: Labels<L>, value: number): void {
    if (!Number.isFinite(value)) throw new TypeError(`Value is not a valid number: ${value}`);
    const h = this.seriesOf(labels, () => this.#empty()).value;
    h.sum += value;
    h.count += 1;
    const i = this.buckets.findIndex((b) => value <= b);
    if (i >= 0) h.counts[i] += 1;
  }

  protected samples(): string[] {
    const lines: string[] = [];
    for (const { labels, value: h } of this.series.values()) {
      const pairs = formatLabels(labels);
      let cumulative = 0;
      this.buckets.forEach((b, i) => {
        cumulative += h.counts[i];
        lines.push(sampleLine(`${this.name}_bucket`, [`le="${b}"`, ...pairs], cumulative));
      });
      lines.push(sampleLine(`${this.name}_bucket`, ['le="+Inf"', ...pairs], h.count));
      lines.push(sampleLine(`${this.name}_sum`, pairs, h.sum));
      lines.push(sampleLine(`${this.name}_count`, pairs, h.count));
    }
    return lines;
  }
}
