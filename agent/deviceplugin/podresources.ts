/**
 * kubelet's pod-resources API, version `v1` (`PodResourcesLister.List`): which pods
 * kubelet has given devices of a resource, read from kubelet's local socket (no
 * API-server access). The device plugin uses it to tell which attachments kubelet
 * counts an `enim.dev/eni` device for (`accounting.ts`).
 *
 * Written for enim from the published API, kubernetes/kubelet
 * `pkg/apis/podresources/v1/api.proto` (package `v1`; the field names and numbers
 * below are that file's). Only what enim reads is declared: the decoder skips the
 * other fields (CPUs, memory, topology, dynamic resources), whatever kubelet sends.
 * The socket is `pod-resources/kubelet.sock` in kubelet's root directory, beside the
 * device-plugin folder (`constants.go` `DefaultKubeletPodResourcesDirName`).
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import { fromJSON } from "@grpc/proto-loader";
import { dirname, join } from "node:path";
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import { errorText } from "./_grpc.ts";

const str = (id: number) => ({ type: "string", id });
const repeated = (type: string, id: number) => ({ rule: "repeated", type, id });

/** The part of the v1 package enim reads, as a protobufjs JSON descriptor. */
const V1_DESCRIPTOR: Parameters<typeof fromJSON>[0] = {
  nested: {
    v1: {
      nested: {
        PodResourcesLister: {
          methods: {
            List: {
              requestType: "ListPodResourcesRequest",
              responseType: "ListPodResourcesResponse",
              comment: "The resources kubelet has assigned to each pod's containers",
            },
          },
        },
        ListPodResourcesRequest: { fields: {} },
        ListPodResourcesResponse: { fields: { pod_resources: repeated("PodResources", 1) } },
        PodResources: {
          fields: {
            name: str(1),
            namespace: str(2),
            containers: repeated("ContainerResources", 3),
          },
        },
        ContainerResources: {
          fields: { name: str(1), devices: repeated("ContainerDevices", 2) },
        },
        ContainerDevices: {
          fields: { resource_name: str(1), device_ids: repeated("string", 2) },
        },
      },
    },
  },
};

/** `ListPodResourcesResponse`, as far as enim reads it. */
const ListResponseSchema = z.object({
  pod_resources: z._default(
    z.array(z.object({
      name: z.string(),
      namespace: z.string(),
      containers: z._default(
        z.array(z.object({
          devices: z._default(
            z.array(z.object({
              resource_name: z.string(),
              device_ids: z._default(z.array(z.string()), []),
            })),
            [],
          ),
        })),
        [],
      ),
    })),
    [],
  ),
});

/** kubelet's pod-resources socket for its device-plugin folder `dir` (both in kubelet's root). */
export function podResourcesSocket(dir: string): string {
  return join(dirname(dir), "pod-resources", "kubelet.sock");
}

let lister: grpc.ServiceClientConstructor | null = null;

function listerClient(): grpc.ServiceClientConstructor {
  if (!lister) {
    const pkg = grpc.loadPackageDefinition(fromJSON(V1_DESCRIPTOR, {
      keepCase: true,
      longs: Number,
      enums: String,
      defaults: true,
    }));
    lister = (pkg.v1 as grpc.GrpcObject).PodResourcesLister as grpc.ServiceClientConstructor;
  }
  return lister;
}

/**
 * How many devices of `resource` kubelet has assigned to each pod (`namespace/name`),
 * pods without any left out. Throws, saying why, when kubelet cannot be asked.
 */
export async function podDevices(
  socket: string,
  resource: string,
  timeoutMs: number,
): Promise<Map<string, number>> {
  try {
    await Deno.stat(socket);
  } catch (err) {
    throw new Error(
      err instanceof Deno.errors.NotFound
        ? `kubelet's pod-resources socket "${socket}" does not exist (is kubelet running, and is its pod-resources folder mounted?)`
        : `Cannot look at kubelet's pod-resources socket "${socket}": ${errorText(err)}`,
      { cause: err },
    );
  }
  const ctor = listerClient();
  // Its own subchannel, closed with it: nothing of a failed connection outlives the call.
  const client = new ctor(`unix:${socket}`, grpc.credentials.createInsecure(), {
    "grpc.use_local_subchannel_pool": 1,
  });
  const method = ctor.service.List;
  try {
    const reply = await new Promise<unknown>((resolve, reject) => {
      client.makeUnaryRequest(
        method.path,
        method.requestSerialize,
        method.responseDeserialize,
        {},
        new grpc.Metadata(),
        { deadline: Date.now() + timeoutMs },
        (err, value) => err ? reject(err) : resolve(value),
      );
    });
    const parsed = z.safeParse(ListResponseSchema, reply ?? {});
    if (!parsed.success) {
      throw new Error(`kubelet's pod resources answer is malformed: ${parsed.error.message}`);
    }
    const out = new Map<string, number>();
    for (const pod of parsed.data.pod_resources) {
      let n = 0;
      for (const c of pod.containers) {
        for (const d of c.devices) if (d.resource_name === resource) n += d.device_ids.length;
      }
      if (n > 0) {
        out.set(`${pod.namespace}/${pod.name}`, (out.get(`${pod.namespace}/${pod.name}`) ?? 0) + n);
      }
    }
    return out;
  } catch (err) {
    throw new Error(`Cannot list kubelet's pod resources on "${socket}": ${errorText(err)}`, {
      cause: err,
    });
  } finally {
    client.close();
  }
}
