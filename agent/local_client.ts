/**
 * The agent's operations as an {@linkcode AgentClient} inside the agent itself.
 *
 * Two callers share it, so an operation behaves the same whichever way it
 * arrives: the HTTP routes (`server.ts`: `/v1/add`, `/v1/del`, …) and the CNI
 * dispatcher serving a forwarded plugin call (`/v1/cni`, `cni/dispatch.ts`).
 * Every request is parsed with its API schema (a bad one is `bad_request`
 * naming the fields), an ADD answers `busy` after the configured time (the ADD
 * itself goes on), and anything the manager throws that is not an
 * {@linkcode ApiError} becomes `internal`, exactly as the socket reports it.
 *
 * Reads (status, attachments, ENIs; CNI STATUS is a status) answer within a bound: a
 * DEL answers before its device is home, and a read waits for such a DEL only until
 * {@linkcode READ_SETTLE_MS} after it answered; one still unfinished then (its device's
 * move home or the cloud's release held up, e.g. a throttled cloud retried for up to
 * `timeouts.providerSeconds`) is shown as such (`delAnsweredAt`, `unfinishedDels`)
 * instead of holding the read past the plugin's `timeoutSeconds`.
 *
 * @module
 */
import { withDeadline as deadline } from "../lib/async.ts";
import { answerBudgetMs } from "../api/wire.ts";
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import {
  AddRequestSchema,
  type AddResponse,
  ApiError,
  type Attachment,
  CheckRequestSchema,
  DelRequestSchema,
  type GcReport,
  GcRequestSchema,
  type Status,
} from "../api/schema.ts";
import type { AgentClient } from "../api/client.ts";
import { formatIssues } from "./config.ts";
import type { EniManager } from "../manager/types.ts";
import type { Eni } from "../providers/schema.ts";
import { userMessage } from "../lib/message.ts";
import { clip, listOf, MESSAGE_CHARS } from "../lib/clip.ts";

/** How long after a DEL answered a read still waits for it to finish (5 s). */
export const READ_SETTLE_MS = 5000;

/** Options for {@linkcode LocalAgentClient}. */
export interface LocalClientOptions {
  /** How long an ADD may take before the caller gets `busy` (the ADD goes on). */
  addTimeoutMs?: number;
  /** Why the ADD's deadline is what it is, added to the `busy` message. */
  addDeadlineWhy?: string;
  /** `GET /metrics`, when served. */
  metrics?: () => string | Promise<string>;
  /** How long after a DEL answered a read waits for it (default {@linkcode READ_SETTLE_MS}). */
  readSettleMs?: number;
}

/** Parses `value` with `schema`, or throws `bad_request` naming every bad field. */
export function parseRequest<S extends z.core.$ZodType>(schema: S, value: unknown): z.output<S> {
  const parsed = z.safeParse(schema, value);
  if (!parsed.success) {
    throw new ApiError(
      "bad_request",
      `Invalid request body: ${listOf(formatIssues(parsed.error.issues), 5, "; ")}`,
      clip(JSON.stringify(parsed.error.issues), MESSAGE_CHARS),
    );
  }
  return parsed.data;
}

/** Maps anything an operation threw to what a client sees. */
export function asApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const message = userMessage(err);
  return new ApiError("internal", `Internal error: ${message}`, undefined, { cause: err });
}

/** Waits for `p`, answering `busy` after `ms` (the operation itself goes on). */
export async function withDeadline<T>(
  p: Promise<T>,
  ms: number | undefined,
  what: string,
  why?: string,
): Promise<T> {
  if (!ms) return await p;
  return await deadline(
    p,
    ms,
    () =>
      new ApiError(
        "busy",
        `${what} did not finish within ${Math.round(ms) / 1000} s${why ? ` ${why}` : ""}`,
      ),
  );
}

/**
 * The manager's operations with the API's parsing, deadline and error mapping.
 * Its methods take `unknown` (a decoded JSON body or a typed request alike).
 */
export class LocalAgentClient implements AgentClient {
  readonly #m: EniManager;
  readonly #opts: LocalClientOptions;

  constructor(manager: EniManager, opts: LocalClientOptions = {}) {
    this.#m = manager;
    this.#opts = opts;
  }

  async #run<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      throw asApiError(err);
    }
  }

  /**
   * This client for one CNI call whose plugin waits `pluginTimeoutMs`: an ADD answers
   * `busy` by {@linkcode answerBudgetMs} of it (or `addTimeoutMs`, if sooner), so the
   * runtime reads the agent's answer instead of the plugin's own time-out.
   */
  forPlugin(pluginTimeoutMs: number): LocalAgentClient {
    const budget = answerBudgetMs(pluginTimeoutMs);
    const own = this.#opts.addTimeoutMs;
    if (own !== undefined && own <= budget) return this;
    return new LocalAgentClient(this.#m, {
      ...this.#opts,
      addTimeoutMs: budget,
      addDeadlineWhy: `(the plugin waits ${pluginTimeoutMs / 1000} s, its timeoutSeconds); ` +
        "it goes on, and the runtime's retry gets its result",
    });
  }

  add(req: unknown): Promise<AddResponse> {
    return this.#run(() =>
      withDeadline(
        this.#m.add(parseRequest(AddRequestSchema, req)),
        this.#opts.addTimeoutMs,
        "The ADD",
        this.#opts.addDeadlineWhy,
      )
    );
  }

  del(req: unknown): Promise<void> {
    return this.#run(() => this.#m.del(parseRequest(DelRequestSchema, req)));
  }

  check(req: unknown): Promise<void> {
    return this.#run(() => this.#m.check(parseRequest(CheckRequestSchema, req)));
  }

  gc(req: unknown): Promise<GcReport> {
    return this.#run(() => this.#m.gc(parseRequest(GcRequestSchema, req)));
  }

  /** A read's wait: for the DELs that answered just now, not for one stuck (see the module doc). */
  async #settled(): Promise<void> {
    await this.#m.settled?.(this.#opts.readSettleMs ?? READ_SETTLE_MS);
  }

  status(): Promise<Status> {
    return this.#run(async () => (await this.#settled(), await this.#m.status()));
  }

  attachments(): Promise<Attachment[]> {
    return this.#run(async () => (await this.#settled(), this.#m.attachments()));
  }

  enis(): Promise<Eni[]> {
    return this.#run(async () => (await this.#settled(), await this.#m.enis()));
  }

  metrics(): Promise<string> {
    const source = this.#opts.metrics;
    if (!source) return Promise.reject(new ApiError("not_found", "No metrics are served"));
    return this.#run(async () => await source());
  }
}
