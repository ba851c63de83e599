/**
 * The cloud sees who owns what: while a pod owns an ENI, the ENI's description
 * in the cloud names the pod and the node (`namespace/name on node`), so an
 * operator reading the console or a flow log knows whose ENI it is.
 *
 * Descriptions are set after the ADD has answered and restored after the ENI is
 * freed, never on an operation's path: each is queued behind the ENI's earlier
 * ones (set, restore and the next pod's set reach the cloud in order), a text
 * the cloud already shows is not sent again, and a failure is logged and
 * counted, never retried against the budget (the next owner's set fixes it).
 *
 * @module
 */
import type { Provider } from "../providers/contract.ts";
import type { Logger } from "../lib/log.ts";
import { userMessage } from "../lib/message.ts";

/** What the describer records (the agent's metrics). */
export interface DescriptionRecorder {
  description(result: "ok" | "failed"): void;
}

/** Queues description changes per ENI; see the module doc. */
export class Describer {
  readonly #provider: Provider;
  readonly #log: Logger;
  readonly #node: string;
  readonly #metrics: Partial<DescriptionRecorder> | undefined;
  /** The tail of each ENI's queue. */
  readonly #tails = new Map<string, Promise<void>>();
  /** What each ENI's description is known to be (after a successful call). */
  readonly #shown = new Map<string, string | null>();

  constructor(
    provider: Provider,
    log: Logger,
    node: string,
    metrics?: Partial<DescriptionRecorder>,
  ) {
    this.#provider = provider;
    this.#log = log;
    this.#node = node;
    this.#metrics = metrics;
  }

  /** Whether the provider can show descriptions at all. */
  get enabled(): boolean {
    return this.#provider.describeENI !== undefined;
  }

  /** The text for an ENI `pod` owns. */
  textFor(pod: string): string {
    return `${pod} on ${this.#node}`;
  }

  /** Queues "owned by `pod`" for the ENI. */
  owned(eniId: string, pod: string): void {
    this.#enqueue(eniId, this.textFor(pod));
  }

  /** Queues the provider's own description again (the ENI was freed). */
  freed(eniId: string): void {
    this.#enqueue(eniId, null);
  }

  #enqueue(eniId: string, text: string | null): void {
    const describe = this.#provider.describeENI?.bind(this.#provider);
    if (!describe) return;
    const prev = this.#tails.get(eniId) ?? Promise.resolve();
    const next = prev.then(async () => {
      if (this.#shown.has(eniId) && this.#shown.get(eniId) === text) return;
      try {
        await describe(eniId, text);
        this.#shown.set(eniId, text);
        this.#metrics?.description?.("ok");
      } catch (err) {
        this.#shown.delete(eniId);
        this.#metrics?.description?.("failed");
        this.#log.warn("Cannot set the ENI's description in the cloud", {
          eniId,
          description: text,
          error: userMessage(err),
        });
      }
    });
    this.#tails.set(eniId, next);
    next.finally(() => {
      if (this.#tails.get(eniId) === next) this.#tails.delete(eniId);
    });
  }

  /** Resolves when every queued change has been tried (shutdown, tests). */
  async idle(): Promise<void> {
    while (this.#tails.size > 0) await Promise.allSettled([...this.#tails.values()]);
  }
}
