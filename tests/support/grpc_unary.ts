/**
 * One unary gRPC call as the tests' clients make it (the CRI client and the kubelet
 * stand-in's plugin client): a deadline, the answer parsed with its schema, a failed
 * call turned into the caller's error.
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import { z } from "zod";

type Callback = (err: grpc.ServiceError | null, res: unknown) => void;
type UnaryMethod = (
  req: unknown,
  meta: grpc.Metadata,
  opts: grpc.CallOptions,
  cb: Callback,
) => void;

/** How {@linkcode callUnary} calls and what it names in its errors. */
export interface UnaryCallOptions {
  /** How long the call may take. */
  timeoutMs: number;
  /** The error a failed call rejects with. */
  failed(err: grpc.ServiceError): Error;
  /** What the answer is, in the error for an answer `schema` refuses (`CRI Version response`). */
  answer: string;
}

/** Calls the unary `method` of `client` with `req`; resolves with the answer parsed by `schema`. */
export function callUnary<T>(
  client: grpc.Client,
  method: string,
  req: unknown,
  schema: z.ZodType<T>,
  o: UnaryCallOptions,
): Promise<T> {
  const fn = (client as unknown as Record<string, UnaryMethod>)[method];
  return new Promise((resolve, reject) => {
    fn.call(
      client,
      req,
      new grpc.Metadata(),
      { deadline: Date.now() + o.timeoutMs },
      (err, res) => {
        if (err) {
          reject(o.failed(err));
          return;
        }
        const parsed = schema.safeParse(res);
        if (parsed.success) resolve(parsed.data);
        else reject(new Error(`Unexpected ${o.answer}: ${z.prettifyError(parsed.error)}`));
      },
    );
  });
}
