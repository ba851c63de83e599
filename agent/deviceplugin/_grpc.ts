/**
 * The gRPC plumbing of the device plugin: kubelet's two services built from the
 * v1beta1 descriptor (`@grpc/proto-loader`'s `fromJSON`, once), the Register call
 * to kubelet with its deadline, and gRPC errors as text.
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import { fromJSON } from "@grpc/proto-loader";
import { EmptySchema, type RegisterRequest, SERVICES, V1BETA1_DESCRIPTOR } from "./v1beta1.ts";

/** proto-loader's options: proto field names as they are, 64-bit integers as numbers. */
const LOADER = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };

function serviceConstructor(pkg: grpc.GrpcObject, name: string): grpc.ServiceClientConstructor {
  const [ns, svc] = name.split(".");
  const space = pkg[ns];
  const ctor = space && typeof space === "object" && svc in space
    ? (space as grpc.GrpcObject)[svc]
    : undefined;
  if (typeof ctor !== "function" || !("service" in ctor)) {
    throw new Error(`The device-plugin API has no service "${name}"`);
  }
  return ctor as grpc.ServiceClientConstructor;
}

let loaded: { registration: grpc.ServiceClientConstructor; plugin: grpc.ServiceDefinition } | null =
  null;

/** kubelet's Registration client and the plugin's DevicePlugin service, built once. */
export function services(): {
  registration: grpc.ServiceClientConstructor;
  plugin: grpc.ServiceDefinition;
} {
  if (!loaded) {
    const pkg = grpc.loadPackageDefinition(fromJSON(V1BETA1_DESCRIPTOR, LOADER));
    loaded = {
      registration: serviceConstructor(pkg, SERVICES.registration),
      plugin: serviceConstructor(pkg, SERVICES.devicePlugin).service,
    };
  }
  return loaded;
}

/** The message of an error, gRPC's `details` first. */
export function errorText(err: unknown): string {
  if (err && typeof err === "object" && "details" in err && typeof err.details === "string") {
    if (err.details) return err.details;
  }
  return err instanceof Error ? err.message : String(err);
}

/** A gRPC error for the caller: a status code and a message. */
export function rpcError(code: grpc.status, details: string): Partial<grpc.StatusObject> {
  return { code, details };
}

/** kubelet refused a Register, failed it, or did not answer it in time. */
export class RegisterError extends Error {
  /** Whether kubelet did not answer before the deadline. */
  readonly timedOut: boolean;
  constructor(message: string, timedOut: boolean, options?: ErrorOptions) {
    super(message, options);
    this.name = "RegisterError";
    this.timedOut = timedOut;
  }
}

/**
 * Calls kubelet's `Registration.Register` on `socket` with a deadline of
 * `timeoutMs`; throws {@linkcode RegisterError} saying what went wrong.
 */
export async function register(
  socket: string,
  request: RegisterRequest,
  timeoutMs: number,
): Promise<void> {
  const ctor = services().registration;
  const client = new ctor(`unix:${socket}`, grpc.credentials.createInsecure());
  const method = ctor.service.Register;
  try {
    const reply = await new Promise<unknown>((resolve, reject) => {
      client.makeUnaryRequest(
        method.path,
        method.requestSerialize,
        method.responseDeserialize,
        request,
        new grpc.Metadata(),
        { deadline: Date.now() + timeoutMs },
        (err, value) => err ? reject(err) : resolve(value),
      );
    });
    EmptySchema.parse(reply ?? {});
  } catch (err) {
    const timedOut = err !== null && typeof err === "object" && "code" in err &&
      err.code === grpc.status.DEADLINE_EXCEEDED;
    throw new RegisterError(
      timedOut
        ? `kubelet did not answer Register on "${socket}" within ${timeoutMs / 1000} s`
        : `kubelet refused or failed Register on "${socket}": ${errorText(err)}`,
      timedOut,
      { cause: err },
    );
  } finally {
    client.close();
  }
}
