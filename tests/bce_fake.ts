/**
 * A fake BCE ENI API (and metadata service) on 127.0.0.1 for tests.
 *
 * - verifies every API request's `bce-auth-v1` signature with the same
 *   algorithm, recomputed from the signedHeaders of the Authorization header
 *   (unknown AK or bad signature → 403 `{code, message, requestId}` as BCE);
 * - implements the ENI state machine (available → attaching → inuse →
 *   detaching → available; delete only when available) with asynchronous
 *   attach/detach delays, per-instance ENI quotas, list pagination (maxKeys,
 *   marker/nextMarker), clientToken idempotency on every write;
 * - injects faults on demand: 5xx, throttling (`…RateLimit…` code), slow
 *   responses, and lost responses (the work is done, the answer never comes);
 * - serves metadata under `/1.0/meta-data/`;
 * - calls `onAttach(eni)` / `onDetach(eni)` so a test can plug a device.
 *
 * @module
 */
import ipaddr from "ipaddr.js";
import type { Eni } from "../providers/contract.ts";
import {
  type Credentials,
  parseAuthorization,
  type QueryPair,
  sign,
} from "../providers/bce/signer.ts";

/** One subnet of the fake VPC. */
export interface FakeSubnet {
  subnetId: string;
  cidr: string;
  zoneName?: string;
}

/** An ENI as the fake stores it (the API's JSON shape). */
export interface FakeEni {
  eniId: string;
  name: string;
  description: string;
  zoneName: string;
  instanceId: string;
  macAddress: string;
  vpcId: string;
  subnetId: string;
  status: "available" | "attaching" | "inuse" | "detaching";
  privateIpSet: { privateIpAddress: string; primary: boolean; publicIpAddress: string }[];
  ipv6PrivateIpSet: { privateIpAddress: string; primary: boolean; publicIpAddress: string }[];
  securityGroupIds: string[];
  enterpriseSecurityGroupIds: string[];
  createdTime: string;
  networkInterfaceTrafficMode: string;
}

/** A fault applied to the next matching requests. */
export type FakeFault =
  | { kind: "status"; status: number; code?: string }
  | { kind: "throttle" }
  | { kind: "slow"; delayMs: number }
  | { kind: "lose" }
  | { kind: "skew" };

/** Options of {@linkcode FakeBce.start}. */
export interface FakeBceOptions {
  credentials: Credentials[];
  vpcId?: string;
  subnets?: FakeSubnet[];
  /** Instances and their ENI quota (attached ENIs, primary NIC excluded). */
  instances?: Record<string, { eniQuota: number }>;
  attachDelayMs?: number;
  detachDelayMs?: number;
  /** The server's cap on `maxKeys` (small values force pagination). */
  maxKeysCap?: number;
  region?: string;
  azone?: string;
  /** How long a "lose" fault holds the response back (the client should time out first). */
  loseHoldMs?: number;
  /** Which instance the metadata service describes. */
  metadataInstanceId?: string;
  onAttach?(eni: FakeEni): void | Promise<void>;
  onDetach?(eni: FakeEni): void | Promise<void>;
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
  status: number;
  code?: string;
}

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
  /** Set `(method, path) => boolean` to restrict which requests faults hit. */
  faultFilter: ((method: string, path: string) => boolean) | null = null;
  opts: Required<Omit<FakeBceOptions, "onAttach" | "onDetach">> & FakeBceOptions;

  #server: Deno.HttpServer;
  #faults: FakeFault[] = [];
  #tokens = new Map<string, string>();
  #timers = new Set<ReturnType<typeof setTimeout>>();
  #hooks = new Set<Promise<void>>();
  #usedIps = new Map<string, Set<string>>();
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
      region: "bj",
      azone: "cn-bj-a",
      metadataInstanceId: "i-fake0001",
      loseHoldMs: 3000,
      ...opts,
    };
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (req) => this.#handle(req),
    );
    const addr = this.#server.addr as Deno.NetAddr;
    this.url = `http://127.0.0.1:${addr.port}`;
    this.metadataUrl = `${this.url}/1.0/meta-data/`;
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

  /** ENIs attached or attaching to an instance now. */
  attachedTo(instanceId: string): FakeEni[] {
    return [...this.enis.values()].filter((e) =>
      e.instanceId === instanceId && (e.status === "inuse" || e.status === "attaching")
    );
  }

  /** Adds an ENI directly (foreign ENIs, ERIs, pre-existing state). */
  seedEni(partial: Partial<FakeEni> & { name: string }): FakeEni {
    const eni = this.#newEni(partial.name, this.opts.subnets[0].subnetId, undefined);
    Object.assign(eni, partial);
    this.enis.set(eni.eniId, eni);
    return eni;
  }

  /** Waits for pending state transitions and hooks, then stops the server. */
  async close(): Promise<void> {
    this.#closing.abort();
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    await Promise.allSettled([...this.#hooks]);
    await this.#server.shutdown();
  }

  // ---- request handling ----------------------------------------------------

  async #handle(req: Request): Promise<Response> {
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
      status: 0,
    };
    this.requests.push(record);
    const reply = (status: number, body: unknown, code?: string) => {
      record.status = status;
      record.code = code;
      return json(status, body);
    };
    const fail = (status: number, code: string, message: string) =>
      reply(status, { code, message, requestId: crypto.randomUUID() }, code);

    const authErr = this.#verify(req, path, query);
    if (authErr) return fail(authErr.status, authErr.code, authErr.message);

    let fault: FakeFault | undefined;
    if (this.#faults.length && (!this.faultFilter || this.faultFilter(req.method, path))) {
      fault = this.#faults.shift();
    }
    if (fault?.kind === "status") {
      return fail(fault.status, fault.code ?? "InternalError", "Injected failure");
    }
    if (fault?.kind === "throttle") {
      return fail(400, "RequestRateLimitExceeded", "Request was denied due to RateLimit");
    }
    if (fault?.kind === "skew") {
      return fail(400, "RequestExpired", "Injected: the request has expired");
    }
    if (fault?.kind === "slow") await this.#wait(fault.delayMs);

    let body: Record<string, unknown> = {};
    if (bodyText.trim() !== "") {
      try {
        body = JSON.parse(bodyText);
      } catch {
        return fail(400, "MalformedJSON", "The body is not JSON");
      }
    }
    let res: Response;
    try {
      res = this.#route(req.method, path, queryObj, query, body, reply, fail);
    } catch (e) {
      res = fail(500, "InternalError", String(e));
    }
    if (fault?.kind === "lose") {
      // The work is done; the answer never reaches the client.
      await this.#wait(this.opts.loseHoldMs);
      return fail(500, "InternalError", "Lost response");
    }
    return res;
  }

  #verify(
    req: Request,
    path: string,
    query: QueryPair[],
  ): { status: number; code: string; message: string } | null {
    const header = req.headers.get("authorization");
    const parsed = header ? parseAuthorization(header) : null;
    if (!parsed) {
      return {
        status: 400,
        code: "InvalidHTTPAuthHeader",
        message: "Missing or malformed Authorization",
      };
    }
    const creds = this.opts.credentials.find((c) => c.accessKeyId === parsed.accessKeyId);
    if (!creds) {
      return {
        status: 403,
        code: "InvalidAccessKeyId",
        message: "The access key id does not exist",
      };
    }
    const token = req.headers.get("x-bce-security-token");
    if (creds.sessionToken && token !== creds.sessionToken) {
      return { status: 403, code: "AccessDenied", message: "Invalid session token" };
    }
    const headers: Record<string, string> = {};
    for (const name of parsed.signedHeaders) {
      const v = req.headers.get(name);
      if (v === null) {
        return {
          status: 403,
          code: "SignatureDoesNotMatch",
          message: `Signed header "${name}" is missing`,
        };
      }
      headers[name] = v;
    }
    const expected = sign({
      method: req.method,
      path,
      query,
      headers,
      accessKeyId: creds.accessKeyId,
      secretAccessKey: creds.secretAccessKey,
      timestamp: parsed.timestamp,
      expirationSeconds: parsed.expirationSeconds,
      headersToSign: parsed.signedHeaders.length ? parsed.signedHeaders : undefined,
    });
    if (expected.signature !== parsed.signature) {
      return {
        status: 403,
        code: "SignatureDoesNotMatch",
        message: "The request signature does not match",
      };
    }
    const ts = Date.parse(parsed.timestamp);
    if (!Number.isFinite(ts) || Math.abs(Date.now() - ts) > parsed.expirationSeconds * 1000) {
      return { status: 400, code: "RequestExpired", message: "The request has expired" };
    }
    return null;
  }

  #route(
    method: string,
    path: string,
    q: Record<string, string>,
    pairs: QueryPair[],
    body: Record<string, unknown>,
    reply: (status: number, body: unknown, code?: string) => Response,
    fail: (status: number, code: string, message: string) => Response,
  ): Response {
    const token = q.clientToken;
    const tokenKey = (op: string) => (token ? `${op}:${token}` : null);
    if (path === "/v1/eni" && method === "GET") return this.#list(q, reply, fail);
    if (path === "/v1/eni/quota" && method === "GET") {
      const inst = this.opts.instances[q.instanceId ?? ""];
      if (!inst) return fail(404, "NoSuchObject", `Instance "${q.instanceId}" not found`);
      const used = this.attachedTo(q.instanceId).length;
      return reply(200, { totalQuantity: inst.eniQuota, availableQuantity: inst.eniQuota - used });
    }
    const subnet = /^\/v1\/subnet\/([^/]+)$/.exec(path);
    if (subnet && method === "GET") {
      const s = this.opts.subnets.find((x) => x.subnetId === subnet[1]);
      if (!s) return fail(404, "NoSuchObject", "Subnet not found");
      return reply(200, {
        subnet: {
          subnetId: s.subnetId,
          cidr: s.cidr,
          zoneName: s.zoneName ?? "",
          vpcId: this.opts.vpcId,
        },
      });
    }
    if (path === "/v1/eni" && method === "POST") {
      const key = tokenKey("create");
      if (key && this.#tokens.has(key)) return reply(200, { eniId: this.#tokens.get(key) });
      return this.#create(body, key, reply, fail);
    }
    const m = /^\/v1\/eni\/(eni-[a-z0-9]+)(\/status)?$/.exec(path);
    if (!m) return fail(404, "InvalidURI", `No route for ${method} ${path}`);
    const eni = this.enis.get(m[1]);
    if (method === "DELETE") {
      const key = tokenKey("delete");
      if (key && this.#tokens.has(key)) return reply(200, {});
      if (!eni) return fail(404, "EniNotFoundException", `eni:${m[1]} resource not exist`);
      if (eni.status !== "available") {
        return fail(
          400,
          "EniStatusException",
          `ENI "${eni.eniId}" is ${eni.status}, not available`,
        );
      }
      this.enis.delete(eni.eniId);
      for (const ip of eni.privateIpSet) {
        this.#usedIps.get(eni.subnetId)?.delete(ip.privateIpAddress);
      }
      if (key) this.#tokens.set(key, eni.eniId);
      return reply(200, {});
    }
    if (!eni) return fail(404, "EniNotFoundException", `eni:${m[1]} resource not exist`);
    if (method === "GET") {
      return m[2] ? reply(200, { status: eni.status }) : reply(200, structuredClone(eni));
    }
    if (method === "PUT") {
      const action = pairs.find(([k, v]) => (v === null || v === "") && k !== "clientToken")?.[0];
      const instanceId = String(body.instanceId ?? "");
      if (action === "attach") {
        const key = tokenKey(`attach:${eni.eniId}`);
        if (key && this.#tokens.has(key)) return reply(200, {});
        const inst = this.opts.instances[instanceId];
        if (!inst) return fail(404, "NoSuchObject", `Instance "${instanceId}" not found`);
        if (eni.status !== "available") {
          return fail(
            400,
            "EniStatusException",
            `ENI "${eni.eniId}" is ${eni.status}, not available`,
          );
        }
        if (this.attachedTo(instanceId).length >= inst.eniQuota) {
          return fail(
            400,
            "EniQuotaLimitExceeded",
            `Instance "${instanceId}" cannot attach more ENIs`,
          );
        }
        eni.status = "attaching";
        eni.instanceId = instanceId;
        const n = this.attachedTo(instanceId).length;
        this.maxAttached.set(instanceId, Math.max(this.maxAttached.get(instanceId) ?? 0, n));
        if (key) this.#tokens.set(key, eni.eniId);
        this.#later(this.opts.attachDelayMs, () => {
          if (eni.status !== "attaching") return;
          eni.status = "inuse";
          if (this.opts.onAttach) this.#hook(() => this.opts.onAttach!(structuredClone(eni)));
        });
        return reply(200, {});
      }
      if (action === "detach") {
        const key = tokenKey(`detach:${eni.eniId}`);
        if (key && this.#tokens.has(key)) return reply(200, {});
        if (eni.status !== "inuse" || eni.instanceId !== instanceId) {
          return fail(
            400,
            "EniStatusException",
            `ENI "${eni.eniId}" is ${eni.status} on "${eni.instanceId}"`,
          );
        }
        eni.status = "detaching";
        if (key) this.#tokens.set(key, eni.eniId);
        if (this.opts.onDetach) this.#hook(() => this.opts.onDetach!(structuredClone(eni)));
        this.#later(this.opts.detachDelayMs, () => {
          if (eni.status !== "detaching") return;
          eni.status = "available";
          eni.instanceId = "";
        });
        return reply(200, {});
      }
      return fail(400, "InvalidHTTPRequest", `Unknown action "${action}"`);
    }
    return fail(405, "InvalidHTTPRequest", `Method ${method} not allowed`);
  }

  #list(
    q: Record<string, string>,
    reply: (status: number, body: unknown) => Response,
    fail: (status: number, code: string, message: string) => Response,
  ): Response {
    if (!q.vpcId) return fail(400, "InvalidHTTPRequest", "vpcId is required");
    const maxKeys = Math.min(Number(q.maxKeys ?? 1000) || 1000, this.opts.maxKeysCap);
    const ips = q.privateIpAddress ? q.privateIpAddress.split(",") : [];
    const all = [...this.enis.values()]
      .filter((e) => e.vpcId === q.vpcId)
      .filter((e) => !q.instanceId || e.instanceId === q.instanceId)
      // Fuzzy, like the inferred server behaviour: the client must filter by prefix itself.
      .filter((e) => !q.name || e.name.includes(q.name.replace(/\/$/, "")))
      .filter((e) => !ips.length || e.privateIpSet.some((p) => ips.includes(p.privateIpAddress)))
      .sort((a, b) => (a.eniId < b.eniId ? -1 : 1));
    const start = q.marker ? all.findIndex((e) => e.eniId >= q.marker) : 0;
    const from = start < 0 ? all.length : start;
    const page = all.slice(from, from + maxKeys);
    const truncated = from + maxKeys < all.length;
    return reply(200, {
      enis: page.map((e) => structuredClone(e)),
      ...(page.length ? { marker: q.marker ?? page[0].eniId } : {}),
      isTruncated: truncated,
      ...(truncated ? { nextMarker: all[from + maxKeys].eniId } : {}),
      maxKeys,
    });
  }

  #create(
    body: Record<string, unknown>,
    key: string | null,
    reply: (status: number, body: unknown) => Response,
    fail: (status: number, code: string, message: string) => Response,
  ): Response {
    const name = body.name;
    if (typeof name !== "string" || !/^[A-Za-z][A-Za-z0-9\-_/.]{0,64}$/.test(name)) {
      return fail(400, "InvalidParameter", `Invalid name ${JSON.stringify(name)}`);
    }
    for (const f of ["securityGroupIds", "enterpriseSecurityGroupIds", "privateIpSet"]) {
      if (body[f] !== undefined && !Array.isArray(body[f])) {
        return fail(
          400,
          "InappropriateJSON",
          `"${f}" must be a list, not ${JSON.stringify(body[f])}`,
        );
      }
    }
    const subnet = this.opts.subnets.find((s) => s.subnetId === body.subnetId);
    if (!subnet) return fail(404, "NoSuchObject", `Subnet "${body.subnetId}" not found`);
    const set = (body.privateIpSet ?? []) as { privateIpAddress?: string; primary?: boolean }[];
    const wanted = set.find((p) => p.primary)?.privateIpAddress || undefined;
    let ip: string;
    const used = this.#used(subnet.subnetId);
    if (wanted) {
      if (!inCidr(wanted, subnet.cidr)) {
        return fail(
          400,
          "PrivateIpNotInSubnetException",
          `IP "${wanted}" is not in ${subnet.cidr}`,
        );
      }
      if (used.has(wanted)) return fail(400, "PrivateIpInUseException", `IP "${wanted}" is in use`);
      ip = wanted;
    } else {
      const free = freeIp(subnet.cidr, used);
      if (!free) {
        return fail(400, "SubnetHasNoMoreIpException", `Subnet "${subnet.subnetId}" is full`);
      }
      ip = free;
    }
    used.add(ip);
    const eni = this.#newEni(name, subnet.subnetId, ip);
    eni.description = String(body.description ?? "");
    eni.securityGroupIds = (body.securityGroupIds ?? []) as string[];
    eni.enterpriseSecurityGroupIds = (body.enterpriseSecurityGroupIds ?? []) as string[];
    this.enis.set(eni.eniId, eni);
    if (key) this.#tokens.set(key, eni.eniId);
    return reply(200, { eniId: eni.eniId });
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

  #newEni(name: string, subnetId: string, ip: string | undefined): FakeEni {
    const n = ++this.#macCounter;
    const hex = (v: number) => v.toString(16).padStart(2, "0");
    return {
      eniId: "eni-" + randomId(12),
      name,
      description: "",
      zoneName: this.opts.azone,
      instanceId: "",
      macAddress: `fa:f6:${hex((n >> 24) & 255)}:${hex((n >> 16) & 255)}:${hex((n >> 8) & 255)}:${
        hex(n & 255)
      }`,
      vpcId: this.opts.vpcId,
      subnetId,
      status: "available",
      privateIpSet: ip ? [{ privateIpAddress: ip, primary: true, publicIpAddress: "" }] : [],
      ipv6PrivateIpSet: [],
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
 * `onAttach: (e) => sim.plug(toContractEni(fake, e))`.
 */
export function toContractEni(fake: FakeBce, eni: FakeEni): Eni {
  const subnet = fake.opts.subnets.find((s) => s.subnetId === eni.subnetId);
  const ip = eni.privateIpSet.find((p) => p.primary) ?? eni.privateIpSet[0];
  let ipv4: Eni["ipv4"] = null;
  if (subnet && ip) {
    const [net, len] = ipaddr.IPv4.parseCIDR(subnet.cidr);
    const b = net.toByteArray();
    b[3] += 1;
    ipv4 = { address: ip.privateIpAddress, prefixLength: len, gateway: b.join(".") };
  }
  return {
    id: eni.eniId,
    mac: eni.macAddress,
    ipv4,
    ipv6: null,
    subnetId: eni.subnetId,
    state: "free",
    owner: null,
  };
}

function json(status: number, body: unknown): Response {
  const headers: Record<string, string> = { "content-type": "application/json;charset=utf-8" };
  const rid = (body as { requestId?: string })?.requestId;
  headers["x-bce-request-id"] = rid ?? crypto.randomUUID();
  return new Response(JSON.stringify(body), { status, headers });
}

/** Splits a raw query string into decoded pairs; a bare key gets `null`. */
function parseQuery(search: string): QueryPair[] {
  const s = search.replace(/^\?/, "");
  if (s === "") return [];
  return s.split("&").filter((p) => p !== "").map((p) => {
    const i = p.indexOf("=");
    return i < 0
      ? [decodeURIComponent(p), null] as const
      : [decodeURIComponent(p.slice(0, i)), decodeURIComponent(p.slice(i + 1))] as const;
  });
}

function randomId(n: number): string {
  const abc = "abcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = crypto.getRandomValues(new Uint8Array(n));
  return [...bytes].map((b) => abc[b % abc.length]).join("");
}

function inCidr(ip: string, cidr: string): boolean {
  try {
    const [net, len] = ipaddr.parseCIDR(cidr);
    const a = ipaddr.parse(ip);
    return a.kind() === net.kind() && a.match(net, len);
  } catch {
    return false;
  }
}

/** The lowest free IPv4 host of a CIDR, skipping network, first host (gateway) and broadcast. */
function freeIp(cidr: string, used: Set<string>): string | null {
  const [net, len] = ipaddr.IPv4.parseCIDR(cidr);
  const base = net.toByteArray().reduce((a, b) => a * 256 + b, 0);
  const size = 2 ** (32 - len);
  for (let i = 2; i < size - 1; i++) {
    const v = base + i;
    const ip = [v >>> 24, (v >>> 16) & 255, (v >>> 8) & 255, v & 255].join(".");
    if (!used.has(ip)) return ip;
  }
  return null;
}
