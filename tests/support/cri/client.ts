/**
 * A small CRI v1 client (the RuntimeService calls kubelet makes around a pod sandbox), over
 * gRPC on a unix socket, for the containerd test.
 *
 * Built on `@grpc/grpc-js` and `@grpc/proto-loader` (test-only imports in deno.json) with
 * tests/support/cri/cri.proto, a subset of kubernetes/cri-api's `runtime.v1` written for these tests.
 * Every response is parsed with zod (the fields the tests use), never cast.
 *
 * {@linkcode kubeletSandboxConfig} builds a PodSandboxConfig as kubelet does
 * (pkg/kubelet/kuberuntime: `generatePodSandboxConfig`, `newPodLabels`,
 * `newPodAnnotations`): the pod's labels plus `io.kubernetes.pod.{name,namespace,uid}`, the
 * pod's annotations as they are, metadata, hostname, log directory and the Linux namespace
 * options of an ordinary pod.
 *
 * @example
 * ```ts ignore
 * await using cri = await CriClient.connect("/tmp/x/containerd.sock");
 * const id = await cri.runPodSandbox(kubeletSandboxConfig({ name: "web", namespace: "default", uid }));
 * const { status } = await cri.podSandboxStatus(id);
 * ```
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { z } from "zod";
import { callUnary } from "../grpc_unary.ts";

const PROTO = new URL("./cri.proto", import.meta.url).pathname;

/** A pod as kubelet sees it, reduced to what goes into its sandbox config. */
export interface PodSpec {
  name: string;
  namespace: string;
  uid: string;
  /** The sandbox attempt (kubelet counts re-creations of a pod's sandbox). */
  attempt?: number;
  /** The pod's metadata.labels. */
  labels?: Record<string, string>;
  /** The pod's metadata.annotations. */
  annotations?: Record<string, string>;
}

/** Where kubelet-style paths of a sandbox go. */
export interface SandboxPlacement {
  /** The parent of the pod's log directory (kubelet: /var/log/pods). */
  logRoot: string;
  /** The sandbox's cgroup parent, cgroupfs style (kubelet: /kubepods/…/pod<uid>). */
  cgroupParent: string;
}

/** The PodSandboxConfig message, in proto-loader's camelCase object form. */
export interface PodSandboxConfig {
  metadata: { name: string; uid: string; namespace: string; attempt: number };
  hostname: string;
  logDirectory: string;
  dnsConfig: { servers: string[]; searches: string[]; options: string[] };
  portMappings: { protocol: "TCP" | "UDP" | "SCTP"; containerPort: number; hostPort: number }[];
  labels: Record<string, string>;
  annotations: Record<string, string>;
  linux: {
    cgroupParent: string;
    securityContext: {
      namespaceOptions: { network: NamespaceMode; pid: NamespaceMode; ipc: NamespaceMode };
    };
    sysctls: Record<string, string>;
  };
}

type NamespaceMode = "POD" | "CONTAINER" | "NODE" | "TARGET";

/** The labels kubelet adds to every sandbox (pkg/kubelet/types: KubernetesPod*Label). */
export const KUBELET_POD_LABELS = {
  name: "io.kubernetes.pod.name",
  namespace: "io.kubernetes.pod.namespace",
  uid: "io.kubernetes.pod.uid",
} as const;

/** A PodSandboxConfig built the way kubelet builds one for an ordinary pod. */
export function kubeletSandboxConfig(pod: PodSpec, where: SandboxPlacement): PodSandboxConfig {
  return {
    metadata: {
      name: pod.name,
      uid: pod.uid,
      namespace: pod.namespace,
      attempt: pod.attempt ?? 0,
    },
    hostname: pod.name,
    logDirectory: `${where.logRoot}/${pod.namespace}_${pod.name}_${pod.uid}`,
    dnsConfig: { servers: [], searches: [], options: [] },
    portMappings: [],
    labels: {
      ...pod.labels,
      [KUBELET_POD_LABELS.name]: pod.name,
      [KUBELET_POD_LABELS.namespace]: pod.namespace,
      [KUBELET_POD_LABELS.uid]: pod.uid,
    },
    annotations: { ...pod.annotations },
    linux: {
      cgroupParent: where.cgroupParent,
      securityContext: { namespaceOptions: { network: "POD", pid: "CONTAINER", ipc: "POD" } },
      sysctls: {},
    },
  };
}

const StringMap = z.record(z.string(), z.string());

const MetadataSchema = z.object({
  name: z.string(),
  uid: z.string(),
  namespace: z.string(),
  attempt: z.number().int(),
});

/** The runtime's name and versions (Version). */
export const VersionResponseSchema = z.object({
  version: z.string(),
  runtimeName: z.string(),
  runtimeVersion: z.string(),
  runtimeApiVersion: z.string(),
});
/** The runtime's name and versions. */
export type VersionResponse = z.infer<typeof VersionResponseSchema>;

const RunPodSandboxResponseSchema = z.object({ podSandboxId: z.string().min(1) });

/** A sandbox's status (PodSandboxStatus), with `info` when asked for verbose. */
export const PodSandboxStatusResponseSchema = z.object({
  status: z.object({
    id: z.string(),
    metadata: MetadataSchema,
    state: z.enum(["SANDBOX_READY", "SANDBOX_NOTREADY"]),
    network: z.object({
      ip: z.string(),
      additionalIps: z.array(z.object({ ip: z.string() })),
    }).nullable(),
    labels: StringMap,
    annotations: StringMap,
  }),
  info: StringMap,
});
/** A sandbox's status. */
export type PodSandboxStatusResponse = z.infer<typeof PodSandboxStatusResponseSchema>;

const ListPodSandboxResponseSchema = z.object({
  items: z.array(z.object({
    id: z.string(),
    metadata: MetadataSchema,
    state: z.enum(["SANDBOX_READY", "SANDBOX_NOTREADY"]),
    labels: StringMap,
    annotations: StringMap,
  })),
});

/** The runtime's conditions (Status): RuntimeReady, NetworkReady. */
export const StatusResponseSchema = z.object({
  status: z.object({
    conditions: z.array(z.object({
      type: z.string(),
      status: z.boolean(),
      reason: z.string(),
      message: z.string(),
    })),
  }),
});
/** The runtime's conditions. */
export type StatusResponse = z.infer<typeof StatusResponseSchema>;

/** What containerd's CRI puts under `info` of a verbose PodSandboxStatus (the parts used). */
export const ContainerdSandboxInfoSchema = z.looseObject({
  pid: z.number().int(),
  runtimeSpec: z.looseObject({
    linux: z.looseObject({
      namespaces: z.array(z.looseObject({ type: z.string(), path: z.string().optional() })),
    }),
  }),
  cniResult: z.looseObject({
    Interfaces: z.record(
      z.string(),
      z.looseObject({
        IPConfigs: z.array(z.looseObject({ IP: z.string(), Gateway: z.string() })).nullable(),
        Mac: z.string(),
        Sandbox: z.string(),
      }),
    ),
  }).nullable(),
});
/** containerd's verbose sandbox info. */
export type ContainerdSandboxInfo = z.infer<typeof ContainerdSandboxInfoSchema>;

const ImageStatusResponseSchema = z.object({
  image: z.object({ id: z.string(), repoTags: z.array(z.string()) }).nullable(),
});

/** A CRI call that failed: the gRPC status code and the runtime's message. */
export class CriError extends Error {
  /** The gRPC status code (2 UNKNOWN for most runtime failures). */
  readonly code: number;
  /** The runtime's own message. */
  readonly details: string;

  constructor(method: string, code: number, details: string, options?: ErrorOptions) {
    super(`CRI ${method} failed (gRPC code ${code}): ${details}`, options);
    this.name = "CriError";
    this.code = code;
    this.details = details;
  }
}

/** A CRI v1 client (RuntimeService and ImageService) on a unix socket. */
export class CriClient implements AsyncDisposable {
  readonly #runtime: grpc.Client;
  readonly #images: grpc.Client;
  readonly #timeoutMs: number;

  private constructor(runtime: grpc.Client, images: grpc.Client, timeoutMs: number) {
    this.#runtime = runtime;
    this.#images = images;
    this.#timeoutMs = timeoutMs;
  }

  /** Connects to the runtime's socket (the connection is made on the first call). */
  static async connect(socket: string, timeoutMs = 120_000): Promise<CriClient> {
    const def = await protoLoader.load(PROTO, {
      keepCase: false,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    const v1 = (grpc.loadPackageDefinition(def).runtime as grpc.GrpcObject).v1 as grpc.GrpcObject;
    const Ctor = z.custom<grpc.ServiceClientConstructor>((v) => typeof v === "function");
    const target = `unix://${socket}`;
    const credentials = grpc.credentials.createInsecure();
    const runtime = new (Ctor.parse(v1.RuntimeService))(target, credentials);
    // The second service shares the first one's channel.
    const images = new (Ctor.parse(v1.ImageService))(target, credentials, {
      channelOverride: runtime.getChannel(),
    });
    return new CriClient(runtime, images, timeoutMs);
  }

  #call<T>(method: string, req: unknown, schema: z.ZodType<T>): Promise<T> {
    const client = method === "ImageStatus" ? this.#images : this.#runtime;
    return callUnary(client, method, req, schema, {
      timeoutMs: this.#timeoutMs,
      failed: (err) => new CriError(method, err.code, err.details || err.message, { cause: err }),
      answer: `CRI ${method} response`,
    });
  }

  /** Version: the runtime's name and version. */
  version(): Promise<VersionResponse> {
    return this.#call("Version", { version: "v1" }, VersionResponseSchema);
  }

  /** Status: the runtime's conditions. */
  status(): Promise<StatusResponse> {
    return this.#call("Status", { verbose: false }, StatusResponseSchema);
  }

  /** RunPodSandbox: creates and starts the sandbox (this is where the runtime calls CNI ADD). */
  async runPodSandbox(config: PodSandboxConfig, runtimeHandler = ""): Promise<string> {
    const res = await this.#call(
      "RunPodSandbox",
      { config, runtimeHandler },
      RunPodSandboxResponseSchema,
    );
    return res.podSandboxId;
  }

  /** StopPodSandbox: stops the sandbox and tears its network down (CNI DEL). */
  async stopPodSandbox(id: string): Promise<void> {
    await this.#call("StopPodSandbox", { podSandboxId: id }, z.object({}));
  }

  /** RemovePodSandbox: removes a sandbox (stopping it first if needed). */
  async removePodSandbox(id: string): Promise<void> {
    await this.#call("RemovePodSandbox", { podSandboxId: id }, z.object({}));
  }

  /** PodSandboxStatus, verbose by default (containerd then fills `info`). */
  podSandboxStatus(id: string, verbose = true): Promise<PodSandboxStatusResponse> {
    return this.#call(
      "PodSandboxStatus",
      { podSandboxId: id, verbose },
      PodSandboxStatusResponseSchema,
    );
  }

  /** ListPodSandbox without a filter: every sandbox the runtime knows. */
  async listPodSandbox(): Promise<z.infer<typeof ListPodSandboxResponseSchema>["items"]> {
    return (await this.#call("ListPodSandbox", {}, ListPodSandboxResponseSchema)).items;
  }

  /** ImageStatus: the image's id and tags when the runtime has it, else null. */
  async imageStatus(image: string): Promise<{ id: string; repoTags: string[] } | null> {
    return (await this.#call("ImageStatus", { image: { image } }, ImageStatusResponseSchema)).image;
  }

  /** Closes the channel. */
  close(): void {
    this.#images.close();
    this.#runtime.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    this.close();
    return Promise.resolve();
  }
}

/** Parses containerd's verbose sandbox info (the JSON under `info.info`). */
export function containerdSandboxInfo(res: PodSandboxStatusResponse): ContainerdSandboxInfo {
  const raw = res.info.info;
  if (raw === undefined) throw new Error("The sandbox status has no verbose info");
  return ContainerdSandboxInfoSchema.parse(JSON.parse(raw));
}

/** The network namespace path of a sandbox, from containerd's verbose info. */
export function sandboxNetns(info: ContainerdSandboxInfo): string {
  const ns = info.runtimeSpec.linux.namespaces.find((n) => n.type === "network");
  if (!ns?.path) throw new Error("The sandbox's runtime spec names no network namespace path");
  return ns.path;
}
