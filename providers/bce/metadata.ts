/**
 * The BCE instance metadata client (reference §3): plain GETs under
 * `http://169.254.169.254/1.0/meta-data/`, bodies trimmed, an empty body
 * meaning "not implemented". The base URL is configurable (tests use loopback).
 *
 * @module
 */
import { ProviderError } from "../contract.ts";

/** The metadata service's default base URL. */
export const DEFAULT_METADATA_URL = "http://169.254.169.254/1.0/meta-data/";

/** Options of {@linkcode MetadataClient}. */
export interface MetadataOptions {
  baseUrl?: string;
  timeoutMs?: number;
}

/** Reads this instance's metadata. */
export class MetadataClient {
  readonly baseUrl: string;
  #timeoutMs: number;

  constructor(opts: MetadataOptions = {}) {
    const base = opts.baseUrl ?? DEFAULT_METADATA_URL;
    this.baseUrl = base.endsWith("/") ? base : base + "/";
    this.#timeoutMs = opts.timeoutMs ?? 5000;
  }

  /** The body of one metadata path, trimmed; throws when missing, failed or empty. */
  async get(path: string): Promise<string> {
    const url = new URL(path.replace(/^\//, ""), this.baseUrl);
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), this.#timeoutMs);
    try {
      let res: Response;
      let text: string;
      try {
        res = await fetch(url, { signal: ac.signal });
        text = (await res.text()).trim();
      } catch (e) {
        throw new ProviderError(
          "unavailable",
          `Cannot read metadata "${path}" from ${this.baseUrl}: ${
            ac.signal.aborted ? `timed out after ${this.#timeoutMs} ms` : String(e)
          }`,
          { cause: e },
        );
      }
      if (res.status >= 400) {
        throw new ProviderError(
          res.status === 404 ? "not_found" : "unavailable",
          `Cannot read metadata "${path}": HTTP ${res.status}`,
        );
      }
      if (text === "") {
        throw new ProviderError("not_found", `Metadata "${path}" is not implemented (empty body)`);
      }
      return text;
    } finally {
      clearTimeout(timer);
    }
  }

  /** The instance id in API form (`i-…`). */
  instanceId(): Promise<string> {
    return this.get("instance-shortid");
  }
  /** The region (`bj`, `gz`, …). */
  region(): Promise<string> {
    return this.get("region");
  }
  /** The availability zone. */
  zone(): Promise<string> {
    return this.get("azone");
  }
  /** The VPC id. */
  vpcId(): Promise<string> {
    return this.get("vpc-id");
  }
  /** The primary NIC's subnet id. */
  subnetId(): Promise<string> {
    return this.get("subnet-id");
  }
  /** The MACs of every NIC, lower case, without the trailing `/`. */
  async macs(): Promise<string[]> {
    const text = await this.get("network/interfaces/macs");
    return text.split("\n").map((l) => l.trim().replace(/\/$/, "").toLowerCase()).filter(
      (l) => l !== "",
    );
  }
}
