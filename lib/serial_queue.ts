/**
 * A serial queue: tasks run one at a time, in the order they were queued (or first, when
 * asked), and nothing a task does can stop the queue. A task that throws, synchronously
 * or not, rejects its own promise only; the next task runs. A task queued with
 * {@linkcode SerialQueue.retry} runs again after a backoff each time it fails, until it
 * succeeds or the queue stops (other tasks run while it waits). {@linkcode SerialQueue.stop}
 * refuses new tasks, abandons the retries waiting out their backoff, and resolves once
 * what was queued has run.
 *
 * A task starts in the same turn as it is queued when the queue is idle (what it does up
 * to its first `await` happens before `run` returns), so state read and changed there is
 * never seen half done by another task.
 *
 * @example
 * ```ts
 * import { SerialQueue } from "./serial_queue.ts";
 * const q = new SerialQueue();
 * const order: number[] = [];
 * await Promise.all([
 *   q.run(() => order.push(1)),
 *   q.run(() => { throw new Error("this task fails, not the queue"); }).catch(() => {}),
 *   q.run(() => order.push(3)),
 * ]);
 * // order is [1, 3]
 * await q.stop();
 * ```
 *
 * @module
 */

/** The error of a task the queue refused or abandoned because it was stopped. */
export class QueueStoppedError extends Error {
  constructor() {
    super("The queue is stopped");
    this.name = "QueueStoppedError";
  }
}

/** What {@linkcode SerialQueueOptions.onError} is told of a failed attempt. */
export interface FailedAttempt {
  /** The task's name, as given to {@linkcode SerialQueue.retry}. */
  name?: string;
  /** Attempts made so far (1 for the first failure). */
  attempt: number;
  /** When it runs again, in ms (null: it does not: the queue is stopping). */
  retryInMs: number | null;
}

/** Options of {@linkcode SerialQueue}. */
export interface SerialQueueOptions {
  /** The wait after a retried task's first failure (default 1 s); it doubles each time. */
  retryInitialMs?: number;
  /** The longest wait between two attempts of a retried task (default 30 s). */
  retryMaxMs?: number;
  /**
   * Told of every failed attempt of a retried task (what it throws is ignored). A task
   * queued with {@linkcode SerialQueue.run} tells its caller instead, by its promise.
   */
  onError?: (err: unknown, attempt: FailedAttempt) => void;
}

/** Where a task goes in the queue. */
export interface QueuePlace {
  /** Before every task queued and not started yet (default: after them). */
  first?: boolean;
}

/** A serial queue (see the module doc). */
export class SerialQueue {
  readonly #items: (() => Promise<void>)[] = [];
  #running: Promise<void> | null = null;
  /** Retried tasks waiting out their backoff: their timer, and how to abandon them. */
  readonly #waiting = new Set<{ timer: ReturnType<typeof setTimeout>; abandon: () => void }>();
  readonly #idle: (() => void)[] = [];
  readonly #initialMs: number;
  readonly #maxMs: number;
  readonly #onError: SerialQueueOptions["onError"];
  #stopped = false;

  constructor(o: SerialQueueOptions = {}) {
    this.#initialMs = o.retryInitialMs ?? 1_000;
    this.#maxMs = o.retryMaxMs ?? 30_000;
    this.#onError = o.onError;
  }

  /** Whether {@linkcode stop} was called. */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** Tasks queued, running or waiting to be tried again. */
  get pending(): number {
    return this.#items.length + (this.#running ? 1 : 0) + this.#waiting.size;
  }

  /**
   * Runs `fn` once, after what is queued before it; its result or its error (a synchronous
   * throw included) is the promise's. Rejects with {@linkcode QueueStoppedError} once the
   * queue is stopped.
   */
  run<T>(fn: () => T | Promise<T>, o: QueuePlace = {}): Promise<T> {
    if (this.#stopped) return Promise.reject(new QueueStoppedError());
    return new Promise<T>((resolve, reject) => {
      this.#push(async () => {
        try {
          resolve(await fn());
        } catch (err) {
          reject(err);
        }
      }, o.first);
    });
  }

  /**
   * Runs `fn` until it succeeds: each failure is told to `onError` and queues it again
   * (at the end) after a backoff, `retryInitialMs` doubling up to `retryMaxMs`. Resolves
   * with its first success; rejects with {@linkcode QueueStoppedError} when the queue stops
   * while it waits, or with its error when it fails while the queue is stopping.
   */
  retry<T>(fn: () => T | Promise<T>, o: QueuePlace & { name?: string } = {}): Promise<T> {
    if (this.#stopped) return Promise.reject(new QueueStoppedError());
    return new Promise<T>((resolve, reject) => {
      let attempt = 0;
      const once = async () => {
        attempt++;
        try {
          resolve(await fn());
          return;
        } catch (err) {
          const retryInMs = this.#stopped
            ? null
            : Math.min(this.#maxMs, this.#initialMs * 2 ** Math.min(attempt - 1, 30));
          try {
            this.#onError?.(err, { name: o.name, attempt, retryInMs });
          } catch { /* a report never stops the queue */ }
          if (retryInMs === null) return reject(err);
          const w = {
            timer: setTimeout(() => {
              this.#waiting.delete(w);
              this.#push(once);
            }, retryInMs),
            abandon: () => reject(new QueueStoppedError()),
          };
          this.#waiting.add(w);
        }
      };
      this.#push(once, o.first);
    });
  }

  /** Resolves once nothing is queued, running or waiting to be tried again. */
  idle(): Promise<void> {
    if (this.pending === 0) return Promise.resolve();
    return new Promise<void>((r) => this.#idle.push(r));
  }

  /**
   * Stops the queue: new tasks are refused, retries waiting out their backoff are
   * abandoned, and it resolves once every task queued before has run.
   */
  async stop(): Promise<void> {
    this.#stopped = true;
    for (const w of this.#waiting) {
      clearTimeout(w.timer);
      w.abandon();
    }
    this.#waiting.clear();
    while (this.#running) await this.#running;
    this.#wakeIdle();
  }

  #push(item: () => Promise<void>, first = false): void {
    if (first) this.#items.unshift(item);
    else this.#items.push(item);
    this.#running ??= this.#pump();
  }

  async #pump(): Promise<void> {
    while (this.#items.length > 0) {
      const item = this.#items.shift()!;
      try {
        await item();
      } catch { /* an item settles its own promise; nothing reaches here */ }
    }
    this.#running = null;
    this.#wakeIdle();
  }

  #wakeIdle(): void {
    if (this.pending > 0) return;
    for (const r of this.#idle.splice(0)) r();
  }
}
