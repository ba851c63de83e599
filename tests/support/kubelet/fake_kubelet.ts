/**
 * kubelet's side of the device-plugin API (v1beta1), for tests, in a child process of its
 * own (`kubelet_main.ts`), as kubelet is in production: it serves `Registration` on
 * `kubelet.sock` in a folder of the test's choosing, records each plugin's Register, and
 * connects back to a plugin's socket to call `GetDevicePluginOptions`, `ListAndWatch`,
 * `Allocate`, `PreStartContainer` and `GetPreferredAllocation`, as kubelet's device manager
 * does (pkg/kubelet/cm/devicemanager). {@linkcode FakeKubelet.restart} does what a starting
 * kubelet does to the folder: it deletes every file in it, then serves a new `kubelet.sock`.
 *
 * With `podResources`, it also serves kubelet's pod-resources API (`List` and `Get`)
 * on `pod-resources/kubelet.sock` beside the folder, from the pods the test says
 * kubelet has admitted with their devices ({@linkcode FakeKubelet.admit},
 * {@linkcode FakeKubelet.forget}): kubelet lists a pod from its admission, when its
 * devices are allocated, until it is gone.
 *
 * Why a child process (issue 41 item 4): a test process that held both the plugin's gRPC
 * server and kubelet's clients of it (and the plugin's clients of kubelet's servers) was
 * now and then aborted inside nghttp2 (`stream->closed_next == NULL`, Deno's `node:http2`
 * under `@grpc/grpc-js`, denoland/deno#36788), taking the whole `deno test` run with it;
 * it was seen only with both ends in one process. Here every gRPC end of kubelet's is in
 * the child, every end of enim's in the test.
 *
 * What the child sees comes back as events, in the order it saw them: the Registers
 * ({@linkcode FakeKubelet.registrations}), each stream's lists and end
 * ({@linkcode ListWatch}). Built only from the published API (`api.ts`, the protos beside
 * this file); it imports none of enim's code. Every line from the child is parsed with zod.
 *
 * @module
 */
import { z } from "zod";
import {
  AllocateResponseSchema,
  type Command,
  type Device,
  KUBELET_SOCKET,
  type Message,
  MessageSchema,
  OptionsSchema,
  PLUGIN_METHODS,
  type PluginMethod,
  POD_RESOURCES_SOCKET,
  PreStartResponseSchema,
  type RegisterRequest,
} from "./api.ts";

export {
  AllocateResponseSchema,
  type Device,
  DeviceSchema,
  KUBELET_SOCKET,
  OptionsSchema,
  POD_RESOURCES_SOCKET,
  type RegisterRequest,
  RegisterRequestSchema,
} from "./api.ts";

const MAIN = new URL("./kubelet_main.ts", import.meta.url).pathname;
const HERE = MAIN.slice(0, MAIN.lastIndexOf("/"));
const CONFIG = new URL("../../deno.json", import.meta.url).pathname;
/** How long the child may take to stop once told to. */
const EXIT_MS = 10_000;

/** A failed call: the gRPC status code and the other side's message. */
export class RpcError extends Error {
  readonly code: number;
  readonly details: string;
  constructor(method: string, code: number, details: string, options?: ErrorOptions) {
    super(`${method} failed (gRPC code ${code}): ${details}`, options);
    this.name = "RpcError";
    this.code = code;
    this.details = details;
  }
}

/** A command as the test writes it: without its id. */
type Request = Command extends infer C ? C extends { id: number } ? Omit<C, "id"> : never
  : never;

/** A failed command: the child's message, and the gRPC status when a call failed. */
class CommandError extends Error {
  readonly rpc: { code: number; details: string } | undefined;
  constructor(message: string, rpc?: { code: number; details: string }) {
    super(message);
    this.rpc = rpc;
  }
}

/** Something to wake when the child reports anything. */
class Wakeups {
  #waiters: (() => void)[] = [];

  wake(): void {
    for (const w of this.#waiters.splice(0)) w();
  }

  /** Waits until `done()` holds, failing with `timeout()`'s error after `timeoutMs`. */
  async until(done: () => boolean, timeoutMs: number, timeout: () => Error): Promise<void> {
    const until = Date.now() + timeoutMs;
    while (!done()) {
      const left = until - Date.now();
      if (left <= 0) throw timeout();
      let timer: ReturnType<typeof setTimeout> | undefined;
      await new Promise<void>((resolve) => {
        this.#waiters.push(resolve);
        timer = setTimeout(resolve, left);
      });
      clearTimeout(timer);
    }
  }
}

/** The child: commands to its stdin, answers and events from its stdout. */
class KubeletProcess {
  readonly #child: Deno.ChildProcess;
  readonly #stdin: WritableStreamDefaultWriter<Uint8Array>;
  readonly #pending = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  /** Commands sent without waiting (cancel, close): awaited before the child stops. */
  readonly #background = new Set<Promise<unknown>>();
  readonly #reading: Promise<void>;
  #nextId = 1;
  #writing = Promise.resolve();
  /** Why the child is gone, once it is. */
  gone: Error | null = null;

  constructor(
    dir: string,
    endpoints: string[],
    onEvent: (m: Message) => void,
    onGone: () => void,
  ) {
    const root = dir.replace(/\/[^/]*\/?$/, "");
    // Its own two sockets and the plugins' it will call: nothing else, no TCP.
    const sockets = [KUBELET_SOCKET, ...endpoints].map((s) => `${dir}/${s}`);
    sockets.push(`${root}/${POD_RESOURCES_SOCKET}`);
    this.#child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--quiet",
        "--no-prompt",
        `--config=${CONFIG}`,
        `--allow-read=${root},${HERE}`,
        `--allow-write=${root}`,
        `--allow-net=${sockets.map((s) => `unix:${s}`).join(",")}`,
        "--allow-env",
        MAIN,
      ],
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#stdin = this.#child.stdin.getWriter();
    this.#reading = this.#read(onEvent).then(async () => {
      const { code, signal } = await this.#child.status;
      this.gone ??= new Error(
        `The tests' kubelet (PID ${this.#child.pid}) exited (code ${code}${
          signal ? `, ${signal}` : ""
        })`,
      );
      for (const p of this.#pending.values()) p.reject(this.gone);
      this.#pending.clear();
      onGone();
    });
  }

  async #read(onEvent: (m: Message) => void): Promise<void> {
    let buffered = "";
    for await (const chunk of this.#child.stdout.pipeThrough(new TextDecoderStream())) {
      buffered += chunk;
      for (let nl = buffered.indexOf("\n"); nl !== -1; nl = buffered.indexOf("\n")) {
        const m = MessageSchema.parse(JSON.parse(buffered.slice(0, nl)));
        buffered = buffered.slice(nl + 1);
        if (m.kind === "answer" || m.kind === "failed") {
          const p = this.#pending.get(m.id);
          this.#pending.delete(m.id);
          if (m.kind === "answer") p?.resolve(m.result);
          else p?.reject(new CommandError(m.message, m.rpc));
        } else onEvent(m);
      }
    }
  }

  /** Sends `req`; resolves with the child's answer. */
  request(req: Request): Promise<unknown> {
    if (this.gone) return Promise.reject(this.gone);
    const id = this.#nextId++;
    const answered = new Promise<unknown>((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
    });
    const line = new TextEncoder().encode(`${JSON.stringify({ ...req, id })}\n`);
    this.#writing = this.#writing.then(() => this.#stdin.write(line)).catch((err) => {
      this.#pending.get(id)?.reject(err);
      this.#pending.delete(id);
    });
    return answered;
  }

  /** Sends `req` without waiting for its answer (awaited, errors ignored, by {@linkcode stop}). */
  post(req: Request): void {
    const p = this.request(req).catch(() => {}).finally(() => this.#background.delete(p));
    this.#background.add(p);
  }

  /** Stops everything in the child, ends its stdin and waits for it to exit (killed by PID after 10 s). */
  async stop(): Promise<void> {
    await Promise.all(this.#background);
    if (!this.gone) await this.request({ op: "close" }).catch(() => {});
    await this.#writing;
    await this.#stdin.close().catch(() => {});
    const timer = setTimeout(() => {
      try {
        this.#child.kill("SIGKILL");
      } catch { /* exited */ }
    }, EXIT_MS);
    try {
      await this.#reading;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A kubelet stand-in serving Registration in `dir`, in a child process (see the module doc). */
export class FakeKubelet implements AsyncDisposable {
  readonly dir: string;
  /** Every accepted Register, in order. */
  readonly registrations: RegisterRequest[] = [];
  /** Every refused Register, with kubelet's message. */
  readonly refused: { request: RegisterRequest; message: string }[] = [];
  readonly #proc: KubeletProcess;
  readonly #wakeups = new Wakeups();
  readonly #watches = new Map<number, ListWatch>();
  #nextHandle = 1;
  #disposed = false;

  private constructor(dir: string, endpoints: string[]) {
    this.dir = dir;
    this.#proc = new KubeletProcess(dir, endpoints, (m) => this.#event(m), () => this.#gone());
  }

  /**
   * Starts the kubelet process serving Registration on `<dir>/kubelet.sock` and, with
   * `podResources`, the pod-resources API on `<dir>/../pod-resources/kubelet.sock`.
   * `endpoints`: the plugins' socket names kubelet may connect to (its process may reach
   * no other socket; default: enim's, `enim.sock`).
   */
  static async start(
    dir: string,
    opts: { podResources?: boolean; endpoints?: string[] } = {},
  ): Promise<FakeKubelet> {
    const k = new FakeKubelet(dir, opts.endpoints ?? ["enim.sock"]);
    try {
      await k.#proc.request({ op: "start", dir, podResources: opts.podResources ?? false });
    } catch (err) {
      await k.#proc.stop();
      throw err;
    }
    return k;
  }

  #event(m: Message): void {
    if (m.kind === "registered") this.registrations.push(m.request);
    else if (m.kind === "refused") this.refused.push({ request: m.request, message: m.message });
    else if (m.kind === "list") this.#watches.get(m.watch)?.received(m.devices);
    else if (m.kind === "ended") {
      this.#watches.get(m.watch)?.finished(m.error === null ? "ended" : new Error(m.error));
      this.#watches.delete(m.watch);
    }
    this.#wakeups.wake();
  }

  #gone(): void {
    for (const w of this.#watches.values()) w.finished(this.#proc.gone ?? new Error("gone"));
    this.#watches.clear();
    this.#wakeups.wake();
  }

  /** The path of kubelet's pod-resources socket (beside the device-plugin folder). */
  get podResourcesSocket(): string {
    return `${this.dir.replace(/\/[^/]*\/?$/, "")}/${POD_RESOURCES_SOCKET}`;
  }

  /** The path of kubelet's socket. */
  get socket(): string {
    return `${this.dir}/${KUBELET_SOCKET}`;
  }

  /**
   * kubelet admits a pod: its first container gets `deviceIds` of `resource` (none: a
   * pod without the request, which kubelet lists with no device).
   */
  async admit(
    namespace: string,
    name: string,
    deviceIds: string[],
    resource = "enim.dev/eni",
  ): Promise<void> {
    await this.#proc.request({
      op: "admit",
      pod: {
        namespace,
        name,
        containers: [{
          name: "app",
          devices: deviceIds.length ? [{ resource_name: resource, device_ids: deviceIds }] : [],
        }],
      },
    });
  }

  /** kubelet is done with a pod (deleted, its containers gone): its devices are free. */
  async forget(namespace: string, name: string): Promise<void> {
    await this.#proc.request({ op: "forget", namespace, name });
  }

  /** How many pod-resources calls kubelet has answered. */
  async podResourcesCalls(): Promise<number> {
    return z.number().int().parse(await this.#proc.request({ op: "podResourcesCalls" }));
  }

  /** Resolves once everything the child saw before now has been reported here. */
  async sync(): Promise<void> {
    await this.#proc.request({ op: "sync" });
  }

  /** Waits until `count` Registers have been accepted; throws after `timeoutMs`. */
  async waitForRegistrations(count: number, timeoutMs = 10_000): Promise<RegisterRequest> {
    await this.#wakeups.until(
      () => this.registrations.length >= count || this.#proc.gone !== null,
      timeoutMs,
      () =>
        new Error(
          `No Register number ${count} within ${timeoutMs} ms (${this.registrations.length} so far${
            this.refused.length ? `; refused: ${this.refused.map((r) => r.message).join("; ")}` : ""
          })`,
        ),
    );
    if (this.registrations.length < count) throw this.#proc.gone;
    return this.registrations[count - 1];
  }

  /** Connects to a plugin's endpoint (a socket name in the folder), as kubelet does after Register. */
  plugin(endpoint: string): PluginClient {
    const client = this.#nextHandle++;
    this.#proc.post({ op: "open", client, endpoint });
    return new PluginClient(this.#proc, client, () => {
      const w = new ListWatch(this, this.#nextHandle++);
      this.#watches.set(w.id, w);
      this.#proc.post({ op: "watch", client, watch: w.id });
      return w;
    });
  }

  /** Sends `req` without waiting (a stream's cancel). */
  post(req: Request): void {
    this.#proc.post(req);
  }

  /** Waits for what {@linkcode ListWatch} waits for. */
  until(done: () => boolean, timeoutMs: number, timeout: () => Error): Promise<void> {
    return this.#wakeups.until(done, timeoutMs, timeout);
  }

  /** Stops serving and removes kubelet's socket (kubelet going down). */
  async stop(): Promise<void> {
    await this.#proc.request({ op: "stop" });
  }

  /**
   * A kubelet restart: this one stops, the new one deletes every file in the folder
   * (every plugin's socket) and serves a new kubelet.sock. Resolves with the folder's
   * entries as the new kubelet saw them once it served its socket.
   */
  async restart(): Promise<string[]> {
    return z.array(z.string()).parse(await this.#proc.request({ op: "restart" }));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    await this.#proc.stop();
    this.#wakeups.wake();
  }
}

/** A stream of device lists from ListAndWatch, as kubelet's process received them. */
export class ListWatch {
  readonly id: number;
  /** Every list received, in order. */
  readonly lists: Device[][] = [];
  /** Set when the stream ended (the plugin closed it, or it failed). */
  ended: Error | "ended" | null = null;
  readonly #kubelet: FakeKubelet;

  constructor(kubelet: FakeKubelet, id: number) {
    this.#kubelet = kubelet;
    this.id = id;
  }

  /** A list arrived (from the kubelet process). */
  received(devices: Device[]): void {
    this.lists.push(devices);
  }

  /** The stream ended (from the kubelet process). */
  finished(how: Error | "ended"): void {
    this.ended ??= how;
  }

  /** The last list received (throws when none). */
  get last(): Device[] {
    const l = this.lists.at(-1);
    if (!l) throw new Error("No list received yet");
    return l;
  }

  /** The last list kubelet's process had received by now (throws when none). */
  async latest(): Promise<Device[]> {
    await this.#kubelet.sync();
    return this.last;
  }

  /** Waits until list number `n` (1-based) has arrived; throws after `timeoutMs` or when the stream ended. */
  async list(n: number, timeoutMs = 10_000): Promise<Device[]> {
    await this.#kubelet.until(
      () => this.lists.length >= n || this.ended !== null,
      timeoutMs,
      () => new Error(`No list number ${n} within ${timeoutMs} ms (${this.lists.length} so far)`),
    );
    if (this.lists.length < n) {
      throw new Error(`ListAndWatch ended before list ${n}: ${this.ended}`);
    }
    return this.lists[n - 1];
  }

  /** Waits until the stream ends; throws after `timeoutMs`. */
  async end(timeoutMs = 10_000): Promise<Error | "ended"> {
    await this.#kubelet.until(
      () => this.ended !== null,
      timeoutMs,
      () => new Error(`ListAndWatch did not end within ${timeoutMs} ms`),
    );
    return this.ended!;
  }

  /** Cancels the stream from kubelet's side. */
  cancel(): void {
    this.#kubelet.post({ op: "cancel", watch: this.id });
  }
}

/** kubelet's client of one plugin's DevicePlugin service (in kubelet's process). */
export class PluginClient {
  readonly #proc: KubeletProcess;
  readonly #client: number;
  readonly #watch: () => ListWatch;

  constructor(proc: KubeletProcess, client: number, watch: () => ListWatch) {
    this.#proc = proc;
    this.#client = client;
    this.#watch = watch;
  }

  async #call<T>(
    method: PluginMethod,
    request: unknown,
    schema: z.ZodType<T>,
    timeoutMs = 10_000,
  ): Promise<T> {
    try {
      return schema.parse(
        await this.#proc.request({ op: "call", client: this.#client, method, request, timeoutMs }),
      );
    } catch (err) {
      if (err instanceof CommandError && err.rpc) {
        throw new RpcError(method, err.rpc.code, err.rpc.details, { cause: err });
      }
      throw err;
    }
  }

  /** GetDevicePluginOptions. */
  options(): Promise<z.infer<typeof OptionsSchema>> {
    return this.#call("GetDevicePluginOptions", {}, OptionsSchema);
  }

  /** ListAndWatch: a stream of lists. */
  watch(): ListWatch {
    return this.#watch();
  }

  /** Allocate, one list of device IDs per container. */
  allocate(containers: string[][]): Promise<z.infer<typeof AllocateResponseSchema>> {
    return this.#call(
      "Allocate",
      { container_requests: containers.map((ids) => ({ devices_ids: ids })) },
      AllocateResponseSchema,
    );
  }

  /** PreStartContainer. */
  preStart(ids: string[]): Promise<z.infer<typeof PreStartResponseSchema>> {
    return this.#call("PreStartContainer", { devices_ids: ids }, PreStartResponseSchema);
  }

  /** GetPreferredAllocation for one container. */
  preferred(available: string[], size: number): Promise<unknown> {
    return this.#call("GetPreferredAllocation", {
      container_requests: [{
        available_deviceIDs: available,
        must_include_deviceIDs: [],
        allocation_size: size,
      }],
    }, PLUGIN_METHODS.GetPreferredAllocation);
  }

  close(): void {
    this.#proc.post({ op: "closeClient", client: this.#client });
  }
}

/**
 * A kubelet socket that accepts connections and never answers (a kubelet that
 * hangs): returns the listener, to close at the end. No gRPC: it stays in the test.
 */
export function hangingKubelet(dir: string): { close(): Promise<void> } {
  const listener = Deno.listen({ transport: "unix", path: `${dir}/${KUBELET_SOCKET}` });
  const held: Deno.Conn[] = [];
  let closed = false;
  const accepting = (async () => {
    try {
      for await (const conn of listener) held.push(conn);
    } catch { /* closed */ }
  })();
  return {
    async close() {
      if (closed) return;
      closed = true;
      listener.close();
      await accepting;
      for (const c of held) {
        try {
          c.close();
        } catch { /* gone */ }
      }
      await Deno.remove(`${dir}/${KUBELET_SOCKET}`).catch(() => {});
    },
  };
}
