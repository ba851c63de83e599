/**
 * Structured logging: one JSON object per line.
 *
 * Every role logs through a {@linkcode Logger}. The CNI plugin must never write
 * logs to stdout (stdout carries the CNI result), so sinks are explicit: stderr,
 * a file, or a function (tests).
 *
 * @module
 */

import { clip, MESSAGE_CHARS } from "./clip.ts";

/** Log levels, in increasing severity. */
export const LEVELS = ["debug", "info", "warn", "error"] as const;
/** A log level name. */
export type Level = typeof LEVELS[number];

/** Where log lines go. */
export type Sink = (line: string) => void;

/** Field names whose values are replaced by "[redacted]" wherever they appear. */
const SECRET_KEYS =
  /^(authorization|secret.*|.*secretkey|.*secret_key|sk|sessiontoken|session_token|token|password|x-bce-security-token)$/i;

/**
 * Replaces secret values in a structure that is about to be logged, and clips strings
 * longer than {@linkcode MESSAGE_CHARS} (a log line echoing a megabyte-long value is
 * no use to anyone reading it; how many bytes were left out is said).
 */
export function redact(value: unknown, depth = 0): unknown {
  if (typeof value === "string") return clip(value, MESSAGE_CHARS);
  if (depth > 6 || value === null || typeof value !== "object") return value;
  if (value instanceof Error) {
    return {
      name: value.name,
      message: clip(value.message, MESSAGE_CHARS),
      ...(value.cause ? { cause: redact(value.cause, depth + 1) } : {}),
    };
  }
  if (Array.isArray(value)) return value.map((v) => redact(v, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    out[k] = SECRET_KEYS.test(k) ? "[redacted]" : redact(v, depth + 1);
  }
  return out;
}

/** A structured logger; `child` adds fields to every line it writes. */
export class Logger {
  #sink: Sink;
  #min: number;
  #fields: Record<string, unknown>;

  constructor(sink: Sink, level: Level = "info", fields: Record<string, unknown> = {}) {
    this.#sink = sink;
    this.#min = LEVELS.indexOf(level);
    this.#fields = fields;
  }

  /** A logger that writes the same way with extra fields on every line. */
  child(fields: Record<string, unknown>): Logger {
    return new Logger(this.#sink, LEVELS[this.#min], { ...this.#fields, ...fields });
  }

  /** Whether lines of `level` are written. */
  enabled(level: Level): boolean {
    return LEVELS.indexOf(level) >= this.#min;
  }

  debug(msg: string, fields?: Record<string, unknown>): void {
    this.#write("debug", msg, fields);
  }
  info(msg: string, fields?: Record<string, unknown>): void {
    this.#write("info", msg, fields);
  }
  warn(msg: string, fields?: Record<string, unknown>): void {
    this.#write("warn", msg, fields);
  }
  error(msg: string, fields?: Record<string, unknown>): void {
    this.#write("error", msg, fields);
  }

  #write(level: Level, msg: string, fields?: Record<string, unknown>): void {
    if (LEVELS.indexOf(level) < this.#min) return;
    const line = JSON.stringify(
      redact({ ts: new Date().toISOString(), level, msg, ...this.#fields, ...fields }),
    );
    try {
      this.#sink(line);
    } catch {
      // A broken log sink must never break the operation being logged.
    }
  }
}

const encoder = new TextEncoder();

/** A sink writing to stderr. */
export const stderrSink: Sink = (line) => {
  Deno.stderr.writeSync(encoder.encode(line + "\n"));
};

/** A logger that drops everything. */
export const nullLogger: Logger = new Logger(() => {}, "error");
