/**
 * kubelet's device-plugin API, version `v1beta1`: the two gRPC services (kubelet's
 * `Registration`, the plugin's `DevicePlugin`), their messages, and the constants
 * kubelet and plugins agree on.
 *
 * Written for enim from the published API, kubernetes/kubelet
 * `pkg/apis/deviceplugin/v1beta1/api.proto` (package `v1beta1`, the field names and
 * numbers below are that file's) and `constants.go` (versions, health values, the
 * folder and kubelet's socket name). It is a protobufjs JSON descriptor
 * ({@linkcode V1BETA1_DESCRIPTOR}) that `@grpc/proto-loader`'s `fromJSON` turns into
 * service definitions, so nothing reads a `.proto` file at run time. Messages are
 * read and written with their proto field names (`keepCase`).
 *
 * What kubelet sends is parsed with the zod schemas here before it is used.
 *
 * @module
 */
import type { fromJSON } from "@grpc/proto-loader";
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";

/** The API version a plugin registers with (`constants.go` `Version`). */
export const API_VERSION = "v1beta1";
/** A device that can be allocated (`constants.go` `Healthy`). */
export const HEALTHY = "Healthy";
/** A device that cannot (`constants.go` `Unhealthy`). */
export const UNHEALTHY = "Unhealthy";
/** The folder kubelet watches for plugin sockets (`constants.go` `DevicePluginPath`). */
export const DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins";
/** kubelet's Registration socket, in that folder (`constants.go` `KubeletSocket`). */
export const KUBELET_SOCKET_NAME = "kubelet.sock";
/** A device ID is at most this long (api.proto, `Device.ID`). */
export const MAX_DEVICE_ID_LENGTH = 63;

const str = (id: number) => ({ type: "string", id });
const repeated = (type: string, id: number) => ({ rule: "repeated", type, id });
/** A `map<string, string>` field. */
const stringMap = (id: number) => ({ keyType: "string", type: "string", id });
/** One method: its messages, whether it answers with a stream, and what it is for. */
const rpc = (requestType: string, responseType: string, comment: string, stream = false) => ({
  requestType,
  responseType,
  responseStream: stream,
  comment,
});

/**
 * The v1beta1 package as a protobufjs JSON descriptor (see the module doc for its
 * source). Every message and both services of api.proto are here, so kubelet's
 * messages decode whole whatever it sends.
 */
export const V1BETA1_DESCRIPTOR: Parameters<typeof fromJSON>[0] = {
  nested: {
    v1beta1: {
      nested: {
        Registration: {
          methods: {
            Register: rpc(
              "RegisterRequest",
              "Empty",
              "A plugin registers its socket and resource name; kubelet then connects to it",
            ),
          },
        },
        DevicePluginOptions: {
          fields: {
            pre_start_required: { type: "bool", id: 1 },
            get_preferred_allocation_available: { type: "bool", id: 2 },
          },
        },
        RegisterRequest: {
          fields: {
            version: str(1),
            endpoint: str(2),
            resource_name: str(3),
            options: { type: "DevicePluginOptions", id: 4 },
          },
        },
        Empty: { fields: {} },
        DevicePlugin: {
          methods: {
            GetDevicePluginOptions: rpc(
              "Empty",
              "DevicePluginOptions",
              "Which optional calls the plugin wants (PreStartContainer, GetPreferredAllocation)",
            ),
            ListAndWatch: rpc(
              "Empty",
              "ListAndWatchResponse",
              "The device list, then a new one whenever a device changes or goes",
              true,
            ),
            GetPreferredAllocation: rpc(
              "PreferredAllocationRequest",
              "PreferredAllocationResponse",
              "Which of the available devices the plugin would rather have allocated",
            ),
            Allocate: rpc(
              "AllocateRequest",
              "AllocateResponse",
              "At container creation: the devices kubelet chose, per container",
            ),
            PreStartContainer: rpc(
              "PreStartContainerRequest",
              "PreStartContainerResponse",
              "Before each container starts, when the options ask for it",
            ),
          },
        },
        ListAndWatchResponse: { fields: { devices: repeated("Device", 1) } },
        TopologyInfo: { fields: { nodes: repeated("NUMANode", 1) } },
        NUMANode: { fields: { ID: { type: "int64", id: 1 } } },
        Device: {
          fields: { ID: str(1), health: str(2), topology: { type: "TopologyInfo", id: 3 } },
        },
        PreStartContainerRequest: { fields: { devices_ids: repeated("string", 1) } },
        PreStartContainerResponse: { fields: {} },
        PreferredAllocationRequest: {
          fields: { container_requests: repeated("ContainerPreferredAllocationRequest", 1) },
        },
        ContainerPreferredAllocationRequest: {
          fields: {
            available_deviceIDs: repeated("string", 1),
            must_include_deviceIDs: repeated("string", 2),
            allocation_size: { type: "int32", id: 3 },
          },
        },
        PreferredAllocationResponse: {
          fields: { container_responses: repeated("ContainerPreferredAllocationResponse", 1) },
        },
        ContainerPreferredAllocationResponse: { fields: { deviceIDs: repeated("string", 1) } },
        AllocateRequest: {
          fields: { container_requests: repeated("ContainerAllocateRequest", 1) },
        },
        ContainerAllocateRequest: { fields: { devices_ids: repeated("string", 1) } },
        CDIDevice: { fields: { name: str(1) } },
        AllocateResponse: {
          fields: { container_responses: repeated("ContainerAllocateResponse", 1) },
        },
        ContainerAllocateResponse: {
          fields: {
            envs: stringMap(1),
            mounts: repeated("Mount", 2),
            devices: repeated("DeviceSpec", 3),
            annotations: stringMap(4),
            cdi_devices: repeated("CDIDevice", 5),
          },
        },
        Mount: {
          fields: { container_path: str(1), host_path: str(2), read_only: { type: "bool", id: 3 } },
        },
        DeviceSpec: { fields: { container_path: str(1), host_path: str(2), permissions: str(3) } },
      },
    },
  },
};

/** The fully qualified service names (the keys of the loaded package definition). */
export const SERVICES = {
  registration: "v1beta1.Registration",
  devicePlugin: "v1beta1.DevicePlugin",
} as const;

/** A device ID as the API allows it: 1 to 63 characters. */
const DeviceId = z.string().check(z.minLength(1), z.maxLength(MAX_DEVICE_ID_LENGTH));

/** `Empty`, as kubelet sends it (unknown fields were dropped by the decoder). */
export const EmptySchema = z.object({});

/** `AllocateRequest`: the devices kubelet assigned, per container. */
export const AllocateRequestSchema = z.object({
  container_requests: z._default(
    z.array(z.object({ devices_ids: z._default(z.array(DeviceId), []) })),
    [],
  ),
});
/** A parsed `AllocateRequest`. */
export type AllocateRequest = z.infer<typeof AllocateRequestSchema>;

/** `PreStartContainerRequest`: the devices of one container about to start. */
export const PreStartContainerRequestSchema = z.object({
  devices_ids: z._default(z.array(DeviceId), []),
});

/** One device as ListAndWatch sends it. */
export interface Device {
  ID: string;
  health: typeof HEALTHY | typeof UNHEALTHY;
}

/** `DevicePluginOptions`. */
export interface DevicePluginOptions {
  pre_start_required: boolean;
  get_preferred_allocation_available: boolean;
}

/** `RegisterRequest`. */
export interface RegisterRequest {
  version: string;
  endpoint: string;
  resource_name: string;
  options: DevicePluginOptions;
}
