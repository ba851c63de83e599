/**
 * kubelet's side of the device-plugin API, as processes of their own (issue 41 item 4): the
 * production peer of enim's device plugin, kubelet, is always another process, and Deno's
 * `node:http2` under `@grpc/grpc-js` now and then aborts a process inside nghttp2
 * (`stream->closed_next == NULL`, denoland/deno#36788) when both ends of a connection shut
 * it down at once. A test process that held kubelet's servers and clients beside the
 * plugin's was aborted so, and with it the whole `deno test` run; a kubelet process that
 * shut its servers down gracefully (GOAWAY) while the plugin closed its clients of them
 * was too. So kubelet's processes never shut a connection down: each stops at once when
 * its stdin ends, as a killed kubelet does; only enim's side ever ends a connection
 * gracefully.
 *
 * One process per role (`api.ts` `RoleSchema`, the first argument):
 *
 * - `registration` serves `Registration` on `kubelet.sock` in the folder it is given and
 *   refuses a Register as kubelet does: a version or resource name kubelet does not take,
 *   or an endpoint it cannot dial (no socket there). Started with `clean` it first does
 *   what a starting kubelet does to the folder: it deletes every file in it.
 * - `pod-resources` serves kubelet's pod-resources API (`List`, `Get`) from the pods the
 *   test says kubelet has admitted.
 * - `clients` connects to a plugin's socket to call `GetDevicePluginOptions`,
 *   `ListAndWatch`, `Allocate`, `PreStartContainer` and `GetPreferredAllocation`, as
 *   kubelet's device manager does (pkg/kubelet/cm/devicemanager). The tests start one
 *   per client, and closing the client ends it.
 *
 * Driven by the test (`fake_kubelet.ts`) with JSON lines on stdin; each answers, and
 * reports what kubelet sees (Registers, lists, stream ends), with JSON lines on stdout, in
 * order (`api.ts`). Built only from the published API: `deviceplugin_v1beta1.proto` and
 * `podresources_v1.proto` beside this file, loaded with `@grpc/proto-loader` on
 * `@grpc/grpc-js`; it imports none of enim's code. Every message received is parsed with
 * zod.
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
  type RegisterRequest,
  RegisterRequestSchema,
  type Role,
  RoleSchema,
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

/**
 * Registration, on `kubelet.sock` in `dir`, after deleting every file in `dir` when `clean`
 * (a starting kubelet; all made ready first, so the folder is empty as briefly as it can
 * be). Resolves with the folder's entries as the deletion left them (read before anything
 * else can run: a plugin serves its socket again as soon as it sees it gone).
 */
async function serveRegistration(dir: string, clean: boolean): Promise<string[]> {
  const server = new grpc.Server();
  server.addService(load().registration.service, {
    Register: (call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      const parsed = RegisterRequestSchema.safeParse(call.request);
      if (!parsed.success) {
        cb({ code: grpc.status.INVALID_ARGUMENT, details: z.prettifyError(parsed.error) });
        return;
      }
      const why = refuse(parsed.data) ?? undialable(dir, parsed.data.endpoint);
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
  if (clean) {
    for (const e of Deno.readDirSync(dir)) Deno.removeSync(`${dir}/${e.name}`, { recursive: true });
  }
  const left = [...Deno.readDirSync(dir)].map((e) => e.name).sort();
  await bind(server, `${dir}/${KUBELET_SOCKET}`);
  return left;
}

/**
 * Why kubelet cannot reach a plugin's endpoint, or null: kubelet dials the endpoint while
 * it handles the Register and answers with an error when that fails.
 */
function undialable(dir: string, endpoint: string): string | null {
  try {
    if (Deno.lstatSync(`${dir}/${endpoint}`).isSocket) return null;
    return `failed to dial device plugin: "${endpoint}" is not a socket`;
  } catch {
    return `failed to dial device plugin: "${dir}/${endpoint}" does not exist`;
  }
}

/** The pods kubelet has admitted, and how many pod-resources calls it answered. */
const pods = new Map<string, AdmittedPod>();
let podResourcesCalls = 0;

/** The pod-resources API (`List`, `Get`) on `socket`. */
async function servePodResources(socket: string): Promise<void> {
  await Deno.mkdir(socket.slice(0, socket.lastIndexOf("/")), { recursive: true });
  await Deno.remove(socket).catch(() => {});
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
      podResourcesCalls++;
      cb(null, { pod_resources: [...pods.values()].map(wire) });
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
      const p = pods.get(`${req.data.pod_namespace}/${req.data.pod_name}`);
      if (!p) cb({ code: grpc.status.NOT_FOUND, details: "pod not found" });
      else cb(null, { pod_resources: wire(p) });
    },
  });
  await bind(server, socket);
}

/** kubelet's clients of plugins, and their ListAndWatch streams. */
const clients = new Map<number, grpc.Client>();
const watches = new Map<number, grpc.ClientReadableStream<unknown>>();

function client(id: number): grpc.Client {
  const c = clients.get(id);
  if (!c) throw new Error(`No client ${id}`);
  return c;
}

function call(c: Extract<Command, { op: "call" }>): Promise<unknown> {
  return callUnary(client(c.client), c.method, c.request, PLUGIN_METHODS[c.method], {
    timeoutMs: c.timeoutMs,
    failed: (err) => new RpcFailure(err.code, err.details || err.message),
    answer: `${c.method} answer`,
  });
}

function watch(clientId: number, id: number): void {
  const c = client(clientId);
  const fn = z.custom<(req: unknown) => grpc.ClientReadableStream<unknown>>(
    (v) => typeof v === "function",
  ).parse(Reflect.get(c, "ListAndWatch"));
  const stream = fn.call(c, {});
  watches.set(id, stream);
  let ended = false;
  const end = (error: string | null) => {
    if (ended) return;
    ended = true;
    watches.delete(id);
    send({ kind: "ended", watch: id, error });
  };
  stream.on("data", (m: unknown) => {
    const parsed = ListSchema.safeParse(m);
    if (parsed.success) send({ kind: "list", watch: id, devices: parsed.data.devices });
    else {
      end(`Unexpected ListAndWatch answer: ${z.prettifyError(parsed.error)}`);
      stream.cancel();
    }
  });
  stream.on("error", (err: Error) => end(String(err)));
  stream.on("end", () => end(null));
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

const role: Role = RoleSchema.parse(Deno.args[0]);

/** The ops each role answers. */
const OPS: Record<Role, readonly Command["op"][]> = {
  registration: ["register", "sync"],
  "pod-resources": ["podResources", "admit", "forget", "podResourcesCalls", "sync"],
  clients: ["open", "call", "watch", "cancel", "sync"],
};

async function handle(c: Command): Promise<unknown> {
  if (!OPS[role].includes(c.op)) throw new Error(`A ${role} process does not do "${c.op}"`);
  switch (c.op) {
    case "register":
      return await serveRegistration(c.dir, c.clean);
    case "podResources":
      return await servePodResources(c.socket);
    case "admit": {
      pods.set(`${c.pod.namespace}/${c.pod.name}`, c.pod);
      return null;
    }
    case "forget": {
      pods.delete(`${c.namespace}/${c.name}`);
      return null;
    }
    case "podResourcesCalls":
      return podResourcesCalls;
    case "open": {
      clients.set(
        c.client,
        new (load().plugin)(`unix:${c.socket}`, grpc.credentials.createInsecure()),
      );
      return null;
    }
    case "call":
      return await call(c);
    case "watch":
      return watch(c.client, c.watch);
    case "cancel":
      return watches.get(c.watch)?.cancel();
    case "sync":
      return null;
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

let buffered = "";
for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
  buffered += chunk;
  for (let nl = buffered.indexOf("\n"); nl !== -1; nl = buffered.indexOf("\n")) {
    const line = buffered.slice(0, nl);
    buffered = buffered.slice(nl + 1);
    if (line.trim() === "") continue;
    run(line).catch((err) => {
      console.error(`The tests' kubelet (${role}) cannot go on:`, err);
      Deno.exit(1);
    });
  }
}
// The test is done with this kubelet: it stops at once, every connection cut, none shut down.
await writing;
Deno.exit(0);
