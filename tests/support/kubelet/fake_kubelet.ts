/**
 * kubelet's side of the device-plugin API (v1beta1), for tests: it serves
 * `Registration` on `kubelet.sock` in a folder of the test's choosing, records
 * each plugin's Register, and connects back to a plugin's socket to call
 * `GetDevicePluginOptions`, `ListAndWatch`, `Allocate`, `PreStartContainer` and
 * `GetPreferredAllocation`, as kubelet's device manager does
 * (pkg/kubelet/cm/devicemanager). {@linkcode FakeKubelet.restart} does what a
 * starting kubelet does to the folder: it deletes every file in it, then serves a
 * new `kubelet.sock`.
 *
 * With `podResources`, it also serves kubelet's pod-resources API (`List` and `Get`)
 * on `pod-resources/kubelet.sock` beside the folder, from the pods the test says
 * kubelet has admitted with their devices ({@linkcode FakeKubelet.admit},
 * {@linkcode FakeKubelet.forget}): kubelet lists a pod from its admission, when its
 * devices are allocated, until it is gone.
 *
 * Built only from the published API: `deviceplugin_v1beta1.proto` and
 * `podresources_v1.proto` beside this file, loaded with `@grpc/proto-loader`, on
 * `@grpc/grpc-js` (test-only imports); it imports none of enim's code. Every
 * message received is parsed with zod.
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { z } from "zod";
import { callUnary } from "../grpc_unary.ts";

const PROTO = new URL("./deviceplugin_v1beta1.proto", import.meta.url).pathname;
const POD_RESOURCES_PROTO = new URL("./podresources_v1.proto", import.meta.url).pathname;
/** kubelet's pod-resources socket, in `pod-resources/` of its root directory. */
export const POD_RESOURCES_SOCKET = "pod-resources/kubelet.sock";
/** kubelet's socket name in its folder (constants.go `KubeletSocket`). */
export const KUBELET_SOCKET = "kubelet.sock";
/** The only version this kubelet accepts (constants.go `SupportedVersions`). */
const SUPPORTED_VERSIONS = ["v1beta1"];

/** A RegisterRequest as kubelet reads it. */
export const RegisterRequestSchema = z.object({
  version: z.string(),
  endpoint: z.string(),
  resource_name: z.string(),
  options: z.object({
    pre_start_required: z.boolean(),
    get_preferred_allocation_available: z.boolean(),
  }).nullable(),
});
/** A RegisterRequest. */
export type RegisterRequest = z.infer<typeof RegisterRequestSchema>;

/** DevicePluginOptions. */
export const OptionsSchema = z.object({
  pre_start_required: z.boolean(),
  get_preferred_allocation_available: z.boolean(),
});

/** One device of a ListAndWatch list. */
export const DeviceSchema = z.object({
  ID: z.string().min(1).max(63),
  health: z.enum(["Healthy", "Unhealthy"]),
  topology: z.object({ nodes: z.array(z.object({ ID: z.number() })) }).nullable(),
});
/** One device. */
export type Device = z.infer<typeof DeviceSchema>;

const ListSchema = z.object({ devices: z.array(DeviceSchema) });

/** AllocateResponse. */
export const AllocateResponseSchema = z.object({
  container_responses: z.array(z.object({
    envs: z.record(z.string(), z.string()),
    mounts: z.array(z.unknown()),
    devices: z.array(z.unknown()),
    annotations: z.record(z.string(), z.string()),
    cdi_devices: z.array(z.unknown()),
  })),
});

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

type Callback = (err: grpc.ServiceError | null, res: unknown) => void;
type UnaryMethod = (
  req: unknown,
  meta: grpc.Metadata,
  opts: grpc.CallOptions,
  cb: Callback,
) => void;

/** A pod kubelet has admitted: its containers and the devices each was given, by resource. */
export interface AdmittedPod {
  namespace: string;
  name: string;
  containers: { name: string; devices: { resource_name: string; device_ids: string[] }[] }[];
}

let podResourcesService: grpc.ServiceDefinition | null = null;
function loadPodResources(): grpc.ServiceDefinition {
  if (!podResourcesService) {
    const def = protoLoader.loadSync(POD_RESOURCES_PROTO, {
      keepCase: true,
      longs: Number,
      enums: String,
      defaults: true,
    });
    const pkg = grpc.loadPackageDefinition(def).v1 as grpc.GrpcObject;
    const Ctor = z.custom<grpc.ServiceClientConstructor>((v) => typeof v === "function");
    podResourcesService = Ctor.parse(pkg.PodResourcesLister).service;
  }
  return podResourcesService;
}

let api: { registration: grpc.ServiceClientConstructor; plugin: grpc.ServiceClientConstructor };
function load() {
  if (!api) {
    const def = protoLoader.loadSync(PROTO, {
      keepCase: true,
      longs: Number,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    const pkg = grpc.loadPackageDefinition(def).v1beta1 as grpc.GrpcObject;
    const Ctor = z.custom<grpc.ServiceClientConstructor>((v) => typeof v === "function");
    api = { registration: Ctor.parse(pkg.Registration), plugin: Ctor.parse(pkg.DevicePlugin) };
  }
  return api;
}

/** What kubelet checks in a Register (devicemanager's `validateRegisterRequest`, simplified). */
function refuse(r: RegisterRequest): string | null {
  if (!SUPPORTED_VERSIONS.includes(r.version)) {
    return `Requested device plugin version "${r.version}" is not supported`;
  }
  if (
    !/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/.test(
      r.resource_name,
    )
  ) {
    return `invalid name of device plugin socket: "${r.resource_name}" is not an extended resource name`;
  }
  if (r.endpoint.includes("/") || r.endpoint === "") {
    return `invalid endpoint "${r.endpoint}"`;
  }
  return null;
}

/** A kubelet stand-in serving Registration in `dir` (see the module doc). */
export class FakeKubelet implements AsyncDisposable {
  readonly dir: string;
  /** Every accepted Register, in order. */
  readonly registrations: RegisterRequest[] = [];
  /** Every refused Register, with kubelet's message. */
  readonly refused: { request: RegisterRequest; message: string }[] = [];
  #server: grpc.Server | null = null;
  #podResources: grpc.Server | null = null;
  /** The pods admitted, by `namespace/name` (what the pod-resources API lists). */
  readonly #pods = new Map<string, AdmittedPod>();
  /** How many pod-resources calls were answered. */
  podResourcesCalls = 0;
  #waiters: (() => void)[] = [];

  private constructor(dir: string) {
    this.dir = dir;
  }

  /**
   * Starts serving Registration on `<dir>/kubelet.sock` and, with `podResources`, the
   * pod-resources API on `<dir>/../pod-resources/kubelet.sock`.
   */
  static async start(dir: string, opts: { podResources?: boolean } = {}): Promise<FakeKubelet> {
    const k = new FakeKubelet(dir);
    await k.#serve();
    if (opts.podResources) await k.#servePodResources();
    return k;
  }

  /** The path of kubelet's pod-resources socket (beside the device-plugin folder). */
  get podResourcesSocket(): string {
    return `${this.dir.replace(/\/[^/]*\/?$/, "")}/${POD_RESOURCES_SOCKET}`;
  }

  /**
   * kubelet admits a pod: its first container gets `deviceIds` of `resource` (none: a
   * pod without the request, which kubelet lists with no device).
   */
  admit(
    namespace: string,
    name: string,
    deviceIds: string[],
    resource = "enim.dev/eni",
  ): void {
    this.#pods.set(`${namespace}/${name}`, {
      namespace,
      name,
      containers: [{
        name: "app",
        devices: deviceIds.length ? [{ resource_name: resource, device_ids: deviceIds }] : [],
      }],
    });
  }

  /** kubelet is done with a pod (deleted, its containers gone): its devices are free. */
  forget(namespace: string, name: string): void {
    this.#pods.delete(`${namespace}/${name}`);
  }

  async #servePodResources(): Promise<void> {
    const path = this.podResourcesSocket;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    await Deno.remove(path).catch(() => {});
    const server = new grpc.Server();
    // As kubelet answers: every container with its CPUs too (enim must skip what it
    // does not read), the devices as admitted.
    const wire = (p: AdmittedPod) => ({
      name: p.name,
      namespace: p.namespace,
      containers: p.containers.map((c) => ({ ...c, cpu_ids: [0, 1], memory: [] })),
    });
    server.addService(loadPodResources(), {
      List: (_call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        this.podResourcesCalls++;
        cb(null, { pod_resources: [...this.#pods.values()].map(wire) });
      },
      GetAllocatableResources: (
        _call: grpc.ServerUnaryCall<unknown, unknown>,
        cb: grpc.sendUnaryData<unknown>,
      ) => cb(null, { devices: [], cpu_ids: [], memory: [] }),
      Get: (call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        const req = z.object({ pod_name: z.string(), pod_namespace: z.string() }).parse(
          call.request,
        );
        const p = this.#pods.get(`${req.pod_namespace}/${req.pod_name}`);
        if (!p) cb({ code: grpc.status.NOT_FOUND, details: "pod not found" });
        else cb(null, { pod_resources: wire(p) });
      },
    });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(
        `unix:${path}`,
        grpc.ServerCredentials.createInsecure(),
        (err) => err ? reject(err) : resolve(),
      )
    );
    this.#podResources = server;
  }

  /** The path of kubelet's socket. */
  get socket(): string {
    return `${this.dir}/${KUBELET_SOCKET}`;
  }

  async #serve(): Promise<void> {
    const server = new grpc.Server();
    server.addService(load().registration.service, {
      Register: (call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        const parsed = RegisterRequestSchema.safeParse(call.request);
        if (!parsed.success) {
          cb({ code: grpc.status.INVALID_ARGUMENT, details: z.prettifyError(parsed.error) });
          return;
        }
        const why = refuse(parsed.data);
        if (why) {
          this.refused.push({ request: parsed.data, message: why });
          cb({ code: grpc.status.UNKNOWN, details: why });
          return;
        }
        this.registrations.push(parsed.data);
        for (const w of this.#waiters.splice(0)) w();
        cb(null, {});
      },
    });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(
        `unix:${this.socket}`,
        grpc.ServerCredentials.createInsecure(),
        (err) => err ? reject(err) : resolve(),
      )
    );
    this.#server = server;
  }

  /** Waits until `count` Registers have been accepted; throws after `timeoutMs`. */
  async waitForRegistrations(count: number, timeoutMs = 10_000): Promise<RegisterRequest> {
    const until = Date.now() + timeoutMs;
    while (this.registrations.length < count) {
      const left = until - Date.now();
      if (left <= 0) {
        throw new Error(
          `No Register number ${count} within ${timeoutMs} ms (${this.registrations.length} so far${
            this.refused.length ? `; refused: ${this.refused.map((r) => r.message).join("; ")}` : ""
          })`,
        );
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      await new Promise<void>((resolve) => {
        this.#waiters.push(resolve);
        timer = setTimeout(resolve, left);
      });
      clearTimeout(timer);
    }
    return this.registrations[count - 1];
  }

  /** Connects to a plugin's endpoint (a socket name in the folder), as kubelet does after Register. */
  plugin(endpoint: string): PluginClient {
    return new PluginClient(`${this.dir}/${endpoint}`);
  }

  /** Stops serving and removes kubelet's socket (kubelet going down). */
  async stop(): Promise<void> {
    const s = this.#server;
    this.#server = null;
    if (s) await new Promise<void>((resolve) => s.tryShutdown(() => resolve()));
    s?.forceShutdown();
    await Deno.remove(this.socket).catch(() => {});
  }

  /**
   * A kubelet restart: this one stops, the new one deletes every file in the folder
   * (every plugin's socket) and serves a new kubelet.sock.
   */
  async restart(): Promise<void> {
    await this.stop();
    for (const e of Deno.readDirSync(this.dir)) {
      await Deno.remove(`${this.dir}/${e.name}`, { recursive: true });
    }
    await this.#serve();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    for (const w of this.#waiters.splice(0)) w();
    await this.stop();
    const pr = this.#podResources;
    this.#podResources = null;
    if (pr) {
      await new Promise<void>((resolve) => pr.tryShutdown(() => resolve()));
      pr.forceShutdown();
      await Deno.remove(this.podResourcesSocket).catch(() => {});
    }
  }
}

/** A stream of device lists from ListAndWatch. */
export class ListWatch {
  /** Every list received, in order. */
  readonly lists: Device[][] = [];
  /** Set when the stream ended (the plugin closed it, or it failed). */
  ended: Error | "ended" | null = null;
  readonly #call: grpc.ClientReadableStream<unknown>;
  #waiters: (() => void)[] = [];

  constructor(call: grpc.ClientReadableStream<unknown>) {
    this.#call = call;
    const wake = () => {
      for (const w of this.#waiters.splice(0)) w();
    };
    call.on("data", (m: unknown) => {
      this.lists.push(ListSchema.parse(m).devices);
      wake();
    });
    call.on("error", (err: Error) => {
      this.ended = err;
      wake();
    });
    call.on("end", () => {
      this.ended ??= "ended";
      wake();
    });
  }

  /** The last list received (throws when none). */
  get last(): Device[] {
    const l = this.lists.at(-1);
    if (!l) throw new Error("No list received yet");
    return l;
  }

  /** Waits until list number `n` (1-based) has arrived; throws after `timeoutMs` or when the stream ended. */
  async list(n: number, timeoutMs = 10_000): Promise<Device[]> {
    const until = Date.now() + timeoutMs;
    while (this.lists.length < n) {
      if (this.ended) throw new Error(`ListAndWatch ended before list ${n}: ${this.ended}`);
      const left = until - Date.now();
      if (left <= 0) {
        throw new Error(`No list number ${n} within ${timeoutMs} ms (${this.lists.length} so far)`);
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      await new Promise<void>((resolve) => {
        this.#waiters.push(resolve);
        timer = setTimeout(resolve, left);
      });
      clearTimeout(timer);
    }
    return this.lists[n - 1];
  }

  /** Waits until the stream ends; throws after `timeoutMs`. */
  async end(timeoutMs = 10_000): Promise<Error | "ended"> {
    const until = Date.now() + timeoutMs;
    while (!this.ended) {
      const left = until - Date.now();
      if (left <= 0) throw new Error(`ListAndWatch did not end within ${timeoutMs} ms`);
      let timer: ReturnType<typeof setTimeout> | undefined;
      await new Promise<void>((resolve) => {
        this.#waiters.push(resolve);
        timer = setTimeout(resolve, left);
      });
      clearTimeout(timer);
    }
    return this.ended;
  }

  /** Cancels the stream from kubelet's side. */
  cancel(): void {
    this.#call.cancel();
  }
}

/** kubelet's client of one plugin's DevicePlugin service. */
export class PluginClient {
  readonly #client: grpc.Client;

  constructor(socket: string) {
    this.#client = new (load().plugin)(`unix:${socket}`, grpc.credentials.createInsecure());
  }

  #call<T>(method: string, req: unknown, schema: z.ZodType<T>, timeoutMs = 10_000): Promise<T> {
    return callUnary(this.#client, method, req, schema, {
      timeoutMs,
      failed: (err) => new RpcError(method, err.code, err.details || err.message, { cause: err }),
      answer: `${method} answer`,
    });
  }

  /** GetDevicePluginOptions. */
  options(): Promise<z.infer<typeof OptionsSchema>> {
    return this.#call("GetDevicePluginOptions", {}, OptionsSchema);
  }

  /** ListAndWatch: a stream of lists. */
  watch(): ListWatch {
    const fn = (this.#client as unknown as Record<string, (req: unknown) => unknown>).ListAndWatch;
    return new ListWatch(fn.call(this.#client, {}) as grpc.ClientReadableStream<unknown>);
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
  preStart(ids: string[]): Promise<Record<string, never>> {
    return this.#call("PreStartContainer", { devices_ids: ids }, z.object({}).strict()) as Promise<
      Record<string, never>
    >;
  }

  /** GetPreferredAllocation for one container. */
  preferred(available: string[], size: number): Promise<unknown> {
    return this.#call("GetPreferredAllocation", {
      container_requests: [{
        available_deviceIDs: available,
        must_include_deviceIDs: [],
        allocation_size: size,
      }],
    }, z.unknown());
  }

  close(): void {
    this.#client.close();
  }
}

/**
 * A kubelet socket that accepts connections and never answers (a kubelet that
 * hangs): returns the listener, to close at the end.
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
