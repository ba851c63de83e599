/**
 * The kubelet device plugin `enim.dev/eni`, over gRPC (`@grpc/grpc-js`, API v1beta1:
 * `v1beta1.ts`).
 *
 * Life: the plugin serves its `DevicePlugin` service on a socket in kubelet's folder
 * (`enim.sock`), registers it with kubelet's `Registration` service
 * (`kubelet.sock`), and keeps both in step:
 *
 * - **The list** follows the agent's state (`devices.ts`): the provider's capacity is
 *   read every `resyncMs`, and each ListAndWatch stream is sent a new list when the
 *   list differs from the last one it was sent, never a copy.
 * - **kubelet restarts**: a starting kubelet deletes every socket in its folder and
 *   opens a new `kubelet.sock`. The plugin checks both files every `watchIntervalMs`:
 *   its own socket gone (or replaced) → it serves a new one; kubelet's socket new (or
 *   not registered yet) → it registers (retrying at most every 5 s while kubelet
 *   refuses or does not answer).
 * - **Bad input from kubelet** (unknown device IDs, malformed messages, a stream
 *   closed under it, a kubelet socket that never answers) is answered with a gRPC
 *   error or a log line; nothing of it reaches the agent's CNI service.
 * - **Stopping**: every device is sent Unhealthy, the streams end, the socket goes.
 *
 * Logged (JSON lines), each with its reason: every ListAndWatch stream opened and
 * ended (`_streams.ts`), every socket served, every registration and every failed
 * one (first, kubelet's socket new, the plugin's socket served again, a retry).
 *
 * Why one file: serving, registering, watching the two sockets and publishing the list
 * are one state machine over the same fields (the server, the socket's identity, the
 * registration, the advertised list); the parts that stand alone already live beside
 * it (`_grpc.ts`, `_service.ts`, `_streams.ts`, `devices.ts`).
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import { join } from "node:path";
import type { Logger } from "../../lib/log.ts";
import type { NodeCapacity } from "../../providers/contract.ts";
import type { DevicePluginStatus } from "../../api/schema.ts";
import { DEVICE_PLUGIN_RESOURCE } from "../config.ts";
import { advertise, type Advertised, listKey } from "./devices.ts";
import { Streams } from "./_streams.ts";
import { errorText, register, RegisterError, services } from "./_grpc.ts";
import { serviceHandlers } from "./_service.ts";
import { API_VERSION, type Device, KUBELET_SOCKET_NAME } from "./v1beta1.ts";

/** The extended resource enim advertises. */
const RESOURCE_NAME = DEVICE_PLUGIN_RESOURCE;
/** The plugin's socket, in kubelet's folder. */
export const SOCKET_NAME = "enim.sock";

/** What the device plugin records in the agent's metrics. */
export interface DevicePluginRecorder {
  /** One Register call, by result (`ok`, `failed`). */
  devicePluginRegistration(result: "ok" | "failed"): void;
  /** One list sent on a ListAndWatch stream. */
  devicePluginListSent(): void;
}

/** What {@linkcode startDevicePlugin} needs. */
export interface DevicePluginOptions {
  /** kubelet's device-plugin folder (`/var/lib/kubelet/device-plugins`). */
  dir: string;
  /** How many ENIs pods can get, and why not more (the provider's capacity, parsed). */
  capacity(): Promise<NodeCapacity>;
  /** Whether the agent is ready to serve pods. */
  ready(): boolean;
  log: Logger;
  metrics?: DevicePluginRecorder;
  /** How often the capacity is read (default 5 s). */
  resyncMs?: number;
  /** How long the provider may fail before every device is Unhealthy (default 60 s). */
  unreachableAfterMs?: number;
  /** How long kubelet has to answer Register (default 5 s). */
  registerTimeoutMs?: number;
  /** How often the two sockets are checked (default 1 s). */
  watchIntervalMs?: number;
  /** The clock the health thresholds follow, epoch milliseconds (tests move it). */
  now?: () => number;
}

/** A running device plugin. */
export interface DevicePlugin {
  /** What `enim status` shows. */
  status(): DevicePluginStatus;
  /** Reads the capacity now and sends the new list where it changed. */
  refresh(): Promise<void>;
  /** Sends every device Unhealthy, ends the streams, stops serving, removes the socket. */
  close(): Promise<void>;
}

/**
 * Which file is at `path` now (its inode and creation time, so a new file that
 * reuses a deleted one's inode still differs), null when there is none.
 */
async function fileId(path: string): Promise<string | null> {
  try {
    const st = await Deno.stat(path);
    return `${st.ino}@${(st.birthtime ?? st.mtime)?.getTime()}`;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return null;
    throw err;
  }
}

class DevicePluginServer implements DevicePlugin {
  readonly #o: Required<Omit<DevicePluginOptions, "metrics">> & { metrics?: DevicePluginRecorder };
  readonly #socket: string;
  readonly #kubelet: string;
  readonly #log: Logger;
  #server: grpc.Server | null = null;
  /** The socket this agent serves (to notice it was deleted or replaced). */
  #socketId: string | null = null;
  readonly #streams: Streams;
  #capacity: NodeCapacity | null = null;
  #failing: { sinceMs: number; message: string } | null = null;
  #advertised: Advertised;
  /** The kubelet socket Register last succeeded on (null: not registered with this kubelet). */
  #registeredOn: string | null = null;
  #registeredAt: number | null = null;
  #registerError: string | null = null;
  #registering: Promise<void> | null = null;
  /** Why the next registration is due (its log line says so). */
  #registerReason = "the plugin started";
  #nextRegisterAt = 0;
  #failures = 0;
  #closing = false;
  #timers: ReturnType<typeof setInterval>[] = [];
  #ticking: Promise<void> = Promise.resolve();

  constructor(o: DevicePluginOptions) {
    this.#o = {
      resyncMs: 5000,
      unreachableAfterMs: 60_000,
      registerTimeoutMs: 5000,
      watchIntervalMs: 1000,
      now: Date.now,
      ...o,
    };
    this.#socket = join(o.dir, SOCKET_NAME);
    this.#kubelet = join(o.dir, KUBELET_SOCKET_NAME);
    this.#log = o.log;
    this.#streams = new Streams(o.log, () => o.metrics?.devicePluginListSent());
    this.#advertised = this.#decide();
  }

  #decide(): Advertised {
    return advertise({
      capacity: this.#capacity,
      failing: this.#failing,
      ready: !this.#closing && this.#o.ready(),
      nowMs: this.#o.now(),
      unreachableAfterMs: this.#o.unreachableAfterMs,
    });
  }

  async start(): Promise<void> {
    await this.refresh();
    if (await this.#folderExists()) await this.#serve("the plugin started");
    // Registering may wait for kubelet (up to registerTimeoutMs): not on the agent's start-up.
    this.#tick(() => this.#watch());
    this.#timers.push(
      setInterval(() => this.#tick(() => this.refresh()), this.#o.resyncMs),
      setInterval(() => this.#tick(() => this.#watch()), this.#o.watchIntervalMs),
    );
  }

  /** Whether kubelet's folder is there (a plugin enabled outright waits for it). */
  async #folderExists(): Promise<boolean> {
    try {
      return (await Deno.stat(this.#o.dir)).isDirectory;
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) return false;
      throw err;
    }
  }

  /** Runs `fn` after the previous tick, logging (never throwing) its failure. */
  #tick(fn: () => Promise<void>): void {
    this.#ticking = this.#ticking.then(fn).catch((err) => {
      this.#log.error("The device plugin's upkeep failed; it tries again", { error: err });
    });
  }

  async refresh(): Promise<void> {
    try {
      this.#capacity = await this.#o.capacity();
      if (this.#failing) {
        this.#log.info("The provider tells the node's ENI capacity again", {
          failedForSeconds: Math.round((this.#o.now() - this.#failing.sinceMs) / 1000),
        });
      }
      this.#failing = null;
    } catch (err) {
      const message = errorText(err);
      if (!this.#failing) {
        this.#log.warn("Cannot read the node's ENI capacity from the provider", { error: err });
      }
      this.#failing = { sinceMs: this.#failing?.sinceMs ?? this.#o.now(), message };
    }
    this.#publish();
  }

  /** Recomputes the list and sends it to every stream it is new to. */
  #publish(): void {
    const before = this.#advertised;
    const next = this.#decide();
    this.#advertised = next;
    if (listKey(before.devices) !== listKey(next.devices)) {
      this.#log.info("The advertised devices changed", {
        resource: RESOURCE_NAME,
        devices: next.devices.length,
        healthy: next.healthy,
        unhealthy: next.unhealthy,
      });
    }
    this.#streams.publish(next.devices);
  }

  /** A ListAndWatch stream kubelet opened: the current list now, then each new one. */
  #openStream(call: grpc.ServerWritableStream<unknown, unknown>): void {
    if (this.#closing) {
      this.#log.info("Ending a ListAndWatch stream kubelet opened: the agent is shutting down");
      call.end();
    } else this.#streams.open(call, this.#advertised.devices);
  }

  /**
   * Serves the DevicePlugin service on a fresh socket (a stale one of ours is replaced);
   * `why` is logged, with the streams the old socket's server ends.
   */
  async #serve(why: string): Promise<void> {
    const old = this.#server;
    this.#server = null;
    this.#socketId = null;
    if (old) {
      this.#streams.endAll(`the plugin serves a new socket (${why})`);
      old.forceShutdown();
    }
    await Deno.remove(this.#socket).catch((err) => {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    });
    const server = new grpc.Server();
    server.addService(
      services().plugin,
      serviceHandlers({
        resourceName: RESOURCE_NAME,
        devices: () => this.#advertised.devices,
        openStream: (call) => this.#openStream(call),
        log: this.#log,
      }),
    );
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(
        `unix:${this.#socket}`,
        grpc.ServerCredentials.createInsecure(),
        (err) => err ? reject(err) : resolve(),
      )
    ).catch((err) => {
      server.forceShutdown();
      throw new Error(`Cannot serve the device plugin on "${this.#socket}": ${errorText(err)}`, {
        cause: err,
      });
    });
    this.#server = server;
    this.#socketId = await fileId(this.#socket);
    this.#registeredOn = null;
    this.#nextRegisterAt = 0;
    this.#registerReason = why;
    this.#log.info("Serving the device plugin", {
      resource: RESOURCE_NAME,
      socket: this.#socket,
      reason: why,
    });
  }

  /** One check of the folder and the two sockets (see the module doc). */
  async #watch(): Promise<void> {
    if (this.#closing) return;
    if (!this.#server) {
      if (!(await this.#folderExists())) {
        this.#registerError = `kubelet's device-plugin folder "${this.#o.dir}" does not exist yet`;
        return;
      }
      await this.#serve(`kubelet's device-plugin folder "${this.#o.dir}" appeared`);
    } else if (await fileId(this.#socket) !== this.#socketId) {
      this.#log.info(
        "The device plugin's socket was removed (kubelet restarted?); serving it again and registering",
        { socket: this.#socket },
      );
      await this.#serve("its socket was removed or replaced (kubelet restarted?)");
    }
    await this.#registerIfDue();
  }

  async #registerIfDue(): Promise<void> {
    if (this.#closing || this.#registering) return;
    const kubelet = await fileId(this.#kubelet);
    if (kubelet === null) {
      if (this.#registeredOn !== null) {
        this.#log.info("kubelet's socket is gone; waiting for kubelet", { socket: this.#kubelet });
        this.#registerReason = "kubelet's socket came back (kubelet restarted)";
      }
      this.#registeredOn = null;
      this.#registerError =
        `kubelet's socket "${this.#kubelet}" does not exist (is kubelet running?)`;
      return;
    }
    if (kubelet === this.#registeredOn) return;
    // A kubelet that restarted since #watch looked at our socket has deleted it (a starting
    // kubelet deletes every socket in the folder before it serves its own): a Register now
    // would send kubelet to a socket that is gone. The next look serves ours, then registers.
    if (this.#server && await fileId(this.#socket) !== this.#socketId) return;
    // A new kubelet socket: whatever kubelet had the registration, this one has not.
    if (this.#registeredOn !== null) {
      this.#registerReason = "kubelet's socket is new (kubelet restarted)";
      this.#log.info("kubelet's socket is new; registering again", { socket: this.#kubelet });
    }
    this.#registeredOn = null;
    if (performance.now() < this.#nextRegisterAt) return;
    this.#registering = this.#register(kubelet).finally(() => this.#registering = null);
    await this.#registering;
  }

  async #register(kubelet: string): Promise<void> {
    try {
      await register(this.#kubelet, {
        version: API_VERSION,
        endpoint: SOCKET_NAME,
        resource_name: RESOURCE_NAME,
        options: { pre_start_required: false, get_preferred_allocation_available: false },
      }, this.#o.registerTimeoutMs);
      this.#registeredOn = kubelet;
      this.#registeredAt = this.#o.now();
      this.#registerError = null;
      const retries = this.#failures;
      this.#failures = 0;
      this.#o.metrics?.devicePluginRegistration("ok");
      this.#log.info("Registered the device plugin with kubelet", {
        resource: RESOURCE_NAME,
        kubelet: this.#kubelet,
        endpoint: SOCKET_NAME,
        reason: this.#registerReason,
        ...(retries > 0 ? { failedAttempts: retries } : {}),
      });
    } catch (err) {
      const why = err instanceof RegisterError ? err.message : errorText(err);
      this.#failures++;
      // Soon again (kubelet may be starting), backing off to 5 s while it refuses or hangs.
      this.#nextRegisterAt = performance.now() + Math.min(5000, 250 * 2 ** this.#failures);
      this.#o.metrics?.devicePluginRegistration("failed");
      if (why !== this.#registerError) {
        this.#log.warn("Cannot register the device plugin with kubelet; retrying", {
          error: why,
          reason: this.#registerReason,
        });
      }
      this.#registerError = why;
    }
  }

  status(): DevicePluginStatus {
    const a = this.#advertised;
    return {
      state: this.#registeredOn !== null ? "registered" : "registering",
      reason: this.#registeredOn !== null ? a.note : this.#registerError ?? a.note,
      resourceName: RESOURCE_NAME,
      socket: this.#socket,
      registeredAt: this.#registeredAt === null ? null : new Date(this.#registeredAt).toISOString(),
      streams: this.#streams.size,
      limit: a.limit,
      healthy: a.healthy,
      unhealthy: a.devices.length - a.healthy,
      unhealthyReasons: a.unhealthy.map((u) => ({
        reason: u.reason,
        devices: u.devices,
        message: u.message,
      })),
    };
  }

  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    for (const t of this.#timers) clearInterval(t);
    await this.#ticking;
    await this.#registering;
    this.#publish(); // every device Unhealthy: the agent is not ready any more
    this.#streams.endAll("the agent is shutting down");
    const server = this.#server;
    this.#server = null;
    if (server) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, 1000);
        server.tryShutdown(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    // Only the socket this agent made: a new kubelet may have a new one of its own there.
    if (this.#socketId !== null && await fileId(this.#socket) === this.#socketId) {
      await Deno.remove(this.#socket).catch(() => {});
    }
  }
}

/**
 * Starts the device plugin: reads the capacity, serves the socket, registers with
 * kubelet when its socket is there (else when it appears), and keeps it all up to
 * date until {@linkcode DevicePlugin.close}.
 */
export async function startDevicePlugin(o: DevicePluginOptions): Promise<DevicePlugin> {
  const plugin = new DevicePluginServer(o);
  try {
    await plugin.start();
  } catch (err) {
    await plugin.close();
    throw err;
  }
  return plugin;
}

export type { Device };
