/**
 * kubelet's ListAndWatch streams: each is sent the current device list when it
 * opens, then a list only when the list differs from the last one it was sent
 * (never a copy, whatever calls {@linkcode Streams.publish}). A stream kubelet
 * cancels, or one that fails, is dropped.
 *
 * @module
 */
import type * as grpc from "@grpc/grpc-js";
import type { Logger } from "../../lib/log.ts";
import { listKey } from "./devices.ts";
import type { Device } from "./v1beta1.ts";

interface Stream {
  call: grpc.ServerWritableStream<unknown, unknown>;
  /** The key of the last list written to it. */
  last: string | null;
}

/** The open ListAndWatch streams. */
export class Streams {
  readonly #open = new Set<Stream>();
  readonly #log: Logger;
  readonly #onSent: () => void;

  /** `onSent` is called for each list written (the metrics). */
  constructor(log: Logger, onSent: () => void = () => {}) {
    this.#log = log;
    this.#onSent = onSent;
  }

  /** How many are open. */
  get size(): number {
    return this.#open.size;
  }

  /** Takes a stream kubelet opened and sends it `devices`. */
  open(call: grpc.ServerWritableStream<unknown, unknown>, devices: readonly Device[]): void {
    const s: Stream = { call, last: null };
    const drop = () => this.#open.delete(s);
    call.on("cancelled", drop);
    call.on("close", drop);
    call.on("error", (err: unknown) => {
      this.#log.debug("A ListAndWatch stream failed", { error: err });
      drop();
    });
    this.#open.add(s);
    this.#log.info("kubelet opened a ListAndWatch stream", { streams: this.#open.size });
    this.#send(s, devices);
  }

  /** Sends `devices` to every stream it is new to. */
  publish(devices: readonly Device[]): void {
    for (const s of this.#open) this.#send(s, devices);
  }

  /** Ends every stream (kubelet sees the plugin go). */
  endAll(): void {
    for (const s of this.#open) s.call.end();
    this.#open.clear();
  }

  #send(s: Stream, devices: readonly Device[]): void {
    const key = listKey(devices);
    if (s.last === key) return;
    try {
      s.call.write({ devices });
      s.last = key;
      this.#onSent();
    } catch (err) {
      this.#log.warn("Cannot send the device list to kubelet; dropping the stream", {
        error: err,
      });
      this.#open.delete(s);
    }
  }
}
