/**
 * kubelet's ListAndWatch streams: each is sent the current device list when it
 * opens, then a list only when the list differs from the last one it was sent
 * (never a copy, whatever calls {@linkcode Streams.publish}). A stream kubelet
 * cancels, or one that fails, is dropped.
 *
 * Every stream's opening and its end are logged (JSON lines), the end once, with
 * its reason (kubelet cancelled it, kubelet closed it, it failed, sending to it
 * failed, or the plugin ended it and why), how long it was open and how many
 * streams are left: when no stream is left, kubelet has nothing from this node's
 * plugin, and that line says why the node stopped advertising.
 *
 * @module
 */
import type * as grpc from "@grpc/grpc-js";
import type { Logger } from "../../lib/log.ts";
import { errorText } from "./_grpc.ts";
import { listKey } from "./devices.ts";
import type { Device } from "./v1beta1.ts";

interface Stream {
  call: grpc.ServerWritableStream<unknown, unknown>;
  /** The key of the last list written to it. */
  last: string | null;
  /** Its number since the plugin started (to tell the log lines of two streams apart). */
  id: number;
  /** When it opened (`performance.now()`). */
  since: number;
}

/** The open ListAndWatch streams. */
export class Streams {
  readonly #open = new Set<Stream>();
  readonly #log: Logger;
  readonly #onSent: () => void;
  #opened = 0;

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
    const s: Stream = { call, last: null, id: ++this.#opened, since: performance.now() };
    call.on("cancelled", () => this.#drop(s, "kubelet cancelled the stream"));
    call.on("close", () => this.#drop(s, "kubelet closed the stream"));
    call.on(
      "error",
      (err: unknown) => this.#drop(s, `the stream failed: ${errorText(err)}`, "warn"),
    );
    this.#open.add(s);
    this.#log.info("kubelet opened a ListAndWatch stream", {
      stream: s.id,
      streams: this.#open.size,
    });
    this.#send(s, devices);
  }

  /** Sends `devices` to every stream it is new to. */
  publish(devices: readonly Device[]): void {
    for (const s of this.#open) this.#send(s, devices);
  }

  /** Ends every stream (kubelet sees the plugin go), logging `reason` for each. */
  endAll(reason: string): void {
    for (const s of [...this.#open]) {
      this.#drop(s, `the plugin ended the stream: ${reason}`);
      s.call.end();
    }
  }

  /** Forgets `s` and logs why, once (a stream reports several of its events). */
  #drop(s: Stream, reason: string, level: "info" | "warn" = "info"): void {
    if (!this.#open.delete(s)) return;
    this.#log[level]("A ListAndWatch stream ended", {
      stream: s.id,
      reason,
      openSeconds: Math.round((performance.now() - s.since) / 100) / 10,
      streams: this.#open.size,
      ...(this.#open.size === 0 ? { note: "kubelet has no device list from enim now" } : {}),
    });
  }

  #send(s: Stream, devices: readonly Device[]): void {
    const key = listKey(devices);
    if (s.last === key) return;
    try {
      s.call.write({ devices });
      s.last = key;
      this.#onSent();
    } catch (err) {
      this.#drop(s, `sending the device list failed: ${errorText(err)}`, "warn");
    }
  }
}
