/**
 * The agent's HTTP+JSON API: request and response schemas shared by the agent,
 * the CNI plugin and the operator commands.
 *
 * Paths (all under the unix socket):
 * - `POST /v1/add` {@linkcode AddRequestSchema} → {@linkcode AddResponseSchema}
 * - `POST /v1/del` {@linkcode DelRequestSchema} → `{}`
 * - `POST /v1/check` {@linkcode CheckRequestSchema} → `{}`
 * - `POST /v1/gc` {@linkcode GcRequestSchema} → {@linkcode GcReportSchema}
 * - `GET /v1/status` → {@linkcode StatusSchema}
 * - `GET /v1/attachments` → `{attachments: Attachment[]}`
 * - `GET /v1/enis` → `{enis: Eni[]}`
 * - `GET /v1/policy?pod=<namespace>/<name>` → {@linkcode PodPolicyViewSchema} (NetworkPolicy on)
 * - `GET /v1/healthz` → `{ok: true}` (the agent is live), or 503 `{ok: false, reason}` when it is
 *   wedged (`agent/health.ts`)
 * - `GET /metrics` → Prometheus text
 *
 * Errors are `{error: {code, message, details?}}` with an HTTP status from
 * {@linkcode HTTP_STATUS}.
 *
 * Why one file: it is the whole wire contract between the agent and its three clients
 * (plugin, CLI, tests), read top to bottom as the list of routes above; the requests,
 * answers and error codes refer to each other, and one file is what a client reads to
 * learn the API.
 *
 * @module
 */
import {
  CNI_ENV_NAMES,
  CONTAINER_ID,
  IFNAME,
  LOG_FILE_ENV,
  MAX_CALL_ENV_VALUE,
  MAX_CALL_STDIN,
  type NameRule,
  NETNS_PATH,
} from "./wire.ts";
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import {
  DEFAULT_PROFILE,
  EniSchema,
  IpRangeSchema,
  IpSchema,
  NetworkCidrSchema,
  ProfileNameSchema,
  routeFamilyCheck,
  SecurityGroupIdSchema,
  StickyStatusSchema,
} from "../providers/schema.ts";

/** A Kubernetes namespace (DNS label). */
const K8sNamespace = z.string().check(z.regex(
  /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/,
  "Expected a DNS label (lower-case letters, digits and '-', at most 63)",
));
/** A Kubernetes object name (DNS subdomain), relaxed to what runtimes pass. */
const K8sName = z.string().check(z.regex(
  /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?$/,
  "Expected a name of letters, digits, '-', '_' and '.', at most 253",
));

/** `interface`: enim moves the ENI into the pod; `ipam`: another plugin moves the device. */
export const ModeSchema = z.enum(["interface", "ipam"]);
/** How enim was configured for an attachment. */
export type Mode = z.infer<typeof ModeSchema>;

/**
 * The attachment states: the intent (adding, deleting) or the outcome (ready,
 * recycling; held: a sticky pod's ENI kept for it after its DEL, device on the node).
 */
export const AttachmentStateSchema = z.enum(["adding", "ready", "recycling", "deleting", "held"]);
/** An attachment state. */
export type AttachmentState = z.infer<typeof AttachmentStateSchema>;

/** The pod that owns an attachment. */
export const PodSchema = z.object({
  namespace: K8sNamespace,
  name: K8sName,
  uid: z.optional(z.string().check(z.maxLength(128))),
});
/** The pod that owns an attachment. */
export type Pod = z.infer<typeof PodSchema>;

/**
 * A string schema that refines with a zod-free {@linkcode NameRule} (`api/wire.ts`),
 * so the agent's schemas and the plugin process, which loads no zod, name the same reason.
 */
export function ruledString(rule: NameRule): z.ZodMiniString<string> {
  return z.string().check(z.superRefine((value: string, ctx) => {
    const why = rule.problem(value);
    if (why !== undefined) ctx.addIssue({ code: "custom", message: why, input: value });
  }));
}

/** A CNI container id: {@linkcode CONTAINER_ID} (the spec's charset, at most 256 characters). */
export const ContainerIdSchema = ruledString(CONTAINER_ID);
/** A Linux interface name: {@linkcode IFNAME}. */
export const IfNameSchema = ruledString(IFNAME);
/** A network namespace path, absolute, normalized, no traversal: {@linkcode NETNS_PATH}. */
export const NetnsPathSchema = ruledString(NETNS_PATH);

/** A route from the network config. */
export const RouteSchema = z.object({
  dst: NetworkCidrSchema,
  gw: z.optional(IpSchema),
}).check(routeFamilyCheck());

/** The prefix of host-link node-end names: a letter, then letters and digits, 1–7 in all. */
export const NodeIfPrefixSchema = z.string().check(
  z.regex(
    /^[a-z][a-z0-9]{0,6}$/,
    "Expected a lower-case letter followed by at most 6 lower-case letters or digits",
  ),
);

/**
 * The host link an ADD asks for beside the ENI (interface mode): the pod end's
 * name, the node end's name prefix, and what the pod routes through it besides the
 * node's own addresses (which the agent finds).
 */
/** A packet mark of one bit (a power of two below 2^32), as a number. */
export const MarkBitSchema = z.number().check(
  z.int(),
  z.refine((n) => n > 0 && n <= 0x80000000 && (n & (n - 1)) === 0, {
    message: "Expected a mark of one bit (a power of two below 2^32, e.g. 0x1000)",
  }),
);

/** A mark of one bit in a config file: a number, or a hex string (`"0x1000"`). */
export const MarkConfigSchema = z.pipe(
  z.union([z.number(), z.string().check(z.regex(/^0x[0-9a-fA-F]{1,8}$/))]),
  z.pipe(
    z.transform((v: number | string) => typeof v === "number" ? v : parseInt(v, 16)),
    MarkBitSchema,
  ),
);

export const HostLinkRequestSchema = z.object({
  podIfName: IfNameSchema,
  nodeIfPrefix: NodeIfPrefixSchema,
  /** The cluster's Service CIDRs (IPv4 and IPv6): ClusterIPs live only in kube-proxy's rules. */
  serviceCidrs: z._default(z.array(NetworkCidrSchema), []),
  /** Other prefixes the node serves (NodeLocal DNS at 169.254.20.10/32 and the like). */
  hostStackCidrs: z._default(z.array(NetworkCidrSchema), []),
  /** The pod-side mark bits, where the network config sets them (`netns/host_link.ts` `HostLinkMarks`). */
  marks: z.optional(z.object({
    answer: z.optional(MarkBitSchema),
    return: z.optional(MarkBitSchema),
  })),
});
/** The host link an ADD asks for. */
export type HostLinkRequest = z.output<typeof HostLinkRequestSchema>;

/** The host link an ADD made: its two ends. */
export const HostLinkResultSchema = z.object({
  nodeIfName: z.string(),
  podIfName: z.string(),
  nodeMac: z.string(),
  podMac: z.string(),
});

/** Fields that identify one CNI attachment. */
const AttachmentKey = {
  containerId: ContainerIdSchema,
  ifName: IfNameSchema,
};

/** A bandwidth limit: `rate` in bits per second (kubelet's range, 1 kbit/s to 1 Pbit/s), `burst` in bits. */
export const BandwidthLimitSchema = z.object({
  rate: z.number().check(z.int(), z.minimum(1_000), z.maximum(1_000_000_000_000_000)),
  /** The bucket; absent: 25 ms of the rate (`netns/bandwidth.ts`). */
  burst: z.optional(z.number().check(z.int(), z.positive(), z.maximum(8 * (2 ** 32 - 1)))),
});

/**
 * The pod's bandwidth limits, enforced on its ENI: `ingress` into the pod, `egress`
 * out of it (the CNI `bandwidth` capability's directions).
 */
export const BandwidthSchema = z.object({
  ingress: z.optional(BandwidthLimitSchema),
  egress: z.optional(BandwidthLimitSchema),
});
/** The pod's bandwidth limits. */
export type Bandwidth = z.infer<typeof BandwidthSchema>;

/** POST /v1/add. */
export const AddRequestSchema = z.object({
  ...AttachmentKey,
  netns: NetnsPathSchema,
  /** The network config's `name`. */
  network: z.string().check(z.minLength(1), z.maxLength(256)),
  pod: PodSchema,
  /** `interface`: enim moves the device into the pod; `ipam`: the device stays on the node. */
  mode: ModeSchema,
  ips: z._default(z.array(IpSchema), []),
  ranges: z._default(z.array(z.array(IpRangeSchema)), []),
  routes: z._default(z.array(RouteSchema), []),
  mtu: z.optional(z.number().check(z.int(), z.minimum(68), z.maximum(65535))),
  /** Whether the pod gets a default route per family via the ENI's gateways (absent: yes). */
  defaultRoutes: z.optional(z.boolean()),
  /** The profile whose ENI the pod gets (its subnet, groups and pool). */
  profile: z._default(ProfileNameSchema, DEFAULT_PROFILE),
  /** Inline security groups: the ENI's groups while the pod owns it (all of one kind). */
  securityGroupIds: z.optional(
    z.array(SecurityGroupIdSchema).check(z.minLength(1), z.maxLength(10)),
  ),
  /** Whether the pod keeps its ENI through a delete and re-create of the same pod. */
  sticky: z._default(z.boolean(), false),
  /** Bandwidth limits to enforce on the ENI in the pod (interface mode). */
  bandwidth: z.optional(BandwidthSchema),
  /** A node-facing veth pair beside the ENI (interface mode); absent: none. */
  hostLink: z.optional(HostLinkRequestSchema),
});
/** POST /v1/add. */
export type AddRequest = z.input<typeof AddRequestSchema>;

/** An address in an ADD result: CIDR address and the subnet gateway. */
export const ResultIpSchema = z.object({ address: z.string(), gateway: IpSchema });

/** The agent's answer to an ADD; the CNI side turns it into a versioned CNI result. */
export const AddResponseSchema = z.object({
  eniId: z.string(),
  mac: z.string(),
  /** The device's ifindex: in the pod (interface mode) or on the node (IPAM mode). */
  ifindex: z.number().check(z.int()),
  /** The device's node-side name. */
  nodeName: z.string(),
  ips: z.array(ResultIpSchema),
  /** Every route the pod got: the ENI's, then the host link's (via its link-local gateway). */
  routes: z.array(z.object({ dst: z.string(), gw: z.optional(z.string()) })),
  /** The bandwidth shaping installed, every burst resolved (DEL and CHECK read it). */
  bandwidth: z.optional(BandwidthSchema),
  /** The host link, when the ADD asked for one. */
  hostLink: z.optional(HostLinkResultSchema),
});
/** The agent's answer to an ADD. */
export type AddResponse = z.infer<typeof AddResponseSchema>;

/**
 * POST /v1/cni: a CNI call as the plugin process received it, run by the
 * agent's CNI dispatcher. The answer is 200 with the plugin's stdout as the
 * body and its exit code in the `enim-cni-exit` header (see `cni/forward.ts`).
 */
export const CniCallSchema = z.strictObject({
  env: z.partialRecord(
    z.enum([...CNI_ENV_NAMES, LOG_FILE_ENV]),
    z.string().check(
      z.maxLength(MAX_CALL_ENV_VALUE, `Expected at most ${MAX_CALL_ENV_VALUE} characters`),
    ),
  ),
  stdin: z.string().check(
    z.maxLength(MAX_CALL_STDIN, `Expected at most ${MAX_CALL_STDIN} characters`),
  ),
});
/** POST /v1/cni. */
export type CniCall = z.infer<typeof CniCallSchema>;

/** POST /v1/del. `netns` may be empty: the runtime may not know it any more. */
export const DelRequestSchema = z.object({
  ...AttachmentKey,
  netns: z._default(z.union([NetnsPathSchema, z.literal("")]), ""),
  network: z._default(z.string().check(z.maxLength(256)), ""),
});
/** POST /v1/del. */
export type DelRequest = z.input<typeof DelRequestSchema>;

/** POST /v1/check: the agent compares the live pod with its record and `expected`. */
export const CheckRequestSchema = z.object({
  ...AttachmentKey,
  netns: NetnsPathSchema,
  network: z.string().check(z.minLength(1), z.maxLength(256)),
  mode: ModeSchema,
  /** What the prevResult says: addresses (CIDR), MAC, routes. */
  expected: z.object({
    mac: z.optional(z.string()),
    addresses: z._default(z.array(z.string()), []),
    routes: z._default(z.array(z.object({ dst: z.string(), gw: z.optional(z.string()) })), []),
  }),
});
/** POST /v1/check. */
export type CheckRequest = z.input<typeof CheckRequestSchema>;

/** POST /v1/gc. */
export const GcRequestSchema = z.object({
  dryRun: z._default(z.boolean(), false),
  /** For the CNI GC verb: the network whose attachments are checked against `validAttachments`. */
  network: z.optional(z.string().check(z.minLength(1), z.maxLength(256))),
  validAttachments: z.optional(
    z.array(z.object({ containerId: z.string(), ifName: z.string() })),
  ),
});
/** POST /v1/gc. */
export type GcRequest = z.input<typeof GcRequestSchema>;

/** One ENI that GC reclaims (or would). */
export const GcItemSchema = z.object({
  eniId: z.string(),
  mac: z.string(),
  device: z.string(),
  pod: z.string(),
  containerId: z.string(),
  ifName: z.string(),
  netns: z.string(),
  reason: z.string(),
  action: z.string(),
  outcome: z.enum(["planned", "reclaimed", "failed"]),
  error: z.optional(z.string()),
  /**
   * `dead`: the attachment's pod is gone; `orphan`: the provider shows the ENI
   * owned by an attachment the agent does not know; `hold`: a sticky pod's held
   * ENI whose hold expired; `park`: a zone-sticky pod's held ENI whose node hold
   * ended, parked in the VPC for the rest of its hold.
   */
  kind: z._default(z.enum(["dead", "orphan", "hold", "park"]), "dead"),
  /** The profile of the ENI (`default` when the agent does not know it). */
  profile: z._default(z.string(), "default"),
});
/**
 * A DEL that has answered the runtime and is still finishing (the device's move home,
 * the ENI's release): reads show it as such instead of waiting for it, and GC leaves it
 * to its DEL (and takes it over only if that fails: the record then stays `deleting`).
 */
export const UnfinishedDelSchema = z.object({
  pod: z.string(),
  containerId: z.string(),
  ifName: z.string(),
  eniId: z.nullable(z.string()),
  /** When the DEL answered. */
  answeredAt: z.string(),
});
/** A DEL still finishing. */
export type UnfinishedDel = z.infer<typeof UnfinishedDelSchema>;

/** The GC report. */
export const GcReportSchema = z.object({
  dryRun: z.boolean(),
  items: z.array(GcItemSchema),
  /** DELs still finishing: not reclaimed by this pass, their DEL is on it. */
  unfinishedDels: z._default(z.array(UnfinishedDelSchema), []),
});
/** The GC report. */
export type GcReport = z.infer<typeof GcReportSchema>;

/** A recorded attachment, as `GET /v1/attachments` and `enim status` show it. */
export const AttachmentSchema = z.object({
  containerId: z.string(),
  ifName: z.string(),
  pod: z.string(),
  podUid: z.nullable(z.string()),
  network: z.string(),
  netns: z.string(),
  mode: ModeSchema,
  state: AttachmentStateSchema,
  eniId: z.nullable(z.string()),
  mac: z.nullable(z.string()),
  nodeName: z.nullable(z.string()),
  createdAt: z.string(),
  updatedAt: z.string(),
  /** The profile whose ENI it holds. */
  profile: z._default(z.string(), "default"),
  /** Whether the pod keeps its ENI through a delete and re-create. */
  sticky: z._default(z.boolean(), false),
  /** Until when a held ENI waits for its pod on this node (state `held`). */
  holdUntil: z._default(z.nullable(z.string()), null),
  /** Zone scope: until when, after its node hold, the ENI waits for its pod parked in the VPC. */
  parkUntil: z._default(z.nullable(z.string()), null),
  /**
   * Its host link: the two ends, the Service CIDRs the pod routes through it and the
   * node-side table of the pod's Service traffic (absent on a link of the layout before
   * issue 34).
   */
  hostLink: z._default(
    z.nullable(z.object({
      nodeIfName: z.string(),
      podIfName: z.string(),
      serviceCidrs: z.array(z.string()),
      table: z.optional(z.number().check(z.int())),
    })),
    null,
  ),
  /**
   * When its DEL answered, while that DEL is still finishing (state `deleting`: the
   * device's move home, the ENI's release); null otherwise.
   */
  delAnsweredAt: z._default(z.nullable(z.string()), null),
});
/** A recorded attachment. */
export type Attachment = z.infer<typeof AttachmentSchema>;

/** GET /v1/status. */
/**
 * The device plugin (`enim.dev/eni`): whether kubelet has it, what it advertises,
 * and why devices are Unhealthy.
 */
export const DevicePluginStatusSchema = z.object({
  /**
   * `off`: not enabled, or kubelet's folder is missing; `registering`: serving, not
   * registered with kubelet yet (or again); `registered`: kubelet accepted it.
   */
  state: z.enum(["off", "registering", "registered"]),
  /** Why it is off or not registered, or why there is no device list yet. */
  reason: z.nullable(z.string()),
  resourceName: z.string(),
  /** The plugin's socket in kubelet's folder. */
  socket: z._default(z.nullable(z.string()), null),
  /** When kubelet last accepted the registration. */
  registeredAt: z._default(z.nullable(z.string()), null),
  /** kubelet's ListAndWatch streams open now (one while all is well). */
  streams: z._default(z.number().check(z.int(), z.minimum(0)), 0),
  /** The node's ENI limit the devices stand for (null: not known yet). */
  limit: z._default(z.nullable(z.number().check(z.int(), z.minimum(0))), null),
  healthy: z._default(z.number().check(z.int(), z.minimum(0)), 0),
  unhealthy: z._default(z.number().check(z.int(), z.minimum(0)), 0),
  /** Why devices are Unhealthy: each reason with how many devices and a sentence. */
  unhealthyReasons: z._default(
    z.array(z.object({
      reason: z.string(),
      devices: z.number().check(z.int(), z.minimum(0)),
      message: z.string(),
    })),
    [],
  ),
});
/** The device plugin's status. */
export type DevicePluginStatus = z.infer<typeof DevicePluginStatusSchema>;

/** One cache of the Kubernetes API client, as status shows it. */
export const KubeCacheStatusSchema = z.object({
  resource: z.string(),
  synced: z.boolean(),
  objects: z.number().check(z.int()),
  /** Lists after the first (a 410 Gone, an expired continue token). */
  relists: z.number().check(z.int()),
  /** Watches started again other than right after a list (a timeout, a failure). */
  watchRestarts: z.number().check(z.int()),
  /** Failed lists and watches. */
  errors: z.number().check(z.int()),
  /** The last failure, null after a success. */
  lastError: z.nullable(z.string()),
  /** When the last watch event arrived. */
  lastEventAt: z.nullable(z.string()),
  /**
   * Whether the API server sends watch bookmarks: `unknown` until one came (`seen`) or
   * the cache found it sends none (`none`: a dead watch is then noticed only past its
   * timeout). Absent from an older agent.
   */
  bookmarks: z.optional(z.enum(["unknown", "seen", "none"])),
  /** Watches taken for dead because they were silent too long. Absent from an older agent. */
  silentWatches: z.optional(z.number().check(z.int())),
  /** The resourceVersion of the last object event the enforcer put in place (null: none yet). */
  enforcedResourceVersion: z.nullable(z.string()),
});

/** One local pod under NetworkPolicy, as status shows it. */
export const PolicyPodStatusSchema = z.object({
  pod: z.string(),
  /** The attachment, `containerId/ifName`. */
  key: z.string(),
  /** The node end of its host link. */
  nodeIfName: z.string(),
  /** How many NetworkPolicies of its namespace select it. */
  policies: z.number().check(z.int()),
  ingressIsolated: z.boolean(),
  egressIsolated: z.boolean(),
  /**
   * `enforced`: its table is the cluster's current state; `waiting`: the agent has not
   * synced yet (the kernel keeps what an earlier agent loaded); `retrying`: the last load
   * failed and is tried again; `unknown`: the pod is not in the cluster (its last rules stay).
   */
  state: z.enum(["enforced", "waiting", "retrying", "unknown"]),
  /**
   * Why the pod can reach past its policy with the capabilities it holds (`NET_ADMIN`;
   * `NET_RAW` where the node has no raw-socket guard); null: it cannot, or nothing
   * isolates it.
   */
  bypass: z._default(z.nullable(z.string()), null),
});

/**
 * A NetworkPolicy the agent cannot read (a protocol, selector operator or field it does
 * not know, a malformed value): it fails closed, isolating `selects` in its namespace for
 * the directions it names and admitting nothing.
 */
export const UnreadablePolicyStatusSchema = z.object({
  /** `namespace/name`. */
  policy: z.string(),
  resourceVersion: z.nullable(z.string()),
  /** What could not be read, `path: message`. */
  reason: z.string(),
  /** The pods it isolates: its podSelector (`app=db`), or `<all>` when that cannot be read. */
  selects: z.string(),
  /** Its podSelector cannot be read: every pod of its namespace is isolated. */
  wholeNamespace: z.boolean(),
  ingress: z.boolean(),
  egress: z.boolean(),
});
/** An unreadable NetworkPolicy. */
export type UnreadablePolicyStatus = z.infer<typeof UnreadablePolicyStatusSchema>;

/** kube-proxy's IPVS mode on the node, as NetworkPolicy sees it (`agent/ipvs.ts`). */
export const IpvsStatusSchema = z.object({
  /** ADDs under NetworkPolicy are refused (code 111): IPVS mode found, or not ruled out. */
  refusing: z.boolean(),
  /** Whether the `kube-ipvs0` link is there (null: the links could not be listed). */
  link: z.nullable(z.boolean()),
  /** IPVS's virtual services (`/proc/net/ip_vs`; null: it could not be read). */
  services: z.nullable(z.number().check(z.int())),
  /** What was found, in words. */
  reason: z.string(),
  /** When the node's links were last looked at (ISO 8601). */
  checkedAt: z.nullable(z.string()),
  /** ADDs refused since the agent started. */
  refusedAdds: z.number().check(z.int()),
});
/** kube-proxy's IPVS mode on the node. */
export type IpvsStatus = z.infer<typeof IpvsStatusSchema>;

/** NetworkPolicy enforcement on the node (present when it is on). */
export const PolicyStatusSchema = z.object({
  /** The caches have listed once and the enforcer took over: ADDs are served. */
  synced: z.boolean(),
  /** Watch events not put in place yet. */
  pendingEvents: z.number().check(z.int()),
  /** Loads that failed (each retried). */
  loadFailures: z.number().check(z.int()),
  caches: z.array(KubeCacheStatusSchema),
  pods: z.array(PolicyPodStatusSchema),
  /** The cluster's NetworkPolicies the agent cannot read (each fails closed), by name. */
  unreadable: z._default(z.array(UnreadablePolicyStatusSchema), []),
  /**
   * The raw-socket guard (an nftables `netdev` egress chain on each isolated pod's ENI):
   * on where the kernel has it; off, an isolated pod must lack `NET_RAW` for its policy
   * to hold.
   */
  rawSocketGuard: z._default(z.object({ on: z.boolean(), why: z.string() }), {
    on: false,
    why: "not reported",
  }),
});
/** NetworkPolicy enforcement on the node. */
export type PolicyStatus = z.infer<typeof PolicyStatusSchema>;

/** One rule of a pod's effective policy: a peer and the ports it may use. */
export const PolicyRuleViewSchema = z.object({
  /** `any`: every address; `pods`: pods a selector pair selects; `ipBlock`; `namedPort`. */
  kind: z.enum(["any", "pods", "ipBlock", "namedPort"]),
  /** What the peer is, in words (`pods app=web in namespaces team=a`, `10.0.0.0/8 except …`). */
  peer: z.string(),
  /** `any`, or each protocol's ports (`TCP 80`, `UDP 5000-5010`, `TCP port http`). */
  ports: z.array(z.string()),
  /** The peer's current members (addresses, prefixes, or `address port`); empty for `any`. */
  members: z.array(z.string()),
});

/** One direction of a pod's effective policy. */
export const PolicyDirectionViewSchema = z.object({
  /** A policy applies to this direction: only what `rules` lists is admitted. */
  isolated: z.boolean(),
  rules: z.array(PolicyRuleViewSchema),
});

/** GET /v1/policy: a local pod's effective NetworkPolicy as the agent enforces it. */
export const PodPolicyViewSchema = z.object({
  pod: z.string(),
  /** The pod's own addresses (always allowed: a pod never blocks itself). */
  addresses: z.array(z.string()),
  /** The node's addresses (always allowed both ways). */
  nodeAddresses: z.array(z.string()),
  /** The NetworkPolicies of its namespace that select it. */
  policies: z.array(z.object({
    name: z.string(),
    ingress: z.boolean(),
    egress: z.boolean(),
    ingressRules: z.number().check(z.int()),
    egressRules: z.number().check(z.int()),
    /** Why the agent cannot read it (it then isolates and admits nothing). */
    unreadable: z.optional(z.string()),
  })),
  ingress: PolicyDirectionViewSchema,
  egress: PolicyDirectionViewSchema,
  /** What of those policies was ignored, and why. */
  warnings: z.array(z.string()),
  /** The raw-socket guard holds its packet sockets (it is isolated and the node has it). */
  rawSocketGuard: z._default(z.boolean(), false),
  /** Why it can reach past its policy with its capabilities (null: it cannot). */
  bypass: z._default(z.nullable(z.string()), null),
});
/** A local pod's effective NetworkPolicy. */
export type PodPolicyView = z.infer<typeof PodPolicyViewSchema>;

export const StatusSchema = z.object({
  version: z.string(),
  provider: z.string(),
  ready: z.boolean(),
  /** Whether an ADD can be served now: a free ENI or room to attach one. */
  canAllocate: z.boolean(),
  pool: z.object({
    /**
     * No free ENI and no room to attach another: a new pod waits until one is released
     * (its ADD fails with 100). A scheduling fact, not a network fault: CNI STATUS still
     * answers 0 (the node stays Ready).
     */
    exhausted: z._default(z.boolean(), false),
    free: z.number().check(z.int()),
    /** Owned in the provider: by pods, recycling and held ENIs included. */
    owned: z.number().check(z.int()),
    recycling: z.number().check(z.int()),
    /** Sticky pods' ENIs held after their DEL. */
    held: z._default(z.number().check(z.int()), 0),
    /** How many more ENIs the node can attach (shared by every profile). */
    attachable: z.number().check(z.int()),
    /** The same counts per profile. */
    profiles: z._default(
      z.record(
        z.string(),
        z.object({
          free: z.number().check(z.int()),
          owned: z.number().check(z.int()),
          recycling: z.number().check(z.int()),
          held: z.number().check(z.int()),
        }),
      ),
      {},
    ),
  }),
  enis: z.array(z.extend(EniSchema, {
    device: z.nullable(z.string()),
    attachment: z.nullable(AttachmentSchema),
  })),
  /** The provider's own details (BCE: limit source, lost and quarantined ENIs, intents). */
  providerDetails: z._default(z.record(z.string(), z.unknown()), {}),
  /** Zone-wide sticky pods: the ENIs this node parked in the VPC, and the claims it made. */
  sticky: z._default(StickyStatusSchema, { parked: [], claims: [] }),
  /** The device plugin, when the agent runs one (absent from older agents). */
  devicePlugin: z.optional(DevicePluginStatusSchema),
  /** NetworkPolicy enforcement, when it is on (absent from older agents and when off). */
  policy: z.optional(PolicyStatusSchema),
  /** kube-proxy's IPVS mode, looked for while NetworkPolicy is on (absent otherwise). */
  ipvs: z.optional(IpvsStatusSchema),
  /** DELs that have answered and are still finishing (reads do not wait for them for long). */
  unfinishedDels: z._default(z.array(UnfinishedDelSchema), []),
  /**
   * The host links of the node's attachments, and the networks whose pods have one
   * but no Service CIDR routed through it (their pods cannot reach Services).
   */
  hostLinks: z._default(
    z.object({
      links: z.number().check(z.int()),
      withoutServiceCidrs: z.array(z.object({
        network: z.string(),
        pods: z.array(z.string()),
      })),
    }),
    { links: 0, withoutServiceCidrs: [] },
  ),
});
/** GET /v1/status. */
export type Status = z.infer<typeof StatusSchema>;

/** Stable API error codes; the CNI side maps them to CNI codes in `cni/errors.ts`. */
export const API_ERROR_CODES = [
  "bad_request",
  "not_found",
  "no_eni_available",
  "requested_ip_unavailable",
  "sticky_conflict",
  "wrong_zone",
  "ifname_exists",
  "netns_invalid",
  "check_failed",
  "not_allowed",
  "provider_error",
  "device_error",
  "busy",
  "policy_unavailable",
  "policy_unenforceable",
  "state_unavailable",
  "internal",
] as const;
/** A stable API error code. */
export type ApiErrorCode = typeof API_ERROR_CODES[number];

/** The HTTP status each API error code is sent with. */
export const HTTP_STATUS: Record<ApiErrorCode, number> = {
  bad_request: 400,
  not_found: 404,
  no_eni_available: 409,
  requested_ip_unavailable: 409,
  sticky_conflict: 409,
  wrong_zone: 409,
  ifname_exists: 409,
  netns_invalid: 400,
  check_failed: 412,
  not_allowed: 403,
  provider_error: 502,
  device_error: 500,
  busy: 503,
  policy_unavailable: 503,
  policy_unenforceable: 503,
  state_unavailable: 507,
  internal: 500,
};

/** An API error body. */
export const ApiErrorBodySchema = z.object({
  error: z.object({
    code: z.enum(API_ERROR_CODES),
    message: z.string(),
    details: z.optional(z.string()),
  }),
});

/** An error the agent answered with. */
export class ApiError extends Error {
  readonly code: ApiErrorCode;
  readonly details?: string;
  constructor(
    code: ApiErrorCode,
    message: string,
    details?: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "ApiError";
    this.code = code;
    this.details = details;
  }
}

/** The default socket path. */
