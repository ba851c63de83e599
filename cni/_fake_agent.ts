/**
 * A fake {@linkcode AgentClient} for the CNI unit tests: records every call and
 * answers with what the test sets (or throws what the test sets).
 *
 * @module
 */
import type {
  AddRequest,
  AddResponse,
  Attachment,
  CheckRequest,
  DelRequest,
  GcReport,
  GcRequest,
  Status,
} from "../manager/api_schema.ts";
import { type AgentClient, AgentUnreachableError } from "../manager/client.ts";
import type { Eni } from "../providers/contract.ts";

/** A canned ADD answer: one IPv4 and one IPv6 address, one route. */
export const SAMPLE_ADD_RESPONSE: AddResponse = {
  eniId: "eni-0001",
  mac: "02:00:00:00:00:01",
  ifindex: 10,
  nodeName: "eni0001",
  ips: [
    { address: "10.0.1.5/24", gateway: "10.0.1.1" },
    { address: "2001:db8::5/64", gateway: "2001:db8::1" },
  ],
  routes: [{ dst: "0.0.0.0/0", gw: "10.0.1.1" }],
};

/** A canned status that can allocate. */
export function sampleStatus(over: Partial<Status> = {}): Status {
  return {
    version: "0.1.0",
    provider: "mock",
    ready: true,
    canAllocate: true,
    pool: { free: 2, owned: 1, recycling: 0, held: 0, attachable: 3, profiles: {} },
    enis: [],
    providerDetails: {},
    ...over,
  };
}

/** One recorded call. */
export interface FakeCall {
  method: string;
  socketPath: string;
  timeoutMs: number;
  req?: unknown;
}

/** What the fake answers; a function lets a test throw. */
export interface FakeBehaviour {
  add?: (req: AddRequest) => AddResponse;
  del?: (req: DelRequest) => void;
  check?: (req: CheckRequest) => void;
  gc?: (req: GcRequest) => GcReport;
  status?: () => Status;
  /** Every call throws {@linkcode AgentUnreachableError}. */
  unreachable?: boolean;
}

/** A fake agent and the factory `runPlugin` takes. */
export class FakeAgent {
  readonly calls: FakeCall[] = [];
  behaviour: FakeBehaviour;

  constructor(behaviour: FakeBehaviour = {}) {
    this.behaviour = behaviour;
  }

  /** The `agent` option of `runPlugin`. */
  factory = (socketPath: string, timeoutMs: number): AgentClient => {
    const b = this.behaviour;
    const call = <T>(method: string, req: unknown, fn: () => T): Promise<T> => {
      this.calls.push({ method, socketPath, timeoutMs, req });
      if (b.unreachable) {
        return Promise.reject(
          new AgentUnreachableError(socketPath, {
            cause: new Deno.errors.NotFound("No such file or directory (os error 2)"),
          }),
        );
      }
      try {
        return Promise.resolve(fn());
      } catch (err) {
        return Promise.reject(err);
      }
    };
    return {
      add: (req) => call("add", req, () => (b.add ?? (() => SAMPLE_ADD_RESPONSE))(req)),
      del: (req) => call("del", req, () => b.del?.(req)),
      check: (req) => call("check", req, () => b.check?.(req)),
      gc: (req) => call("gc", req, () => (b.gc ?? (() => ({ dryRun: false, items: [] })))(req)),
      status: () => call("status", undefined, () => (b.status ?? (() => sampleStatus()))()),
      attachments: () => call("attachments", undefined, (): Attachment[] => []),
      enis: () => call("enis", undefined, (): Eni[] => []),
      metrics: () => call("metrics", undefined, () => ""),
    };
  };
}
