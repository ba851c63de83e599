/**
 * The plugin's `DevicePlugin` service as kubelet calls it: options, the
 * ListAndWatch stream (handed to the plugin), Allocate and PreStartContainer.
 *
 * What kubelet sends is parsed (`v1beta1.ts` schemas) and checked against the
 * devices advertised now: a device ID the node does not advertise, or a message
 * that does not parse, is answered `INVALID_ARGUMENT` naming it; a handler that
 * throws answers `INTERNAL`. Nothing of it reaches the agent's CNI service.
 *
 * The ENI itself is assigned at the pod's CNI ADD, not here: Allocate only checks
 * the IDs and answers one empty response per container.
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import type * as z from "zod/mini";
import type { Logger } from "../../lib/log.ts";
import { errorText, rpcError } from "./_grpc.ts";
import {
  AllocateRequestSchema,
  type Device,
  type DevicePluginOptions,
  HEALTHY,
  PreStartContainerRequestSchema,
} from "./v1beta1.ts";

/** What the service needs from the plugin. */
export interface ServiceHost {
  /** The extended resource, for messages. */
  resourceName: string;
  /** The devices advertised now. */
  devices(): readonly Device[];
  /** Takes over a ListAndWatch stream kubelet opened. */
  openStream(call: grpc.ServerWritableStream<unknown, unknown>): void;
  log: Logger;
}

/** The first problem of a zod failure, with its path. */
function firstIssue(err: z.core.$ZodError): string {
  const i = err.issues[0];
  return i ? `${i.path.join(".") || "(message)"}: ${i.message}` : "invalid";
}

/** The error naming the IDs the node does not advertise, or null when it advertises them all. */
function unknownIds(host: ServiceHost, ids: readonly string[]): Partial<grpc.StatusObject> | null {
  const devices = host.devices();
  const known = new Set(devices.map((d) => d.ID));
  const unknown = [...new Set(ids.filter((id) => !known.has(id)))];
  if (unknown.length === 0) return null;
  const n = devices.length;
  const advertised = n === 0
    ? "none"
    : n === 1
    ? `"${devices[0].ID}"`
    : `"${devices[0].ID}" to "${devices[n - 1].ID}"`;
  return rpcError(
    grpc.status.INVALID_ARGUMENT,
    `Unknown ${host.resourceName} device ID${unknown.length > 1 ? "s" : ""} ${
      unknown.map((id) => `"${id}"`).join(", ")
    }: this node advertises ${advertised}`,
  );
}

type Unary = (
  call: grpc.ServerUnaryCall<unknown, unknown>,
  cb: grpc.sendUnaryData<unknown>,
) => void;

/** The DevicePlugin service's handlers (see the module doc). */
export function serviceHandlers(host: ServiceHost): grpc.UntypedServiceImplementation {
  const log = host.log;
  /** A unary handler that answers INTERNAL rather than throw. */
  const unary = (what: string, fn: Unary): Unary => (call, cb) => {
    try {
      fn(call, cb);
    } catch (err) {
      log.error(`The device plugin's ${what} failed`, { error: err });
      cb(rpcError(grpc.status.INTERNAL, `${what} failed: ${errorText(err)}`));
    }
  };
  const options: DevicePluginOptions = {
    pre_start_required: false,
    get_preferred_allocation_available: false,
  };
  return {
    GetDevicePluginOptions: unary("GetDevicePluginOptions", (_call, cb) => cb(null, options)),
    ListAndWatch: (call: grpc.ServerWritableStream<unknown, unknown>) => {
      try {
        host.openStream(call);
      } catch (err) {
        log.error("The device plugin's ListAndWatch failed", { error: err });
        call.destroy(err instanceof Error ? err : new Error(String(err)));
      }
    },
    GetPreferredAllocation: unary("GetPreferredAllocation", (_call, cb) =>
      cb(rpcError(
        grpc.status.UNIMPLEMENTED,
        `${host.resourceName} has no preferred allocation (its options say so)`,
      ))),
    Allocate: unary("Allocate", (call, cb) => {
      const parsed = AllocateRequestSchema.safeParse(call.request);
      if (!parsed.success) {
        cb(rpcError(
          grpc.status.INVALID_ARGUMENT,
          `Malformed AllocateRequest: ${firstIssue(parsed.error)}`,
        ));
        return;
      }
      const ids = parsed.data.container_requests.flatMap((c) => c.devices_ids);
      const bad = unknownIds(host, ids);
      if (bad) {
        log.warn("kubelet asked to allocate devices this node does not advertise", {
          error: bad.details,
        });
        cb(bad);
        return;
      }
      // kubelet picks among the Healthy ones; an Unhealthy one here is a race with a new list.
      const unhealthy = new Set(
        host.devices().filter((d) => d.health !== HEALTHY).map((d) => d.ID),
      );
      log.info("kubelet allocated devices", {
        resource: host.resourceName,
        devices: ids,
        ...(ids.some((id) => unhealthy.has(id))
          ? { unhealthy: ids.filter((id) => unhealthy.has(id)) }
          : {}),
      });
      cb(null, { container_responses: parsed.data.container_requests.map(() => ({})) });
    }),
    PreStartContainer: unary("PreStartContainer", (call, cb) => {
      const parsed = PreStartContainerRequestSchema.safeParse(call.request);
      if (!parsed.success) {
        cb(rpcError(
          grpc.status.INVALID_ARGUMENT,
          `Malformed PreStartContainerRequest: ${firstIssue(parsed.error)}`,
        ));
        return;
      }
      const bad = unknownIds(host, parsed.data.devices_ids);
      if (bad) cb(bad);
      else cb(null, {});
    }),
  };
}
