/**
 * kubelet's side of the device-plugin API (v1beta1), for tests, in child processes of its
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
 * Why child processes (issue 41 item 4): a test process that held both ends of these gRPC
 * connections was now and then aborted inside nghttp2 (`stream->closed_next == NULL`,
 * Deno's `node:http2` under `@grpc/grpc-js`, denoland/deno#36788), taking the whole
 * `deno test` run with it (1 of 140 runs of `agent/deviceplugin/` at 295bf8b). Here every
 * end of kubelet's is in a kubelet process, every end of enim's in the test. One kubelet
 * process that shut its servers down gracefully still aborted in 3 of 100 runs (the test
 * run went on; once a test failed): nghttp2 trips when a GOAWAY crosses the other end's.
 * So kubelet's processes never shut a connection down: a stopped or restarted kubelet's
 * process ends at once, as a killed kubelet's, and so does a client's when it is closed;
 * only enim's side sends GOAWAY. One process serves Registration (a restart is a new one),
 * one the pod-resources API, and each of kubelet's clients of a plugin is one (they
 * outlive a restart of Registration, as the tests expect of them).
 *
 * What the processes see comes back as events, in the order each saw them: the Registers
 * ({@linkcode FakeKubelet.registrations}), each stream's lists and end
 * ({@linkcode ListWatch}). Built only from the published API (`api.ts`, the protos beside
 * this file); it imports none of enim's code. Every line from a child is parsed with zod.
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
  type Role,
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

/** One kubelet process: commands to its stdin, answers and events from its stdout. */
class KubeletProcess {
  readonly role: Role;
  readonly #child: Deno.ChildProcess;
  readonly #stdin: WritableStreamDefaultWriter<Uint8Array>;
  readonly #pending = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  /** Commands sent without waiting (open, cancel, …): awaited before the process stops. */
  readonly #background = new Set<Promise<unknown>>();
  readonly #reading: Promise<void>;
  #nextId = 1;
  #writing = Promise.resolve();
  #stopping = false;
  /** Why the process is gone, once it is. */
  gone: Error | null = null;

  /**
   * Starts a `role` process with `allow` (Deno's permission flags); `onGone` learns whether
   * it ended unasked.
   */
  constructor(
    role: Role,
    allow: string[],
    onEvent: (m: Message) => void,
    onGone: (unasked: boolean) => void,
  ) {
    this.role = role;
    this.#child = new Deno.Command(Deno.execPath(), {
      args: ["run", "--quiet", "--no-prompt", `--config=${CONFIG}`, ...allow, MAIN, role],
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#stdin = this.#child.stdin.getWriter();
    this.#reading = this.#read(onEvent).then(async () => {
      const { code, signal } = await this.#child.status;
      this.gone ??= new Error(
        `The tests' kubelet (${role}, PID ${this.#child.pid}) exited (code ${code}${
          signal ? `, ${signal}` : ""
        })`,
      );
      for (const p of this.#pending.values()) p.reject(this.gone);
      this.#pending.clear();
      onGone(!this.#stopping);
    });
  }

  async #read(onEvent: (m: Message) => void): Promise<void> {
    let buffered = "";
    for await (const chunk of this.#child.stdout.pipeThrough(new TextDecoderStream())) {
      buffered += chunk;
      for (let nl = buffered.indexOf("\n"); nl !== -1; nl = buffered.indexOf("\n")) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        const m = this.#parse(line);
        if (m === null) continue;
        if (m.kind === "answer" || m.kind === "failed") {
          const p = this.#pending.get(m.id);
          this.#pending.delete(m.id);
          if (m.kind === "answer") p?.resolve(m.result);
          else p?.reject(new CommandError(m.message, m.rpc));
        } else onEvent(m);
      }
    }
  }

  /** A line of the child's as a message; a line that is none ends the child (by its PID). */
  #parse(line: string): Message | null {
    let json: unknown;
    try {
      json = JSON.parse(line);
    } catch {
      json = undefined;
    }
    const m = MessageSchema.safeParse(json);
    if (m.success) return m.data;
    this.gone ??= new Error(
      `The tests' kubelet (${this.role}) wrote what is not a message: ${JSON.stringify(line)}`,
    );
    try {
      this.#child.kill("SIGKILL");
    } catch { /* exited */ }
    return null;
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

  /**
   * Stops the process: at once, every connection cut and none shut down, as a killed
   * kubelet's (it ends when its stdin does; killed by PID if it has not after 10 s).
   */
  async stop(): Promise<void> {
    await Promise.all(this.#background);
    this.#stopping = true;
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

/** A kubelet stand-in serving Registration in `dir`, in child processes (see the module doc). */
export class FakeKubelet implements AsyncDisposable {
  readonly dir: string;
  /** Every accepted Register, in order. */
  readonly registrations: RegisterRequest[] = [];
  /** Every refused Register, with kubelet's message. */
  readonly refused: { request: RegisterRequest; message: string }[] = [];
  readonly #endpoints: string[];
  readonly #wakeups = new Wakeups();
  readonly #watches = new Map<number, ListWatch>();
  #registration: KubeletProcess | null = null;
  #podResources: KubeletProcess | null = null;
  readonly #clients = new Set<KubeletProcess>();
  /** A process that ended unasked. */
  #failure: Error | null = null;
  #nextHandle = 1;
  #disposed = false;

  private constructor(dir: string, endpoints: string[]) {
    this.dir = dir;
    this.#endpoints = endpoints;
  }

  /**
   * Starts kubelet serving Registration on `<dir>/kubelet.sock` and, with `podResources`,
   * the pod-resources API on `<dir>/../pod-resources/kubelet.sock`. `endpoints`: the
   * plugins' socket names kubelet may connect to (its processes may reach no other socket;
   * default: enim's, `enim.sock`).
   */
  static async start(
    dir: string,
    opts: { podResources?: boolean; endpoints?: string[] } = {},
  ): Promise<FakeKubelet> {
    const k = new FakeKubelet(dir, opts.endpoints ?? ["enim.sock"]);
    try {
      await Promise.all([
        k.#serveRegistration(false),
        opts.podResources ? k.#servePodResources() : null,
      ]);
    } catch (err) {
      await k[Symbol.asyncDispose]();
      throw err;
    }
    return k;
  }

  #spawn(role: Role, allow: string[]): KubeletProcess {
    const proc: KubeletProcess = new KubeletProcess(
      role,
      [...allow, "--allow-env"],
      (m) => this.#event(m),
      (unasked) => {
        if (unasked && role !== "clients") {
          this.#failure ??= new Error(`${this.#named(role)} ended unasked`);
        }
        // A client's process ends its streams with it.
        for (const [id, w] of this.#watches) {
          if (!w.on(proc)) continue;
          w.finished(proc.gone ?? new Error(`${this.#named(role)} ended`));
          this.#watches.delete(id);
        }
        this.#wakeups.wake();
      },
    );
    return proc;
  }

  #named(role: Role): string {
    return `The tests' kubelet (${role}) in "${this.dir}"`;
  }

  async #serveRegistration(clean: boolean): Promise<string[]> {
    const p = this.#registration = this.#spawn("registration", [
      `--allow-read=${this.dir},${HERE}`,
      `--allow-write=${this.dir}`,
      `--allow-net=unix:${this.socket}`,
    ]);
    return z.array(z.string()).parse(await p.request({ op: "register", dir: this.dir, clean }));
  }

  async #servePodResources(): Promise<void> {
    const socket = this.podResourcesSocket;
    const folder = socket.slice(0, socket.lastIndexOf("/"));
    const p = this.#podResources = this.#spawn("pod-resources", [
      `--allow-read=${folder},${HERE}`,
      `--allow-write=${folder}`,
      `--allow-net=unix:${socket}`,
    ]);
    await p.request({ op: "podResources", socket });
  }

  #pods(): KubeletProcess {
    if (!this.#podResources) throw new Error(`${this.#named("pod-resources")} was not started`);
    return this.#podResources;
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
    await this.#pods().request({
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
    await this.#pods().request({ op: "forget", namespace, name });
  }

  /** How many pod-resources calls kubelet has answered. */
  async podResourcesCalls(): Promise<number> {
    return z.number().int().parse(await this.#pods().request({ op: "podResourcesCalls" }));
  }

  /** Waits until `count` Registers have been accepted; throws after `timeoutMs`. */
  async waitForRegistrations(count: number, timeoutMs = 10_000): Promise<RegisterRequest> {
    await this.#wakeups.until(
      () => this.registrations.length >= count || this.#failure !== null,
      timeoutMs,
      () =>
        new Error(
          `No Register number ${count} within ${timeoutMs} ms (${this.registrations.length} so far${
            this.refused.length ? `; refused: ${this.refused.map((r) => r.message).join("; ")}` : ""
          })`,
        ),
    );
    if (this.registrations.length < count) throw this.#failure;
    return this.registrations[count - 1];
  }

  /**
   * Connects to a plugin's endpoint (a socket name in the folder), as kubelet does after
   * Register: a process of its own, which {@linkcode PluginClient.close} ends.
   */
  plugin(endpoint: string): PluginClient {
    const sockets = this.#endpoints.map((e) => `${this.dir}/${e}`);
    const proc = this.#spawn("clients", [
      `--allow-read=${[HERE, ...sockets].join(",")}`,
      `--allow-write=${sockets.join(",")}`,
      `--allow-net=${sockets.map((s) => `unix:${s}`).join(",")}`,
    ]);
    this.#clients.add(proc);
    const client = this.#nextHandle++;
    proc.post({ op: "open", client, socket: `${this.dir}/${endpoint}` });
    return new PluginClient(proc, client, () => {
      const w = new ListWatch(this, proc, this.#nextHandle++);
      this.#watches.set(w.id, w);
      proc.post({ op: "watch", client, watch: w.id });
      return w;
    }, async () => {
      this.#clients.delete(proc);
      await proc.stop();
    });
  }

  /** Waits for what {@linkcode ListWatch} waits for. */
  until(done: () => boolean, timeoutMs: number, timeout: () => Error): Promise<void> {
    return this.#wakeups.until(done, timeoutMs, timeout);
  }

  /** Stops serving Registration and removes kubelet's socket (kubelet going down). */
  async stop(): Promise<void> {
    const p = this.#registration;
    this.#registration = null;
    await p?.stop();
    await Deno.remove(this.socket).catch(() => {});
  }

  /**
   * A kubelet restart: this one's Registration stops, the new one deletes every file in the
   * folder (every plugin's socket) and serves a new kubelet.sock. Resolves once it serves,
   * with the entries its deletion left in the folder (none), as read right after it. kubelet's
   * clients of the plugins stay connected.
   */
  async restart(): Promise<string[]> {
    // Its socket goes with it (a plugin that saw it there would register on a dead socket).
    await this.stop();
    return await this.#serveRegistration(true);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    const procs = [this.#registration, this.#podResources, ...this.#clients];
    this.#registration = this.#podResources = null;
    this.#clients.clear();
    await Promise.all(procs.map((p) => p?.stop()));
    await Deno.remove(this.socket).catch(() => {});
    if (procs[1]) await Deno.remove(this.podResourcesSocket).catch(() => {});
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
  readonly #proc: KubeletProcess;

  constructor(kubelet: FakeKubelet, proc: KubeletProcess, id: number) {
    this.#kubelet = kubelet;
    this.#proc = proc;
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

  /** Whether the stream is on `proc`. */
  on(proc: KubeletProcess): boolean {
    return this.#proc === proc;
  }

  /** The last list kubelet's client had received by now (throws when none). */
  async latest(): Promise<Device[]> {
    await this.#proc.request({ op: "sync" });
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
    this.#proc.post({ op: "cancel", watch: this.id });
  }
}

/** kubelet's client of one plugin's DevicePlugin service (in kubelet's process). */
export class PluginClient {
  readonly #proc: KubeletProcess;
  readonly #client: number;
  readonly #watch: () => ListWatch;
  readonly #close: () => Promise<void>;

  constructor(
    proc: KubeletProcess,
    client: number,
    watch: () => ListWatch,
    close: () => Promise<void>,
  ) {
    this.#proc = proc;
    this.#client = client;
    this.#watch = watch;
    this.#close = close;
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

  /** Ends the client's process: its connection is cut, as a killed kubelet's (no GOAWAY). */
  close(): Promise<void> {
    return this.#close();
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
