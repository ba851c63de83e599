/**
 * A fake BCE ENI API (and metadata service) on 127.0.0.1 for tests.
 *
 * - **Signatures are checked independently of enim's signer**: every request's
 *   `bce-auth-v1` Authorization is recomputed with the official JS SDK's signer
 *   (npm `@baiducloud/sdk@1.0.7`, `src/auth.js`, a test-only dependency) from the
 *   headers the Authorization lists, and compared as a whole. Unknown AK or bad
 *   signature → 403 `{code, message, requestId}` as BCE answers.
 * - The ENI state machine (available → attaching → inuse → detaching → available;
 *   delete only when available) with asynchronous attach/detach, per-instance
 *   ENI quotas, list pagination (maxKeys, marker/nextMarker), clientToken
 *   idempotency on every write, IPv6 addresses from a subnet's `ipv6Cidr`.
 * - Several subnets (each with its CIDR and optional IPv6 range) and a registry
 *   of security groups (regular `g-…` and enterprise `esg-…`): a create honours
 *   a chosen `privateIpAddress` (primary IPv4) and IPv6 address, refusing one
 *   outside the subnet or in use; `?bindSg` / `?bindEsg` *replace* the ENI's
 *   groups (every group of either kind, as BCE's docs say) and refuse a group of
 *   the other kind; `?modifyAttribute` sets the name and description.
 * - Request bodies are checked field by field, with the field names of the
 *   reference (`/work/shared/bce-eni-api.md` §1.2): an unknown field, a missing
 *   one or a wrong type is refused with 400 `InappropriateJSON`. (Whether BCE
 *   ignores unknown fields is unverified; the fake is strict so a misspelt field
 *   cannot pass unnoticed.)
 * - Error codes as BCE's public sources give them (see {@linkcode CODES}); where no
 *   source gives one, the constant says so.
 * - Faults on demand, each optionally matched to requests: an error status,
 *   throttling (HTTP 429 with an empty body by default), slow and lost responses,
 *   an ENI that stays stuck in `attaching`/`detaching`, an ENI that is not
 *   visible for a few reads after its create (eventual consistency).
 * - Out-of-band changes: {@linkcode FakeBce.deleteOutOfBand}, {@linkcode FakeBce.detachOutOfBand},
 *   {@linkcode FakeBce.attachNewOutOfBand}.
 * - The list's `name` filter matches exactly by default (whether BCE matches
 *   exactly, by prefix or fuzzily is unverified): a client relying on a prefix
 *   match finds nothing; `nameFilter: "prefix"` and `"ignore"` (the whole VPC
 *   whatever the filter) test the other readings.
 * - Instances with a zone and a status as BCE reports them (`Running`,
 *   `Stopped`, …; a released one answers 404 `NoSuchObject`): an attach is
 *   exclusive (an ENI that is not `available` is refused, so of two instances
 *   attaching one ENI at once exactly one succeeds), needs the instance Running
 *   or Stopped, and the ENI's subnet in the instance's zone.
 * - Metadata under `/1.0/meta-data/`; `onAttach(eni)` / `onDetach(eni)` hooks so a
 *   test can plug a device.
 *
 * @module
 */
import {
  type Cidr,
  contains,
  formatIp,
  nthAddress,
  parseCidr,
  parseIp,
  prefixSize,
} from "../../lib/ip.ts";
import { z } from "zod";
// The official SDK's signer (CommonJS, untyped): the fake's check owes nothing to enim's signer.
import SdkAuth from "@baiducloud/sdk/src/auth.js";
import { type Eni, makeEni } from "../../providers/contract.ts";

/**
 * The error codes the fake answers with, and where each comes from.
 * "No source" means no public BCE source gives the code; the fake then uses a
 * generic one and enim must not depend on it.
 */
export const CODES = {
  /**
   * An ENI that does not exist: CCE quotes BCE's answer to a detail call as
   * `[Code: EniNotFoundException; Message: eni:eni-… resource not exist]`
   * (baiducloud-cce-cni-driver cce-network-v2/pkg/bce/bcesync/eni.go). The HTTP
   * status is not given there; 404 is the fake's choice.
   */
  eniNotFound: { status: 404, code: "EniNotFoundException" },
  /** A malformed ENI id: 400 `EniIdException` "The param eniId is invalid" (CCE cce-network-v2/pkg/bce/api/cloud/error_test.go). */
  eniIdInvalid: { status: 400, code: "EniIdException" },
  /**
   * An unknown instance: 404 `NoSuchObject` (bce-sdk-java BccClientTest getInstanceNotExist;
   * BCE's common code table: "The specified object is not found or resource do not exist").
   */
  noSuchObject: { status: 404, code: "NoSuchObject" },
  /** An unknown path: 400 `InvalidURI` "Could not parse the specified URI." (BCE common error codes). */
  invalidUri: { status: 400, code: "InvalidURI" },
  /** A bad JSON value: 400 `InappropriateJSON` (BCE common error codes). */
  inappropriateJson: { status: 400, code: "InappropriateJSON" },
  /** A body that is not JSON: 400 `MalformedJSON` (BCE common error codes). */
  malformedJson: { status: 400, code: "MalformedJSON" },
  /** 400 `InvalidHTTPAuthHeader`, 403 `InvalidAccessKeyId`, 403 `AccessDenied` (BCE common error codes). */
  badAuthHeader: { status: 400, code: "InvalidHTTPAuthHeader" },
  unknownAccessKey: { status: 403, code: "InvalidAccessKeyId" },
  accessDenied: { status: 403, code: "AccessDenied" },
  /** `SignatureDoesNotMatch` and `RequestExpired` (bce-sdk-go bce/error.go); their statuses are not documented (403/400 here). */
  badSignature: { status: 403, code: "SignatureDoesNotMatch" },
  expired: { status: 400, code: "RequestExpired" },
  /** The subnet has no free address: `SubnetHasNoMoreIpException` (CCE error.go); status not given (400 here). */
  subnetFull: { status: 400, code: "SubnetHasNoMoreIpException" },
  /** The requested IP is taken: `PrivateIpInUseException` (CCE error.go); status not given (400 here). */
  ipInUse: { status: 400, code: "PrivateIpInUseException" },
  /**
   * A requested IP outside the ENI's subnet. No public source names the code: the
   * fake answers a plain 400 `BadRequest`, so enim must not depend on it (it checks
   * the subnet itself before asking).
   */
  ipNotInSubnet: { status: 400, code: "BadRequest" },
  /**
   * An unknown security group. No source names the code for an ENI call; the fake
   * uses BCE's common `NoSuchObject` (404 "The specified object is not found or
   * resource do not exist"), which BCE's docs list for the same group replacement
   * on service NICs (reference §1.2, "Security-group update").
   */
  noSuchGroup: { status: 404, code: "NoSuchObject" },
  /**
   * Regular and enterprise groups together on one ENI: refused ("bind either
   * regular SGs or enterprise SGs, not both", reference §1.2); no source names the
   * code: 400 `BadRequest` here.
   */
  mixedGroups: { status: 400, code: "BadRequest" },
  /**
   * The instance cannot take more ENIs. No source gives the code; CCE classes
   * `QuotaLimitExceeded` (and any `…LimitExceeded`) as a quota (CCE error.go).
   */
  quota: { status: 400, code: "QuotaLimitExceeded" },
  /**
   * The ENI is in the wrong state for the operation (attach of a non-available ENI,
   * delete of an attached one, an attach of a new ENI that is not ready yet): HTTP 400
   * `EniStatusException` "The eni status is not allowed to operate" (baiducloud-cce-cni-driver
   * branch v2.11, cce-network-v2/pkg/bce/vpceni/node_bcc.go).
   */
  wrongState: { status: 400, code: "EniStatusException" },
  /**
   * An attach of an ENI whose subnet is in another zone than the instance. BCE refuses
   * it (reference §1.2, attach rules); no source names the code: 400 `BadRequest`, so
   * enim checks the zones itself before it asks.
   */
  otherZone: { status: 400, code: "BadRequest" },
  /** An attach or detach while the instance is neither Running nor Stopped; no code known either. */
  instanceState: { status: 400, code: "BadRequest" },
  internal: { status: 500, code: "InternalError" },
} as const;

/**
 * An instance (a node) of the fake. Its `status` takes BCE's values (bce-sdk-go
 * services/bcc/api/model.go InstanceStatus: Running, Starting, Stopping, Stopped,
 * Deleted, Scaling, Expired, Error, …); ENIs attach to and detach from an
 * instance that is Running or Stopped only (BCE ENI docs, reference §1.2).
 */
export interface FakeInstance {
  eniQuota: number;
  cpuCount?: number;
  zoneName?: string;
  status?: string;
}

/** One subnet of the fake VPC. */
export interface FakeSubnet {
  subnetId: string;
  cidr: string;
  /** An IPv6 range: ENIs asking for IPv6 get an address from it. */
  ipv6Cidr?: string;
  zoneName?: string;
}

const FakePrivateIpSchema = z.object({
  privateIpAddress: z.string(),
  primary: z.boolean(),
  publicIpAddress: z.string(),
});

/** An ENI as the fake stores it (the API's JSON shape). */
export const FakeEniSchema = z.object({
  eniId: z.string(),
  name: z.string(),
  description: z.string(),
  zoneName: z.string(),
  instanceId: z.string(),
  macAddress: z.string(),
  vpcId: z.string(),
  subnetId: z.string(),
  status: z.enum(["available", "attaching", "inuse", "detaching"]),
  privateIpSet: z.array(FakePrivateIpSchema),
  ipv6PrivateIpSet: z.array(FakePrivateIpSchema),
  securityGroupIds: z.array(z.string()),
  enterpriseSecurityGroupIds: z.array(z.string()),
  createdTime: z.string(),
  networkInterfaceTrafficMode: z.string(),
});
/** An ENI as the fake stores it. */
export type FakeEni = z.infer<typeof FakeEniSchema>;

/** Which requests a fault applies to (all given fields must match). */
export interface FaultMatch {
  method?: string;
  /** The exact path, or a pattern. */
  path?: string | RegExp;
  /** A bare query flag (`attach`, `detach`). */
  action?: string;
}

/** A fault applied to the next matching request(s). */
export type FakeFault =
  & (
    /** An error answer (a JSON body unless `emptyBody`). */
    | { kind: "status"; status: number; code?: string; message?: string; emptyBody?: boolean }
    /**
     * Throttling. No public source gives BCE's status or code for it; by default an
     * HTTP 429 with an empty body (bce-sdk-go then reports code `TooManyRequests`).
     */
    | {
      kind: "throttle";
      status?: number;
      code?: string;
      message?: string;
      retryAfterSeconds?: number;
    }
    | { kind: "slow"; delayMs: number }
    /** The work is done; the answer never comes (the client times out). */
    | { kind: "lose" }
    | { kind: "skew" }
    /**
     * The next attach (state `attaching`) or detach (state `detaching`) never
     * completes. With `escape: "detach"` a detach request frees it (to `available`);
     * with `"never"` (the default) BCE refuses detach and delete for good.
     */
    | { kind: "stuck"; state: "attaching" | "detaching"; escape?: "detach" | "never" }
    /** The ENI made by the next create answers "not found" to its next `reads` requests. */
    | { kind: "invisible"; reads: number }
    /**
     * The next attach is accepted and goes `attaching`, then falls back to `available`
     * (the cloud gave up). Baidu's older CNI treats `available` after an attach as a failed
     * attach (baiducloud-cce-cni-driver branch cce-network-v1, pkg/eniipam/ipam/bcc/eni.go).
     */
    | { kind: "fallback" }
  )
  & { match?: FaultMatch };

/** Options of {@linkcode FakeBce.start}. */
export interface FakeBceOptions {
  credentials: { accessKeyId: string; secretAccessKey: string; sessionToken?: string }[];
  vpcId?: string;
  subnets?: FakeSubnet[];
  /**
   * Instances: their ENI quota (attached ENIs, primary NIC excluded), CPU count,
   * zone (default `azone`) and status (default `Running`; see {@linkcode FakeBce.setInstanceStatus}).
   */
  instances?: Record<string, FakeInstance>;
  attachDelayMs?: number;
  detachDelayMs?: number;
  /**
   * The regular security groups (`g-…`) that exist in the VPC; absent: every
   * well-formed id exists.
   */
  securityGroups?: string[];
  /** The enterprise security groups (`esg-…`) that exist; absent: every well-formed id. */
  enterpriseSecurityGroups?: string[];
  /** The server's cap on `maxKeys` (small values force pagination). */
  maxKeysCap?: number;
  /**
   * How the list's `name` filter matches (default exact): BCE's semantics are
   * unverified, so a client must work with each, `ignore` (the whole VPC) included.
   */
  nameFilter?: "exact" | "prefix" | "ignore";
  /** Also serve the API on this unix socket (other nodes reach it through a relay). */
  unixSocket?: string;
  region?: string;
  azone?: string;
  /** How long a "lose" fault holds the response back (the client should time out first). */
  loseHoldMs?: number;
  /** Which instance the metadata service describes. */
  metadataInstanceId?: string;
  /**
   * The loopback address and port it listens on (default 127.0.0.1, a free port): another
   * address (127.0.0.3) or port stands for a cloud endpoint of its own.
   */
  hostname?: string;
  port?: number;
  onAttach?(eni: FakeEni): void | Promise<void>;
  onDetach?(eni: FakeEni): void | Promise<void>;
  // ---- Cloud-like behaviours (docs/testing.md, "The fake BCE cloud"): off by default,
  // on in the provider's tests (tests/support/bce_harness.ts CLOUD_LIKE).
  /**
   * A new ENI refuses an attach for this long after its create, with 400
   * `EniStatusException`: Baidu's older CNI waits 5 s after a create "or attach may
   * fail" (branch cce-network-v1, pkg/eniipam/ipam/bcc/eni.go `ENIReadyTimeToAttach`);
   * the current one attaches only in a later pass (cce-network-v2/pkg/bce/bcesync/eni.go).
   * Default 0.
   */
  youngEniRefusesAttachMs?: number;
  /**
   * What an ENI's `instanceId` reads while it is `attaching`: `set` (the default) or
   * `empty` (""). No source says it is set before the attach finishes: Baidu's older
   * CNI and Terraform wait on `status` alone.
   */
  instanceIdWhileAttaching?: "set" | "empty";
  /**
   * How long and how widely a clientToken is remembered. `operation` (the default): per
   * operation and ENI. `global`: one token, whatever the operation or ENI, forever; a
   * token seen before makes any write a no-op that answers as the first one did. BCE
   * documents tokens only as at most 64 ASCII characters (reference §1.4), not their
   * lifetime or scope: `global` is the harshest reading.
   */
  tokenScope?: "operation" | "global";
  /**
   * The server's clock runs this far ahead of the machine's (negative: behind). Every
   * answer carries it in a `Date` header, and a signature is checked against it
   * (`RequestExpired` when off by more than its expiration). The JS SDK corrects its
   * clock from that header (`@baiducloud/sdk` src/bce_base_client.js).
   */
  clockOffsetMs?: number;
}

/** One request the fake received. */
export interface FakeRequestRecord {
  method: string;
  path: string;
  query: Record<string, string>;
  /** The query string exactly as sent. */
  rawQuery: string;
  /** The request headers (lower-case names). */
  headers: Record<string, string>;
  /** The JSON body, when there was one. */
  body?: unknown;
  /** When it arrived (epoch ms). */
  at: number;
  status: number;
  code?: string;
}

type Reply = (status: number, body: unknown, code?: string) => Response;
type Fail = (e: { status: number; code: string }, message: string) => Response;

const BodySchema = z.record(z.string(), z.unknown());
/** A private IP of a create body (reference §1.2, PrivateIp). */
const PrivateIpBodySchema = z.strictObject({
  privateIpAddress: z.string().default(""),
  primary: z.boolean().default(false),
  publicIpAddress: z.string().optional(),
});
/** The create body (reference §1.2, Create). */
const CreateBodySchema = z.strictObject({
  name: z.string().regex(/^[A-Za-z][A-Za-z0-9\-_/.]{0,64}$/),
  subnetId: z.string(),
  securityGroupIds: z.array(z.string()).default([]),
  enterpriseSecurityGroupIds: z.array(z.string()).default([]),
  privateIpSet: z.array(PrivateIpBodySchema).min(1),
  ipv6PrivateIpSet: z.array(PrivateIpBodySchema).optional(),
  description: z.string().default(""),
  /** In the SDK only (reference §1.2); accepted, and ignored as CCE's use suggests. */
  instanceId: z.string().optional(),
});
/** Attach and detach (reference §1.2): the instance, and (attach, newer docs) its type. */
const AttachBodySchema = z.strictObject({
  instanceId: z.string().min(1),
  instanceType: z.enum(["server", "hpas"]).optional(),
});
const DetachBodySchema = z.strictObject({ instanceId: z.string().min(1) });
/** `?bindSg`: the regular groups that replace the ENI's (at least one). */
const BindSgBodySchema = z.strictObject({ securityGroupIds: z.array(z.string()).min(1) });
/** `?bindEsg`: the enterprise groups that replace the ENI's (at least one). */
const BindEsgBodySchema = z.strictObject({
  enterpriseSecurityGroupIds: z.array(z.string()).min(1),
});
/** `?modifyAttribute`: name and description, both optional, not both empty (BCE doc "更新弹性网卡"). */
const ModifyBodySchema = z.strictObject({
  name: z.string().regex(/^[A-Za-z][A-Za-z0-9\-_/.]{0,64}$/).optional(),
  description: z.string().max(200).optional(),
}).refine((b) => (b.name ?? "") !== "" || (b.description ?? "") !== "", {
  message: "name and description cannot both be empty",
});
const SdkAuthorizationSchema = z.string();

/** The fake BCE server. */
export class FakeBce {
  /** The API endpoint (`http://127.0.0.1:<port>`). */
  readonly url: string;
  /** The metadata base URL. */
  readonly metadataUrl: string;
  readonly enis = new Map<string, FakeEni>();
  readonly requests: FakeRequestRecord[] = [];
  /** The highest number of ENIs attached or attaching to each instance at any moment. */
  readonly maxAttached = new Map<string, number>();
  opts:
    & Required<
      Omit<
        FakeBceOptions,
        | "onAttach"
        | "onDetach"
        | "securityGroups"
        | "enterpriseSecurityGroups"
        | "unixSocket"
        | "hostname"
        | "port"
      >
    >
    & FakeBceOptions;

  #server: Deno.HttpServer;
  #unixServer: Deno.HttpServer | null = null;
  #faults: FakeFault[] = [];
  #tokens = new Map<string, string>();
  #timers = new Set<ReturnType<typeof setTimeout>>();
  #hooks = new Set<Promise<void>>();
  #usedIps = new Map<string, Set<string>>();
  #stuck = new Map<string, { state: "attaching" | "detaching"; escape: "detach" | "never" }>();
  #invisible = new Map<string, number>();
  /** When each ENI was created (the fake's clock), for `youngEniRefusesAttachMs`. */
  #createdAt = new Map<string, number>();
  /** ENIs whose current attach falls back to `available` (a `fallback` fault). */
  #fallback = new Set<string>();
  /** Foreign list entries as raw JSON (other tools' ENIs), served after the fake's own. */
  #rawEntries: Record<string, unknown>[] = [];
  #macCounter = 0;
  #closing = new AbortController();

  private constructor(opts: FakeBceOptions) {
    this.opts = {
      vpcId: "vpc-fake0001",
      subnets: [{ subnetId: "sbn-fake0001", cidr: "10.0.1.0/24", zoneName: "cn-bj-a" }],
      instances: { "i-fake0001": { eniQuota: 8 } },
      attachDelayMs: 50,
      detachDelayMs: 50,
      maxKeysCap: 1000,
      nameFilter: "exact",
      region: "bj",
      azone: "cn-bj-a",
      metadataInstanceId: "i-fake0001",
      loseHoldMs: 3000,
      youngEniRefusesAttachMs: 0,
      instanceIdWhileAttaching: "set",
      tokenScope: "operation",
      clockOffsetMs: 0,
      ...opts,
    };
    const hostname = opts.hostname ?? "127.0.0.1";
    this.#server = Deno.serve(
      { hostname, port: opts.port ?? 0, onListen: () => {} },
      (req) => this.#handle(req),
    );
    const addr = this.#server.addr;
    if (addr.transport !== "tcp") throw new Error("The fake BCE server is not on TCP");
    this.url = `http://${hostname}:${addr.port}`;
    this.metadataUrl = `${this.url}/1.0/meta-data/`;
    if (opts.unixSocket) {
      this.#unixServer = Deno.serve(
        { path: opts.unixSocket, onListen: () => {} },
        (req) => this.#handle(req),
      );
    }
  }

  /** Starts a fake on a free loopback port. */
  static start(opts: FakeBceOptions): FakeBce {
    return new FakeBce(opts);
  }

  /** Queues a fault for the next `count` matching API requests. */
  inject(fault: FakeFault, count = 1): void {
    for (let i = 0; i < count; i++) this.#faults.push(fault);
  }

  /** Faults not yet consumed. */
  get pendingFaults(): number {
    return this.#faults.length;
  }

  /**
   * Device hooks (`onAttach`/`onDetach`) queued or running: a status change the API
   * already answers whose device is not plugged or unplugged yet.
   */
  get pendingHooks(): number {
    return this.#hooks.size;
  }

  /** Drops every queued fault. */
  clearFaults(): void {
    this.#faults = [];
  }

  /** ENIs attached or attaching to an instance now. */
  attachedTo(instanceId: string): FakeEni[] {
    return [...this.enis.values()].filter((e) =>
      e.instanceId === instanceId && (e.status === "inuse" || e.status === "attaching")
    );
  }

  /** Adds an ENI directly (foreign ENIs, ERIs, pre-existing state). */
  seedEni(partial: Partial<FakeEni> & { name: string }): FakeEni {
    const subnet = this.opts.subnets[0];
    const eni = this.#newEni(partial.name, subnet.subnetId, undefined, undefined);
    Object.assign(eni, partial);
    this.enis.set(eni.eniId, eni);
    return eni;
  }

  /**
   * Adds a list entry exactly as given (JSON), as another tool's ENI may read: null
   * fields, no `networkInterfaceTrafficMode`, a mode in other case, no `eniId`. Served
   * by the VPC-wide list (any `instanceId` filter matches an entry naming that instance)
   * after the fake's own ENIs; never an ENI of the state machine.
   */
  seedRawListEntry(entry: Record<string, unknown>): void {
    this.#rawEntries.push(entry);
  }

  /** The fake's clock (epoch ms): the machine's, moved by `clockOffsetMs`. */
  now(): number {
    return Date.now() + this.opts.clockOffsetMs;
  }

  /** Someone else detaches an ENI (the console, another tool): its device goes away. */
  detachOutOfBand(eniId: string): void {
    const eni = this.enis.get(eniId);
    if (!eni || eni.status === "available") return;
    this.#stuck.delete(eniId);
    const was = structuredClone(eni);
    eni.status = "available";
    eni.instanceId = "";
    if (was.status === "inuse" && this.opts.onDetach) this.#hook(() => this.opts.onDetach!(was));
  }

  /**
   * Someone else creates an ENI named `name` and attaches it to `instanceId` (the
   * console, another tool): it is `inuse` at once and its device is plugged.
   */
  attachNewOutOfBand(name: string, instanceId: string): FakeEni {
    if (!this.opts.instances[instanceId]) {
      throw new Error(`The fake has no instance "${instanceId}"`);
    }
    const eni = this.seedEni({ name, instanceId, status: "inuse" });
    if (this.opts.onAttach) this.#hook(() => this.opts.onAttach!(structuredClone(eni)));
    return eni;
  }

  /** Someone else detaches and deletes an ENI. */
  deleteOutOfBand(eniId: string): void {
    const eni = this.enis.get(eniId);
    if (!eni) return;
    this.detachOutOfBand(eniId);
    this.#forget(eni);
  }

  /** Lets a stuck ENI finish what it was doing (BCE recovers). */
  unstick(eniId: string): void {
    const s = this.#stuck.get(eniId);
    const eni = this.enis.get(eniId);
    this.#stuck.delete(eniId);
    if (!s || !eni) return;
    if (s.state === "attaching") this.#finishAttach(eni);
    else this.#finishDetach(eni);
  }

  /**
   * Sets an instance's status as BCE would report it (`Stopped` when its node is
   * shut down, `Running` again when it boots). Its ENIs stay attached: BCE keeps
   * an ENI on a stopped instance.
   */
  setInstanceStatus(instanceId: string, status: string): void {
    const inst = this.opts.instances[instanceId];
    if (!inst) throw new Error(`The fake has no instance "${instanceId}"`);
    inst.status = status;
  }

  /**
   * Releases an instance: its detail answers 404 `NoSuchObject` from now on and its
   * ENIs are left `available` (what BCE does with the ENIs of a released instance
   * is UNVERIFIED; detaching them is the one outcome that lets them be used again).
   */
  removeInstance(instanceId: string): void {
    for (const e of [...this.enis.values()]) {
      if (e.instanceId === instanceId) this.detachOutOfBand(e.eniId);
    }
    delete this.opts.instances[instanceId];
  }

  /** Waits for pending state transitions and hooks, then stops the server. */
  async close(): Promise<void> {
    this.#closing.abort();
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    await Promise.allSettled([...this.#hooks]);
    await this.#server.shutdown();
    await this.#unixServer?.shutdown();
  }

  // ---- request handling ----------------------------------------------------

  async #handle(req: Request): Promise<Response> {
    const res = await this.#handleInner(req);
    // Every answer says the server's time (RFC 9110 Date), as HTTP servers do.
    try {
      res.headers.set("date", new Date(this.now()).toUTCString());
    } catch {
      // Immutable headers (none today): the answer goes without a Date.
    }
    return res;
  }

  async #handleInner(req: Request): Promise<Response> {
    const url = new URL(req.url);
    const path = decodeURIComponent(url.pathname);
    if (path.startsWith("/1.0/meta-data/")) {
      return this.#metadata(path.slice("/1.0/meta-data/".length));
    }
    const query = parseQuery(url.search);
    const queryObj = Object.fromEntries(query.map(([k, v]) => [k, v ?? ""]));
    const bodyText = await req.text();
    const record: FakeRequestRecord = {
      method: req.method,
      path,
      query: queryObj,
      rawQuery: url.search.replace(/^\?/, ""),
      headers: Object.fromEntries(req.headers),
      at: Date.now(),
      status: 0,
    };
    this.requests.push(record);
    const reply: Reply = (status, body, code) => {
      record.status = status;
      record.code = code;
      return json(status, body);
    };
    const fail: Fail = (e, message) =>
      reply(e.status, { code: e.code, message, requestId: crypto.randomUUID() }, e.code);

    const authErr = this.#verify(req, path, query);
    if (authErr) return fail(authErr, authErr.message);

    const fault = this.#takeFault(req.method, path, queryObj);
    if (fault?.kind === "status") {
      if (fault.emptyBody) {
        record.status = fault.status;
        return new Response(null, { status: fault.status });
      }
      return fail(
        { status: fault.status, code: fault.code ?? "InternalError" },
        fault.message ?? "Injected failure",
      );
    }
    if (fault?.kind === "throttle") {
      const status = fault.status ?? 429;
      record.status = status;
      record.code = fault.code ?? "(empty body)";
      const headers: Record<string, string> = { "x-bce-request-id": crypto.randomUUID() };
      if (fault.retryAfterSeconds) headers["retry-after"] = String(fault.retryAfterSeconds);
      if (!fault.code && !fault.message) return new Response(null, { status, headers });
      return new Response(
        JSON.stringify({
          code: fault.code ?? "",
          message: fault.message ?? "",
          requestId: headers["x-bce-request-id"],
        }),
        { status, headers: { ...headers, "content-type": "application/json;charset=utf-8" } },
      );
    }
    if (fault?.kind === "skew") return fail(CODES.expired, "Injected: the request has expired");
    if (fault?.kind === "slow") await this.#wait(fault.delayMs);

    let body: Record<string, unknown> = {};
    if (bodyText.trim() !== "") {
      let parsed: unknown;
      try {
        parsed = JSON.parse(bodyText);
      } catch {
        return fail(CODES.malformedJson, "The JSON you provided was not well-formed");
      }
      const r = BodySchema.safeParse(parsed);
      if (!r.success) return fail(CODES.inappropriateJson, "The body must be a JSON object");
      body = r.data;
      record.body = r.data;
    }
    let res: Response;
    try {
      res = this.#route(req.method, path, queryObj, query, body, fault, reply, fail);
    } catch (e) {
      res = fail(CODES.internal, String(e));
    }
    if (fault?.kind === "lose") {
      // The work is done; the answer never reaches the client.
      await this.#wait(this.opts.loseHoldMs);
      return fail(CODES.internal, "Lost response");
    }
    return res;
  }

  #takeFault(method: string, path: string, q: Record<string, string>): FakeFault | undefined {
    const i = this.#faults.findIndex((f) => {
      // Faults that only make sense for one kind of request wait for it.
      if (f.kind === "invisible" && !(method === "POST" && path === "/v1/eni")) return false;
      if (f.kind === "fallback" && !(method === "PUT" && "attach" in q)) return false;
      if (
        f.kind === "stuck" &&
        !(method === "PUT" && (f.state === "attaching" ? "attach" : "detach") in q)
      ) {
        return false;
      }
      const m = f.match;
      if (!m) return true;
      if (m.method && m.method !== method) return false;
      if (m.path !== undefined) {
        if (typeof m.path === "string" ? m.path !== path : !m.path.test(path)) return false;
      }
      if (m.action && !(m.action in q)) return false;
      return true;
    });
    return i < 0 ? undefined : this.#faults.splice(i, 1)[0];
  }

  /** Checks the Authorization with the official SDK's signer; null when it is good. */
  #verify(
    req: Request,
    path: string,
    query: [string, string | null][],
  ): { status: number; code: string; message: string } | null {
    const header = req.headers.get("authorization")?.trim() ?? "";
    const m =
      /^bce-auth-v1\/([^/]+)\/(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\/(\d+)\/([^/]*)\/([0-9a-f]{64})$/
        .exec(header);
    if (!m) return { ...CODES.badAuthHeader, message: "Missing or malformed Authorization" };
    const [, ak, timestamp, expiration, signed] = m;
    const creds = this.opts.credentials.find((c) => c.accessKeyId === ak);
    if (!creds) return { ...CODES.unknownAccessKey, message: "The access key id does not exist" };
    const token = req.headers.get("x-bce-security-token");
    if (creds.sessionToken && token !== creds.sessionToken) {
      return { ...CODES.accessDenied, message: "Invalid session token" };
    }
    const names = signed === "" ? [] : signed.split(";");
    const headers: Record<string, string> = {};
    if (names.length === 0) {
      // An empty list means the server's default set (the SDK's too): host, content-*, x-bce-*.
      for (const [k, v] of req.headers) {
        if (/^(host|content-(length|type|md5)|x-bce-.*)$/.test(k)) headers[k] = v;
      }
    }
    for (const name of names) {
      const v = req.headers.get(name);
      if (v === null) {
        return { ...CODES.badSignature, message: `Signed header "${name}" is missing` };
      }
      headers[name] = v;
    }
    const params: Record<string, string> = {};
    for (const [k, v] of query) params[k] = v ?? "";
    const seconds = Date.parse(timestamp) / 1000;
    const expected = SdkAuthorizationSchema.parse(
      new SdkAuth(creds.accessKeyId, creds.secretAccessKey).generateAuthorization(
        req.method,
        path,
        params,
        headers,
        seconds,
        Number(expiration),
        names.length ? names : undefined,
      ),
    );
    if (expected !== header) {
      return { ...CODES.badSignature, message: "The request signature does not match" };
    }
    if (!Number.isFinite(seconds) || Math.abs(this.now() / 1000 - seconds) > Number(expiration)) {
      return { ...CODES.expired, message: "The request has expired" };
    }
    return null;
  }

  #route(
    method: string,
    path: string,
    q: Record<string, string>,
    pairs: [string, string | null][],
    body: Record<string, unknown>,
    fault: FakeFault | undefined,
    reply: Reply,
    fail: Fail,
  ): Response {
    const token = q.clientToken;
    const tokenKey = (op: string) =>
      token ? (this.opts.tokenScope === "global" ? `any:${token}` : `${op}:${token}`) : null;
    if (path === "/v1/eni" && method === "GET") return this.#list(q, reply, fail);
    if (path === "/v1/eni/quota" && method === "GET") {
      const inst = this.opts.instances[q.instanceId ?? ""];
      if (!inst) return fail(CODES.noSuchObject, `instanceId ${q.instanceId} does not exist`);
      const used = this.attachedTo(q.instanceId).length;
      return reply(200, { totalQuantity: inst.eniQuota, availableQuantity: inst.eniQuota - used });
    }
    const instance = /^\/v2\/instance\/([^/]+)$/.exec(path);
    if (instance && method === "GET") {
      const inst = this.opts.instances[instance[1]];
      if (!inst) return fail(CODES.noSuchObject, `instanceId ${instance[1]} does not exist`);
      return reply(200, {
        instance: {
          id: instance[1],
          status: inst.status ?? "Running",
          zoneName: inst.zoneName ?? this.opts.azone,
          eniQuota: inst.eniQuota,
          cpuCount: inst.cpuCount ?? 4,
        },
      });
    }
    const subnet = /^\/v1\/subnet\/([^/]+)$/.exec(path);
    if (subnet && method === "GET") {
      const s = this.opts.subnets.find((x) => x.subnetId === subnet[1]);
      if (!s) return fail(CODES.noSuchObject, `subnet ${subnet[1]} does not exist`);
      return reply(200, {
        subnet: {
          subnetId: s.subnetId,
          cidr: s.cidr,
          ipv6Cidr: s.ipv6Cidr ?? "",
          zoneName: s.zoneName ?? "",
          vpcId: this.opts.vpcId,
        },
      });
    }
    if (path === "/v1/eni" && method === "POST") {
      const key = tokenKey("create");
      if (key && this.#tokens.has(key)) return reply(200, { eniId: this.#tokens.get(key) });
      const res = this.#create(body, key, reply, fail);
      const id = key ? this.#tokens.get(key) : undefined;
      if (fault?.kind === "invisible" && id) this.#invisible.set(id, fault.reads);
      return res;
    }
    const m = /^\/v1\/eni\/([^/]+?)(\/status)?$/.exec(path);
    if (!m) return fail(CODES.invalidUri, "Could not parse the specified URI.");
    if (!/^eni-[a-z0-9]+$/.test(m[1])) {
      return fail(CODES.eniIdInvalid, "The param eniId is invalid");
    }
    const eniId = m[1];
    const hidden = this.#invisible.get(eniId);
    if (hidden !== undefined) {
      if (hidden <= 1) this.#invisible.delete(eniId);
      else this.#invisible.set(eniId, hidden - 1);
      return fail(CODES.eniNotFound, `eni:${eniId} resource not exist`);
    }
    const eni = this.enis.get(eniId);
    if (method === "DELETE") {
      const key = tokenKey("delete");
      if (key && this.#tokens.has(key)) return reply(200, {});
      if (!eni) return fail(CODES.eniNotFound, `eni:${eniId} resource not exist`);
      if (eni.status !== "available") {
        // Only an available ENI can be deleted (BCE ENI docs, reference §1.2).
        return fail(CODES.wrongState, `The eni ${eni.eniId} status is ${eni.status}`);
      }
      this.#forget(eni);
      if (key) this.#tokens.set(key, eni.eniId);
      return reply(200, {});
    }
    if (!eni) return fail(CODES.eniNotFound, `eni:${eniId} resource not exist`);
    if (method === "GET") {
      return m[2] ? reply(200, { status: eni.status }) : reply(200, this.#view(eni));
    }
    if (method === "PUT") {
      const action = pairs.find(([k, v]) => (v === null || v === "") && k !== "clientToken")?.[0];
      if (action === "bindSg" || action === "bindEsg" || action === "modifyAttribute") {
        return this.#update(eni, action, body, tokenKey(`${action}:${eni.eniId}`), reply, fail);
      }
      const parsed = (action === "attach" ? AttachBodySchema : DetachBodySchema).safeParse(body);
      if (!parsed.success) {
        return fail(CODES.inappropriateJson, `Invalid ${action} body: ${parsed.error.message}`);
      }
      const instanceId = parsed.data.instanceId;
      if (action === "attach") {
        const key = tokenKey(`attach:${eni.eniId}`);
        if (key && this.#tokens.has(key)) return reply(200, {});
        const inst = this.opts.instances[instanceId];
        if (!inst) return fail(CODES.noSuchObject, `instanceId ${instanceId} does not exist`);
        const refused = this.#instanceRefuses(instanceId, inst, fail);
        if (refused) return refused;
        if (eni.status !== "available") {
          return fail(CODES.wrongState, `The eni ${eni.eniId} status is ${eni.status}`);
        }
        const age = this.now() - (this.#createdAt.get(eni.eniId) ?? -Infinity);
        if (age < this.opts.youngEniRefusesAttachMs) {
          // A fault for the attach waits for the attach that is accepted.
          if (fault?.kind === "stuck" || fault?.kind === "fallback") this.#faults.unshift(fault);
          return fail(CODES.wrongState, "The eni status is not allowed to operate");
        }
        // "The ENI and the instance must be in the same VPC, and their subnets in the
        // same availability zone" (BCE attach docs, reference §1.2).
        const instanceZone = inst.zoneName ?? this.opts.azone;
        if (eni.zoneName !== instanceZone) {
          return fail(
            CODES.otherZone,
            `The eni ${eni.eniId} is in zone ${eni.zoneName}, the instance ${instanceId} in zone ${instanceZone}`,
          );
        }
        if (this.attachedTo(instanceId).length >= inst.eniQuota) {
          return fail(CODES.quota, `Instance ${instanceId} cannot attach more enis`);
        }
        eni.status = "attaching";
        eni.instanceId = instanceId;
        const n = this.attachedTo(instanceId).length;
        this.maxAttached.set(instanceId, Math.max(this.maxAttached.get(instanceId) ?? 0, n));
        if (key) this.#tokens.set(key, eni.eniId);
        if (fault?.kind === "stuck" && fault.state === "attaching") {
          this.#stuck.set(eni.eniId, { state: "attaching", escape: fault.escape ?? "never" });
          return reply(200, {});
        }
        if (fault?.kind === "fallback") this.#fallback.add(eni.eniId);
        this.#later(this.opts.attachDelayMs, () => {
          if (eni.status !== "attaching" || this.#stuck.has(eni.eniId)) return;
          if (this.#fallback.delete(eni.eniId)) this.#finishDetach(eni);
          else this.#finishAttach(eni);
        });
        return reply(200, {});
      }
      if (action === "detach") {
        const key = tokenKey(`detach:${eni.eniId}`);
        if (key && this.#tokens.has(key)) return reply(200, {});
        const inst = this.opts.instances[instanceId];
        if (!inst) return fail(CODES.noSuchObject, `instanceId ${instanceId} does not exist`);
        const refused = this.#instanceRefuses(instanceId, inst, fail);
        if (refused) return refused;
        const stuck = this.#stuck.get(eni.eniId);
        if (stuck) {
          if (stuck.escape !== "detach") {
            return fail(CODES.wrongState, `The eni ${eni.eniId} status is ${eni.status}`);
          }
          this.#stuck.delete(eni.eniId);
          eni.status = "detaching";
          if (key) this.#tokens.set(key, eni.eniId);
          this.#later(this.opts.detachDelayMs, () => {
            if (eni.status === "detaching") this.#finishDetach(eni);
          });
          return reply(200, {});
        }
        if (eni.status !== "inuse" || eni.instanceId !== instanceId) {
          return fail(
            CODES.wrongState,
            `The eni ${eni.eniId} status is ${eni.status} on "${eni.instanceId}"`,
          );
        }
        eni.status = "detaching";
        if (key) this.#tokens.set(key, eni.eniId);
        if (this.opts.onDetach) this.#hook(() => this.opts.onDetach!(structuredClone(eni)));
        if (fault?.kind === "stuck" && fault.state === "detaching") {
          this.#stuck.set(eni.eniId, { state: "detaching", escape: fault.escape ?? "never" });
          return reply(200, {});
        }
        this.#later(this.opts.detachDelayMs, () => {
          if (eni.status === "detaching" && !this.#stuck.has(eni.eniId)) this.#finishDetach(eni);
        });
        return reply(200, {});
      }
      return fail(CODES.invalidUri, `Unknown action "${action}"`);
    }
    return fail(CODES.invalidUri, `Method ${method} not allowed here`);
  }

  /** Attach and detach need the instance Running or Stopped (BCE ENI docs, reference §1.2). */
  #instanceRefuses(instanceId: string, inst: FakeInstance, fail: Fail): Response | null {
    const status = inst.status ?? "Running";
    if (status === "Running" || status === "Stopped") return null;
    return fail(CODES.instanceState, `The instance ${instanceId} is ${status}`);
  }

  #finishAttach(eni: FakeEni): void {
    eni.status = "inuse";
    if (this.opts.onAttach) this.#hook(() => this.opts.onAttach!(structuredClone(eni)));
  }

  #finishDetach(eni: FakeEni): void {
    eni.status = "available";
    eni.instanceId = "";
  }

  /** An ENI as the API shows it (`instanceIdWhileAttaching: "empty"` blanks it while attaching). */
  #view(eni: FakeEni): FakeEni {
    const v = structuredClone(eni);
    if (v.status === "attaching" && this.opts.instanceIdWhileAttaching === "empty") {
      v.instanceId = "";
    }
    return v;
  }

  #forget(eni: FakeEni): void {
    this.enis.delete(eni.eniId);
    this.#stuck.delete(eni.eniId);
    for (const ip of [...eni.privateIpSet, ...eni.ipv6PrivateIpSet]) {
      this.#usedIps.get(eni.subnetId)?.delete(ip.privateIpAddress);
    }
  }

  #list(q: Record<string, string>, reply: Reply, fail: Fail): Response {
    if (!q.vpcId) return fail(CODES.inappropriateJson, "vpcId is required");
    const maxKeys = Math.min(Number(q.maxKeys ?? 1000) || 1000, this.opts.maxKeysCap);
    const ips = q.privateIpAddress ? q.privateIpAddress.split(",") : [];
    const nameOk = (n: string) =>
      !q.name || this.opts.nameFilter === "ignore" ||
      (this.opts.nameFilter === "prefix" ? n.startsWith(q.name) : n === q.name);
    const all = [...this.enis.values()]
      .filter((e) => e.vpcId === q.vpcId)
      .filter((e) => !q.instanceId || this.#view(e).instanceId === q.instanceId)
      .filter((e) => nameOk(e.name))
      .filter((e) => !ips.length || e.privateIpSet.some((p) => ips.includes(p.privateIpAddress)))
      .sort((a, b) => (a.eniId < b.eniId ? -1 : 1));
    const start = q.marker ? all.findIndex((e) => e.eniId >= q.marker) : 0;
    const from = start < 0 ? all.length : start;
    const raw = this.#rawEntries.filter((r) => !q.instanceId || r.instanceId === q.instanceId);
    const page = [...all.slice(from, from + maxKeys).map((e) => this.#view(e))];
    const truncated = from + maxKeys < all.length;
    // Foreign raw entries ride on the last page (they have no id to page by).
    if (!truncated) page.push(...raw.map((r) => structuredClone(r) as FakeEni));
    return reply(200, {
      enis: page,
      ...(page.length ? { marker: q.marker ?? page[0].eniId } : {}),
      isTruncated: truncated,
      ...(truncated ? { nextMarker: all[from + maxKeys].eniId } : {}),
      maxKeys,
    });
  }

  #create(body: Record<string, unknown>, key: string | null, reply: Reply, fail: Fail): Response {
    const parsed = CreateBodySchema.safeParse(body);
    if (!parsed.success) {
      return fail(CODES.inappropriateJson, `Invalid create body: ${parsed.error.message}`);
    }
    const b = parsed.data;
    const subnet = this.opts.subnets.find((s) => s.subnetId === b.subnetId);
    if (!subnet) return fail(CODES.noSuchObject, `subnet ${b.subnetId} does not exist`);
    const groupsErr = this.#checkGroups(b.securityGroupIds, b.enterpriseSecurityGroupIds, fail);
    if (groupsErr) return groupsErr;
    // Exactly one IPv4 entry is primary, the others secondary; IPv6 ones are all
    // secondary (reference §1.2, PrivateIp). The fake makes the primary only.
    const primaries = b.privateIpSet.filter((p) => p.primary);
    if (primaries.length !== 1) {
      return fail(CODES.inappropriateJson, "Exactly one entry of privateIpSet must be primary");
    }
    if (b.ipv6PrivateIpSet?.some((p) => p.primary)) {
      return fail(CODES.inappropriateJson, "IPv6 private IPs must not be primary");
    }
    const used = this.#used(subnet.subnetId);
    const pick = (wanted: string, cidr: string, family: string): string | Response => {
      if (wanted) {
        if (!inCidr(wanted, cidr)) {
          return fail(
            CODES.ipNotInSubnet,
            `The ${family} ${wanted} is not in subnet ${subnet.subnetId} (${cidr})`,
          );
        }
        if (used.has(wanted) || wanted === firstHostOf(cidr)) {
          return fail(CODES.ipInUse, `The ip ${wanted} is in use`);
        }
        return wanted;
      }
      const free = freeIp(cidr, used);
      if (!free) return fail(CODES.subnetFull, `Subnet ${subnet.subnetId} has no more ip`);
      return free;
    };
    const ip = pick(primaries[0].privateIpAddress, subnet.cidr, "ip");
    if (ip instanceof Response) return ip;
    let ip6: string | undefined;
    if (b.ipv6PrivateIpSet?.length) {
      // IPv6 needs the subnet to have an IPv6 range (reference §1.2).
      if (!subnet.ipv6Cidr) {
        return fail(CODES.inappropriateJson, `Subnet ${subnet.subnetId} has no ipv6 cidr`);
      }
      const got = pick(b.ipv6PrivateIpSet[0].privateIpAddress, subnet.ipv6Cidr, "ipv6 address");
      if (got instanceof Response) return got;
      ip6 = got;
    }
    used.add(ip);
    if (ip6) used.add(ip6);
    const eni = this.#newEni(b.name, subnet.subnetId, ip, ip6);
    eni.description = b.description;
    eni.securityGroupIds = b.securityGroupIds;
    eni.enterpriseSecurityGroupIds = b.enterpriseSecurityGroupIds;
    this.enis.set(eni.eniId, eni);
    this.#createdAt.set(eni.eniId, this.now());
    if (key) this.#tokens.set(key, eni.eniId);
    return reply(200, { eniId: eni.eniId });
  }

  /** Refuses unknown groups, a group of the wrong kind, and both kinds together. */
  #checkGroups(regular: string[], enterprise: string[], fail: Fail): Response | null {
    if (regular.length > 0 && enterprise.length > 0) {
      return fail(
        CODES.mixedGroups,
        "An eni binds either securityGroupIds or enterpriseSecurityGroupIds, not both",
      );
    }
    const known = (id: string, kind: "g" | "esg") => {
      const list = kind === "g" ? this.opts.securityGroups : this.opts.enterpriseSecurityGroups;
      const form = kind === "g" ? /^g-[A-Za-z0-9]+$/ : /^esg-[A-Za-z0-9]+$/;
      return form.test(id) && (list === undefined || list.includes(id));
    };
    for (
      const [ids, kind, what] of [
        [regular, "g", "security group"],
        [enterprise, "esg", "enterprise security group"],
      ] as const
    ) {
      const bad = ids.find((id) => !known(id, kind));
      if (bad !== undefined) return fail(CODES.noSuchGroup, `The ${what} ${bad} does not exist`);
    }
    return null;
  }

  /** `?bindSg`, `?bindEsg` (replace every group) and `?modifyAttribute` (name, description). */
  #update(
    eni: FakeEni,
    action: "bindSg" | "bindEsg" | "modifyAttribute",
    body: Record<string, unknown>,
    key: string | null,
    reply: Reply,
    fail: Fail,
  ): Response {
    if (key && this.#tokens.has(key)) return reply(200, {});
    if (action === "modifyAttribute") {
      const parsed = ModifyBodySchema.safeParse(body);
      if (!parsed.success) {
        return fail(
          CODES.inappropriateJson,
          `Invalid modifyAttribute body: ${parsed.error.message}`,
        );
      }
      if (parsed.data.name) eni.name = parsed.data.name;
      if (parsed.data.description !== undefined) eni.description = parsed.data.description;
    } else {
      const parsed = action === "bindSg"
        ? BindSgBodySchema.safeParse(body)
        : BindEsgBodySchema.safeParse(body);
      if (!parsed.success) {
        return fail(CODES.inappropriateJson, `Invalid ${action} body: ${parsed.error.message}`);
      }
      const regular = "securityGroupIds" in parsed.data ? parsed.data.securityGroupIds : [];
      const enterprise = "enterpriseSecurityGroupIds" in parsed.data
        ? parsed.data.enterpriseSecurityGroupIds
        : [];
      const err = this.#checkGroups(regular, enterprise, fail);
      if (err) return err;
      // Both replace every group the ENI had, of either kind (BCE docs).
      eni.securityGroupIds = [...regular];
      eni.enterpriseSecurityGroupIds = [...enterprise];
    }
    if (key) this.#tokens.set(key, eni.eniId);
    return reply(200, {});
  }

  #metadata(path: string): Response {
    const text = (s: string) =>
      new Response(s + "\n", { headers: { "content-type": "text/html" } });
    const p = path.replace(/\/$/, "");
    switch (p) {
      case "instance-shortid":
        return text(this.opts.metadataInstanceId);
      case "region":
        return text(this.opts.region);
      case "azone":
        return text(this.opts.azone);
      case "vpc-id":
        return text(this.opts.vpcId);
      case "subnet-id":
        return text(this.opts.subnets[0].subnetId);
      case "network/interfaces/macs": {
        const macs = [
          "fa:f6:ff:ff:ff:01",
          ...this.attachedTo(this.opts.metadataInstanceId).map((e) => e.macAddress),
        ];
        return text(macs.map((m) => m + "/").join("\n"));
      }
      case "not-implemented":
        return text("");
    }
    return new Response("Not Found", { status: 404 });
  }

  // ---- helpers ---------------------------------------------------------------

  #newEni(name: string, subnetId: string, ip?: string, ip6?: string): FakeEni {
    const n = ++this.#macCounter;
    const hex = (v: number) => v.toString(16).padStart(2, "0");
    const addr = (a: string, primary: boolean) => ({
      privateIpAddress: a,
      primary,
      publicIpAddress: "",
    });
    return {
      eniId: "eni-" + randomId(12),
      name,
      description: "",
      zoneName: this.opts.subnets.find((s) => s.subnetId === subnetId)?.zoneName ??
        this.opts.azone,
      instanceId: "",
      macAddress: `fa:f6:${hex((n >> 24) & 255)}:${hex((n >> 16) & 255)}:${hex((n >> 8) & 255)}:${
        hex(n & 255)
      }`,
      vpcId: this.opts.vpcId,
      subnetId,
      status: "available",
      privateIpSet: ip ? [addr(ip, true)] : [],
      ipv6PrivateIpSet: ip6 ? [addr(ip6, false)] : [],
      securityGroupIds: [],
      enterpriseSecurityGroupIds: [],
      createdTime: new Date().toISOString().replace(/\.\d{3}Z$/, "Z"),
      networkInterfaceTrafficMode: "standard",
    };
  }

  #used(subnetId: string): Set<string> {
    let s = this.#usedIps.get(subnetId);
    if (!s) this.#usedIps.set(subnetId, s = new Set());
    return s;
  }

  #later(ms: number, fn: () => void): void {
    const t = setTimeout(() => {
      this.#timers.delete(t);
      fn();
    }, ms);
    this.#timers.add(t);
  }

  #hook(fn: () => void | Promise<void>): void {
    const p = (async () => {
      try {
        await fn();
      } catch {
        // A failing test hook must not break the fake.
      }
    })();
    this.#hooks.add(p);
    p.finally(() => this.#hooks.delete(p));
  }

  #wait(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        this.#closing.signal.removeEventListener("abort", done);
        resolve();
      };
      const t = setTimeout(done, ms);
      this.#closing.signal.addEventListener("abort", done, { once: true });
    });
  }
}

/**
 * A fake ENI in the provider contract's shape (free, no owner), for wiring the
 * fake's `onAttach`/`onDetach` hooks to a `DeviceSimulator`:
 * `onAttach: (e) => sim.plug(toContractEni(fake.opts.subnets, e))`.
 */
export function toContractEni(subnets: FakeSubnet[], eni: FakeEni): Eni {
  const subnet = subnets.find((s) => s.subnetId === eni.subnetId);
  const addr = (set: FakeEni["privateIpSet"], cidr: string | undefined) => {
    const ip = set.find((p) => p.primary) ?? set[0];
    if (!ip || !cidr) return null;
    return {
      address: ip.privateIpAddress,
      prefixLength: cidrOf(cidr).prefix,
      gateway: firstHostOf(cidr),
    };
  };
  return makeEni({
    id: eni.eniId,
    mac: eni.macAddress,
    ipv4: addr(eni.privateIpSet, subnet?.cidr),
    ipv6: addr(eni.ipv6PrivateIpSet, subnet?.ipv6Cidr),
    subnetId: eni.subnetId,
    state: "free",
    owner: null,
  });
}

function json(status: number, body: unknown): Response {
  const rid = z.object({ requestId: z.string() }).safeParse(body);
  return new Response(JSON.stringify(body), {
    status,
    headers: {
      "content-type": "application/json;charset=utf-8",
      "x-bce-request-id": rid.success ? rid.data.requestId : crypto.randomUUID(),
    },
  });
}

/** Splits a raw query string into decoded pairs; a bare key gets `null`. */
function parseQuery(search: string): [string, string | null][] {
  const s = search.replace(/^\?/, "");
  if (s === "") return [];
  return s.split("&").filter((p) => p !== "").map((p) => {
    const i = p.indexOf("=");
    return i < 0
      ? [decodeURIComponent(p), null]
      : [decodeURIComponent(p.slice(0, i)), decodeURIComponent(p.slice(i + 1))];
  });
}

function randomId(n: number): string {
  const abc = "abcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = crypto.getRandomValues(new Uint8Array(n));
  return [...bytes].map((b) => abc[b % abc.length]).join("");
}

function cidrOf(cidr: string): Cidr {
  const c = parseCidr(cidr);
  if (!c) throw new RangeError(`"${cidr}" is not a prefix`);
  return c;
}

function inCidr(ip: string, cidr: string): boolean {
  const c = parseCidr(cidr), a = parseIp(ip);
  return c !== null && a !== null && contains(c, a);
}

/** The first host of a CIDR (the subnet's gateway). */
function firstHostOf(cidr: string): string {
  return formatIp(nthAddress(cidrOf(cidr), 1));
}

/** The lowest free host of a CIDR, skipping the network address, the first host (gateway) and (IPv4) broadcast. */
function freeIp(cidr: string, used: Set<string>): string | null {
  const c = cidrOf(cidr);
  const limit = Math.min(prefixSize(c), 2 ** 20) - (c.ip.family === 4 ? 1 : 0);
  for (let i = 2; i < limit; i++) {
    const ip = formatIp(nthAddress(c, i));
    if (!used.has(ip)) return ip;
  }
  return null;
}
