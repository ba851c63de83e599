/**
 * What the tests' kubelet speaks: the messages of kubelet's published device-plugin API
 * (v1beta1: `deviceplugin_v1beta1.proto`) and pod-resources API (v1), as zod schemas, and
 * the JSON lines between the kubelet process (`kubelet_main.ts`) and the test that drives
 * it (`fake_kubelet.ts`). Imports none of enim's code.
 *
 * @module
 */
import { z } from "zod";

/** kubelet's pod-resources socket, in `pod-resources/` of its root directory. */
export const POD_RESOURCES_SOCKET = "pod-resources/kubelet.sock";
/** kubelet's socket name in its folder (constants.go `KubeletSocket`). */
export const KUBELET_SOCKET = "kubelet.sock";

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

/** ListAndWatchResponse. */
export const ListSchema = z.object({ devices: z.array(DeviceSchema) });

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

/** PreStartContainerResponse (empty). */
export const PreStartResponseSchema = z.object({}).strict();

/** The unary methods of the DevicePlugin service kubelet calls, with their answers' schemas. */
export const PLUGIN_METHODS = {
  GetDevicePluginOptions: OptionsSchema,
  Allocate: AllocateResponseSchema,
  PreStartContainer: PreStartResponseSchema,
  GetPreferredAllocation: z.unknown(),
} as const;

/** A unary method of the DevicePlugin service. */
export type PluginMethod = keyof typeof PLUGIN_METHODS;

const PluginMethodSchema = z.enum([
  "GetDevicePluginOptions",
  "Allocate",
  "PreStartContainer",
  "GetPreferredAllocation",
]);

/** A pod kubelet has admitted: its containers and the devices each was given, by resource. */
export const AdmittedPodSchema = z.object({
  namespace: z.string(),
  name: z.string(),
  containers: z.array(z.object({
    name: z.string(),
    devices: z.array(z.object({ resource_name: z.string(), device_ids: z.array(z.string()) })),
  })),
});
/** A pod kubelet has admitted. */
export type AdmittedPod = z.infer<typeof AdmittedPodSchema>;

const Id = z.number().int().positive();

/**
 * What one kubelet process does: serve Registration (a restart is a new one), serve the
 * pod-resources API, or be kubelet's clients of the plugins (which outlive a restart of
 * Registration, as kubelet's connections to a plugin outlive what the tests restart).
 */
export const RoleSchema = z.enum(["registration", "pod-resources", "clients"]);
/** What one kubelet process does. */
export type Role = z.infer<typeof RoleSchema>;

/**
 * A command of the test to a kubelet process: one JSON line on its stdin, answered by `id`.
 * A process stops when its stdin ends: at once, as a killed kubelet does (no GOAWAY).
 */
export const CommandSchema = z.discriminatedUnion("op", [
  /**
   * registration: serve Registration on `dir`/kubelet.sock, after deleting every file in
   * `dir` when `clean` (a starting kubelet); answered with the entries the deletion left.
   */
  z.object({ op: z.literal("register"), id: Id, dir: z.string(), clean: z.boolean() }),
  /** pod-resources: serve `List` and `Get` on `socket`. */
  z.object({ op: z.literal("podResources"), id: Id, socket: z.string() }),
  z.object({ op: z.literal("admit"), id: Id, pod: AdmittedPodSchema }),
  z.object({ op: z.literal("forget"), id: Id, namespace: z.string(), name: z.string() }),
  z.object({ op: z.literal("podResourcesCalls"), id: Id }),
  /** clients: open kubelet's client `client` of the plugin socket `socket`. */
  z.object({ op: z.literal("open"), id: Id, client: Id, socket: z.string() }),
  z.object({
    op: z.literal("call"),
    id: Id,
    client: Id,
    method: PluginMethodSchema,
    request: z.unknown(),
    timeoutMs: z.number().positive(),
  }),
  /** Open ListAndWatch stream `watch` on `client`: its lists and its end come as events. */
  z.object({ op: z.literal("watch"), id: Id, client: Id, watch: Id }),
  z.object({ op: z.literal("cancel"), id: Id, watch: Id }),
  /** Answered once every event before it has been written. */
  z.object({ op: z.literal("sync"), id: Id }),
]);
/** A command to a kubelet process. */
export type Command = z.infer<typeof CommandSchema>;

/** What the kubelet process writes: one JSON line on its stdout, in the order things happen. */
export const MessageSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("answer"), id: Id, result: z.unknown() }),
  z.object({
    kind: z.literal("failed"),
    id: Id,
    message: z.string(),
    /** A failed gRPC call: its status code and the other side's message. */
    rpc: z.object({ code: z.number().int(), details: z.string() }).optional(),
  }),
  z.object({ kind: z.literal("registered"), request: RegisterRequestSchema }),
  z.object({ kind: z.literal("refused"), request: RegisterRequestSchema, message: z.string() }),
  z.object({ kind: z.literal("list"), watch: Id, devices: z.array(DeviceSchema) }),
  z.object({ kind: z.literal("ended"), watch: Id, error: z.string().nullable() }),
]);
/** A line of the kubelet process. */
export type Message = z.infer<typeof MessageSchema>;
