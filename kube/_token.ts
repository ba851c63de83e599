/**
 * The bearer token of {@linkcode KubeClient} (kube/client.ts), re-read from its file as it
 * rotates, and the error text both use.
 *
 * @module
 */
import { KubeAccessError, type TokenSpec } from "./access.ts";
import type { Logger } from "../lib/log.ts";

/** The bearer token, re-read from its file as it rotates. */
export class TokenSource {
  readonly #spec: TokenSpec;
  readonly #maxAgeMs: number;
  readonly #now: () => number;
  readonly #log: Logger;
  #value: string | undefined;
  #readAt = -Infinity;
  /** How many times the file was read (tests watch rotation with it). */
  reads = 0;

  constructor(spec: TokenSpec, maxAgeMs: number, now: () => number, log: Logger) {
    this.#spec = spec;
    this.#maxAgeMs = maxAgeMs;
    this.#now = now;
    this.#log = log;
    if ("value" in spec) this.#value = spec.value;
  }

  /** Whether a 401 may be cured by reading the token again. */
  get rotates(): boolean {
    return "file" in this.#spec;
  }

  /** The token; from the file again when `fresh` or when the copy is too old. */
  async get(fresh: boolean): Promise<string | undefined> {
    if (!("file" in this.#spec)) return this.#value;
    if (!fresh && this.#value !== undefined && this.#now() - this.#readAt < this.#maxAgeMs) {
      return this.#value;
    }
    const file = this.#spec.file;
    this.#readAt = this.#now();
    this.reads++;
    try {
      const text = (await Deno.readTextFile(file)).trim();
      if (text === "") throw new Error("the file is empty");
      if (text !== this.#value && this.#value !== undefined) {
        this.#log.info("The Kubernetes API token changed; using the new one", { file });
      }
      this.#value = text;
    } catch (err) {
      if (this.#value === undefined) {
        throw new KubeAccessError(
          `Cannot read the Kubernetes API token "${file}": ${errorText(err)}`,
          { cause: err },
        );
      }
      this.#log.warn("Cannot read the Kubernetes API token again; using the one read before", {
        file,
        error: err,
      });
    }
    return this.#value;
  }
}

/** An error's message with its cause's (fetch hides the TLS or socket reason in `cause`). */
export function errorText(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : "";
  return msg + cause;
}
