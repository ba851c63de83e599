/**
 * kubelet's side of the device-plugin API, as its own process (issue 41 item 4): the
 * production peer of enim's device plugin, kubelet, is always another process, and Deno's
 * `node:http2` under `@grpc/grpc-js` can abort a process that holds both a gRPC server and
 * its clients (nghttp2's `stream->closed_next == NULL` assertion, denoland/deno#36788).
 *
 * It serves `Registration` on `kubelet.sock` in the folder it is given and, when asked, the
 * pod-resources API (`List`, `Get`) on `pod-resources/kubelet.sock` beside it; it connects
 * back to a plugin's socket to call `GetDevicePluginOptions`, `ListAndWatch`, `Allocate`,
 * `PreStartContainer` and `GetPreferredAllocation`, as kubelet's device manager does
 * (pkg/kubelet/cm/devicemanager). A Register is refused as kubelet refuses it: a version
 * or resource name kubelet does not take, or an endpoint it cannot dial (no socket there).
 * A restart does what a starting kubelet does to the folder: it deletes every file in it,
 * then serves a new `kubelet.sock`.
 *
 * Driven by the test (`fake_kubelet.ts`) with JSON lines on stdin; it answers, and reports
 * what kubelet sees (Registers, lists, stream ends), with JSON lines on stdout, in order
 * (`api.ts`). It exits when stdin ends. Built only from the published API:
 * `deviceplugin_v1beta1.proto` and `podresources_v1.proto` beside this file, loaded with
 * `@grpc/proto-loader` on `@grpc/grpc-js`; it imports none of enim's code. Every message
 * received is parsed with zod.
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { z } from "zod";
import { callUnary } from "../grpc_unary.ts";
import {
  type AdmittedPod,
  type Command,
  CommandSchema,
  KUBELET_SOCKET,
  ListSchema,
  type Message,
  PLUGIN_METHODS,
  POD_RESOURCES_SOCKET,
  type RegisterRequest,
  RegisterRequestSchema,
} from "./api.ts";

const PROTO = new URL("./deviceplugin_v1beta1.proto", import.meta.url).pathname;
const POD_RESOURCES_PROTO = new URL("./podresources_v1.proto", import.meta.url).pathname;
/** The only version this kubelet accepts (constants.go `SupportedVersions`). */
const SUPPORTED_VERSIONS = ["v1beta1"];

const encoder = new TextEncoder();
const stdout = Deno.stdout.writable.getWriter();
let writing = Promise.resolve();

/** Writes one line to the test, after every line before it. */
function send(m: Message): Promise<void> {
  writing = writing.then(() => stdout.write(encoder.encode(`${JSON.stringify(m)}\n`)));
  return writing;
}

const Ctor = z.custom<grpc.ServiceClientConstructor>((v) => typeof v === "function");

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
    const pkg = z.record(z.string(), z.unknown()).parse(grpc.loadPackageDefinition(def).v1beta1);
    api = { registration: Ctor.parse(pkg.Registration), plugin: Ctor.parse(pkg.DevicePlugin) };
  }
  return api;
}

function loadPodResources(): grpc.ServiceDefinition {
  const def = protoLoader.loadSync(POD_RESOURCES_PROTO, {
    keepCase: true,
    longs: Number,
    enums: String,
    defaults: true,
  });
  const pkg = z.record(z.string(), z.unknown()).parse(grpc.loadPackageDefinition(def).v1);
  return Ctor.parse(pkg.PodResourcesLister).service;
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

function bind(server: grpc.Server, path: string): Promise<void> {
  return new Promise<void>((resolve, reject) =>
    server.bindAsync(
      `unix:${path}`,
      grpc.ServerCredentials.createInsecure(),
      (err) => err ? reject(err) : resolve(),
    )
  );
}

async function shutdown(server: grpc.Server): Promise<void> {
  await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
  server.forceShutdown();
}

/** kubelet: its servers, the pods it has admitted, its clients of plugins. */
class Kubelet {
  readonly dir: string;
  #server: grpc.Server | null = null;
  #podResources: grpc.Server | null = null;
  readonly #pods = new Map<string, AdmittedPod>();
  podResourcesCalls = 0;
  readonly #clients = new Map<number, grpc.Client>();
  readonly #watches = new Map<number, grpc.ClientReadableStream<unknown>>();

  constructor(dir: string) {
    this.dir = dir;
  }

  get socket(): string {
    return `${this.dir}/${KUBELET_SOCKET}`;
  }

  get podResourcesSocket(): string {
    return `${this.dir.replace(/\/[^/]*\/?$/, "")}/${POD_RESOURCES_SOCKET}`;
  }

  admit(pod: AdmittedPod): void {
    this.#pods.set(`${pod.namespace}/${pod.name}`, pod);
  }

  forget(namespace: string, name: string): void {
    this.#pods.delete(`${namespace}/${name}`);
  }

  async serve(): Promise<void> {
    const server = new grpc.Server();
    server.addService(load().registration.service, {
      Register: (call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        const parsed = RegisterRequestSchema.safeParse(call.request);
        if (!parsed.success) {
          cb({ code: grpc.status.INVALID_ARGUMENT, details: z.prettifyError(parsed.error) });
          return;
        }
        const why = refuse(parsed.data) ?? this.#undialable(parsed.data.endpoint);
        // Reported before the answer: the test knows of a Register once the plugin does.
        if (why) {
          send({ kind: "refused", request: parsed.data, message: why }).then(
            () => cb({ code: grpc.status.UNKNOWN, details: why }),
          );
          return;
        }
        send({ kind: "registered", request: parsed.data }).then(() => cb(null, {}));
      },
    });
    await bind(server, this.socket);
    this.#server = server;
  }

  /**
   * Why kubelet cannot reach a plugin's endpoint, or null: kubelet dials the endpoint while
   * it handles the Register and answers with an error when that fails.
   */
  #undialable(endpoint: string): string | null {
    try {
      if (Deno.lstatSync(`${this.dir}/${endpoint}`).isSocket) return null;
      return `failed to dial device plugin: "${endpoint}" is not a socket`;
    } catch {
      return `failed to dial device plugin: "${this.dir}/${endpoint}" does not exist`;
    }
  }

  async servePodResources(): Promise<void> {
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
        const req = z.object({ pod_name: z.string(), pod_namespace: z.string() }).safeParse(
          call.request,
        );
        if (!req.success) {
          cb({ code: grpc.status.INVALID_ARGUMENT, details: z.prettifyError(req.error) });
          return;
        }
        const p = this.#pods.get(`${req.data.pod_namespace}/${req.data.pod_name}`);
        if (!p) cb({ code: grpc.status.NOT_FOUND, details: "pod not found" });
        else cb(null, { pod_resources: wire(p) });
      },
    });
    await bind(server, path);
    this.#podResources = server;
  }

  /** Stops serving Registration and removes kubelet's socket (kubelet going down). */
  async stop(): Promise<void> {
    const s = this.#server;
    this.#server = null;
    if (s) await shutdown(s);
    await Deno.remove(this.socket).catch(() => {});
  }

  /** A kubelet restart: every file in the folder deleted, a new kubelet.sock served. */
  async restart(): Promise<string[]> {
    await this.stop();
    for (const e of Deno.readDirSync(this.dir)) {
      await Deno.remove(`${this.dir}/${e.name}`, { recursive: true });
    }
    await this.serve();
    return [...Deno.readDirSync(this.dir)].map((e) => e.name).sort();
  }

  open(client: number, endpoint: string): void {
    this.#clients.set(
      client,
      new (load().plugin)(`unix:${this.dir}/${endpoint}`, grpc.credentials.createInsecure()),
    );
  }

  #client(client: number): grpc.Client {
    const c = this.#clients.get(client);
    if (!c) throw new Error(`No client ${client}`);
    return c;
  }

  call(c: Extract<Command, { op: "call" }>): Promise<unknown> {
    return callUnary(this.#client(c.client), c.method, c.request, PLUGIN_METHODS[c.method], {
      timeoutMs: c.timeoutMs,
      failed: (err) => new RpcFailure(err.code, err.details || err.message),
      answer: `${c.method} answer`,
    });
  }

  watch(client: number, watch: number): void {
    const c = this.#client(client);
    const fn = z.custom<(req: unknown) => grpc.ClientReadableStream<unknown>>(
      (v) => typeof v === "function",
    ).parse(Reflect.get(c, "ListAndWatch"));
    const call = fn.call(c, {});
    this.#watches.set(watch, call);
    let ended = false;
    const end = (error: string | null) => {
      if (ended) return;
      ended = true;
      this.#watches.delete(watch);
      send({ kind: "ended", watch, error });
    };
    call.on("data", (m: unknown) => {
      const parsed = ListSchema.safeParse(m);
      if (parsed.success) send({ kind: "list", watch, devices: parsed.data.devices });
      else {
        end(`Unexpected ListAndWatch answer: ${z.prettifyError(parsed.error)}`);
        call.cancel();
      }
    });
    call.on("error", (err: Error) => end(String(err)));
    call.on("end", () => end(null));
  }

  cancel(watch: number): void {
    this.#watches.get(watch)?.cancel();
  }

  closeClient(client: number): void {
    this.#clients.get(client)?.close();
    this.#clients.delete(client);
  }

  async close(): Promise<void> {
    for (const w of this.#watches.values()) w.cancel();
    for (const c of this.#clients.values()) c.close();
    this.#clients.clear();
    await this.stop();
    const pr = this.#podResources;
    this.#podResources = null;
    if (pr) {
      await shutdown(pr);
      await Deno.remove(this.podResourcesSocket).catch(() => {});
    }
  }
}

/** A failed gRPC call of kubelet's client. */
class RpcFailure extends Error {
  readonly code: number;
  readonly details: string;
  constructor(code: number, details: string) {
    super(`gRPC code ${code}: ${details}`);
    this.code = code;
    this.details = details;
  }
}

/** The kubelet, once started. */
const state: { kubelet: Kubelet | null } = { kubelet: null };

function running(): Kubelet {
  if (!state.kubelet) throw new Error("The kubelet was not started");
  return state.kubelet;
}

async function handle(c: Command): Promise<unknown> {
  switch (c.op) {
    case "start": {
      const k = state.kubelet = new Kubelet(c.dir);
      await k.serve();
      if (c.podResources) await k.servePodResources();
      return null;
    }
    case "admit":
      return running().admit(c.pod);
    case "forget":
      return running().forget(c.namespace, c.name);
    case "podResourcesCalls":
      return running().podResourcesCalls;
    case "stop":
      return await running().stop();
    case "restart":
      return await running().restart();
    case "open":
      return running().open(c.client, c.endpoint);
    case "call":
      return await running().call(c);
    case "watch":
      return running().watch(c.client, c.watch);
    case "cancel":
      return running().cancel(c.watch);
    case "closeClient":
      return running().closeClient(c.client);
    case "sync":
      return null;
    case "close":
      return await state.kubelet?.close() ?? null;
  }
}

/** Runs one command and answers it (each command on its own: a slow call holds up no other). */
async function run(line: string): Promise<void> {
  const parsed = CommandSchema.safeParse(JSON.parse(line));
  if (!parsed.success) throw new Error(`Bad command ${line}: ${z.prettifyError(parsed.error)}`);
  const c = parsed.data;
  try {
    await send({ kind: "answer", id: c.id, result: (await handle(c)) ?? null });
  } catch (err) {
    await send({
      kind: "failed",
      id: c.id,
      message: err instanceof Error ? err.message : String(err),
      ...(err instanceof RpcFailure ? { rpc: { code: err.code, details: err.details } } : {}),
    });
  }
}

const inFlight = new Set<Promise<void>>();
let buffered = "";
for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
  buffered += chunk;
  for (let nl = buffered.indexOf("\n"); nl !== -1; nl = buffered.indexOf("\n")) {
    const line = buffered.slice(0, nl);
    buffered = buffered.slice(nl + 1);
    if (line.trim() === "") continue;
    const p = run(line).finally(() => inFlight.delete(p));
    inFlight.add(p);
  }
}
// The test is gone (stdin ended): nothing is left to answer.
await Promise.all(inFlight);
await state.kubelet?.close();
await writing;
await stdout.close();
