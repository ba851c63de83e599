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
} from "../../api/schema.ts";
import type { AgentClient } from "../../api/client.ts";
import type { Eni } from "../../providers/contract.ts";

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
    pool: {
      exhausted: false,
      free: 2,
      owned: 1,
      recycling: 0,
      held: 0,
      attachable: 3,
      profiles: {},
    },
    enis: [],
    providerDetails: {},
    sticky: { parked: [], claims: [] },
    hostLinks: { links: 0, withoutServiceCidrs: [] },
    unfinishedDels: [],
    ...over,
  };
}

/** One recorded call. */
export interface FakeCall {
  method: string;
  req?: unknown;
}

/** What the fake answers; a function lets a test throw. */
export interface FakeBehaviour {
  add?: (req: AddRequest) => AddResponse;
  del?: (req: DelRequest) => void;
  check?: (req: CheckRequest) => void;
  gc?: (req: GcRequest) => GcReport;
  status?: () => Status;
}

/** A fake agent: the `agent` the dispatcher (`dispatchCall`) takes, recording every call. */
export class FakeAgent implements AgentClient {
  readonly calls: FakeCall[] = [];
  behaviour: FakeBehaviour;

  constructor(behaviour: FakeBehaviour = {}) {
    this.behaviour = behaviour;
  }

  #call<T>(method: string, req: unknown, fn: () => T): Promise<T> {
    this.calls.push({ method, req });
    try {
      return Promise.resolve(fn());
    } catch (err) {
      return Promise.reject(err);
    }
  }

  add(req: AddRequest): Promise<AddResponse> {
    return this.#call("add", req, () => (this.behaviour.add ?? (() => SAMPLE_ADD_RESPONSE))(req));
  }
  del(req: DelRequest): Promise<void> {
    return this.#call("del", req, () => this.behaviour.del?.(req));
  }
  check(req: CheckRequest): Promise<void> {
    return this.#call("check", req, () => this.behaviour.check?.(req));
  }
  gc(req: GcRequest): Promise<GcReport> {
    return this.#call(
      "gc",
      req,
      () => (this.behaviour.gc ?? (() => ({ dryRun: false, items: [], unfinishedDels: [] })))(req),
    );
  }
  status(): Promise<Status> {
    return this.#call(
      "status",
      undefined,
      () => (this.behaviour.status ?? (() => sampleStatus()))(),
    );
  }
  attachments(): Promise<Attachment[]> {
    return this.#call("attachments", undefined, (): Attachment[] => []);
  }
  enis(): Promise<Eni[]> {
    return this.#call("enis", undefined, (): Eni[] => []);
  }
  metrics(): Promise<string> {
    return this.#call("metrics", undefined, () => "");
  }
}
