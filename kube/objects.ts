/**
 * The Kubernetes objects the agent reads, as zod schemas that keep only the fields enim
 * uses (a node agent watching every pod of a 30,000-pod cluster must stay small). Each
 * schema parses the API server's JSON (`v1.Pod`, `v1.Namespace`,
 * `networking.k8s.io/v1.NetworkPolicy`, field names and defaults from
 * `k8s.io/api/core/v1/types.go` and `k8s.io/api/networking/v1/types.go`) and drops the
 * rest: what enim keeps of an object is the schema's output type.
 *
 * Absent optional fields stay absent (the API server omits empty ones); defaults that
 * carry meaning (a port's protocol is TCP when unset) are applied by the reader of the
 * field, where the API reference places them, not here, so the cached object says
 * exactly what the cluster said. The one exception is a NetworkPolicy enim cannot read:
 * it is kept, marked `unreadable`, with a spec that fails closed (see
 * {@linkcode NetworkPolicySchema}).
 *
 * @module
 */
import * as z from "zod/mini";
import { netCapsOf, SecurityContextSchema } from "./_caps.ts";
export { type CapHolding, type NetCaps, podHolds } from "./_caps.ts";
import "../lib/zod_locale.ts";
import { isCidr } from "../lib/ip.ts";

/** `metav1.ObjectMeta`, the parts enim keeps. */
export const ObjectMetaSchema = z.object({
  name: z.string(),
  namespace: z.optional(z.string()),
  uid: z.optional(z.string()),
  resourceVersion: z.optional(z.string()),
  labels: z.optional(z.record(z.string(), z.string())),
});
/** An object's metadata as enim keeps it. */
export type ObjectMeta = z.infer<typeof ObjectMetaSchema>;

/** `metav1.LabelSelectorOperator`: the four a label selector knows. */
export const LABEL_SELECTOR_OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist"] as const;

/**
 * `metav1.LabelSelectorRequirement`: `In` and `NotIn` need values, `Exists` and
 * `DoesNotExist` take none (what `metav1.LabelSelectorAsSelector` refuses, enim cannot
 * read either).
 */
export const LabelSelectorRequirementSchema = z.strictObject({
  key: z.string(),
  operator: z.enum(LABEL_SELECTOR_OPERATORS),
  values: z.optional(z.array(z.string())),
}).check(z.refine(
  (r) =>
    r.operator === "In" || r.operator === "NotIn"
      ? (r.values?.length ?? 0) > 0
      : (r.values?.length ?? 0) === 0,
  "Expected values for In and NotIn, and none for Exists and DoesNotExist",
));
/** One requirement of a label selector. */
export type LabelSelectorRequirement = z.infer<typeof LabelSelectorRequirementSchema>;

/**
 * `metav1.LabelSelector`: the requirements are ANDed; an empty selector (`{}`) matches
 * everything, and a selector that is absent where it is optional matches nothing or
 * everything as the field that holds it says.
 */
export const LabelSelectorSchema = z.strictObject({
  matchLabels: z.optional(z.record(z.string(), z.string())),
  matchExpressions: z.optional(z.array(LabelSelectorRequirementSchema)),
});
/** A label selector. */
export type LabelSelector = z.infer<typeof LabelSelectorSchema>;

/** `v1.Protocol` as NetworkPolicy and container ports use it. */
export const ProtocolSchema = z.enum(["TCP", "UDP", "SCTP"]);
/** A transport protocol. */
export type Protocol = z.infer<typeof ProtocolSchema>;

/** `intstr.IntOrString` for a port: a number, or the name of a container port. */
export const PortRefSchema = z.union([z.number().check(z.int()), z.string()]);

/** `networkingv1.NetworkPolicyPort`: protocol (TCP when unset), port (all when unset), endPort. */
export const NetworkPolicyPortSchema = z.strictObject({
  protocol: z.optional(ProtocolSchema),
  port: z.optional(PortRefSchema),
  endPort: z.optional(z.number().check(z.int())),
});
/** A port (or range) a NetworkPolicy rule admits. */
export type NetworkPolicyPort = z.infer<typeof NetworkPolicyPortSchema>;

/**
 * A CIDR as the API server's `ParseCIDRSloppy` reads it: an IPv4 part's leading zeros
 * are decimal (`010.0.0.0/8` is `10.0.0.0/8`; objects stored before Kubernetes 1.33's
 * stricter validation may have them). Kept as written otherwise (host bits too).
 */
function _sloppyCidr(text: string): string {
  const s = text.trim();
  const m = /^(\d+)\.(\d+)\.(\d+)\.(\d+)(\/.*)$/.exec(s);
  if (!m) return s;
  return m.slice(1, 5).map((o) => String(Number(o))).join(".") + m[5];
}

/**
 * CIDRs read, by their text (null: none): a cluster's policies repeat the same blocks.
 * Bounded: past 4096 the table starts again.
 */
const CIDRS = new Map<string, string | null>();

/** A CIDR of either family (`10.0.0.0/8`, `2001:db8::/64`), in the form enim's IP math reads. */
export const CidrSchema = z.pipe(
  z.string(),
  z.transform((s, ctx) => {
    let cidr = CIDRS.get(s);
    if (cidr === undefined) {
      if (CIDRS.size >= 4096) CIDRS.clear();
      const sloppy = _sloppyCidr(s);
      CIDRS.set(s, cidr = isCidr(sloppy) ? sloppy : null);
    }
    if (cidr !== null) return cidr;
    ctx.issues.push({ code: "custom", message: `Expected a CIDR, got "${s}"`, input: s });
    return z.NEVER;
  }),
);

/** `networkingv1.IPBlock`: a CIDR and the CIDRs inside it it leaves out. */
export const IPBlockSchema = z.strictObject({
  cidr: CidrSchema,
  except: z.optional(z.array(CidrSchema)),
});
/** An ipBlock peer. */
export type IPBlock = z.infer<typeof IPBlockSchema>;

/**
 * `networkingv1.NetworkPolicyPeer`: `podSelector` and `namespaceSelector` together select
 * the pods matching both; `ipBlock` stands alone.
 */
export const NetworkPolicyPeerSchema = z.strictObject({
  podSelector: z.optional(LabelSelectorSchema),
  namespaceSelector: z.optional(LabelSelectorSchema),
  ipBlock: z.optional(IPBlockSchema),
});
/** One peer of a NetworkPolicy rule. */
export type NetworkPolicyPeer = z.infer<typeof NetworkPolicyPeerSchema>;

/** `networkingv1.NetworkPolicyIngressRule`. */
export const NetworkPolicyIngressRuleSchema = z.strictObject({
  ports: z.optional(z.array(NetworkPolicyPortSchema)),
  from: z.optional(z.array(NetworkPolicyPeerSchema)),
});
/** `networkingv1.NetworkPolicyEgressRule`. */
export const NetworkPolicyEgressRuleSchema = z.strictObject({
  ports: z.optional(z.array(NetworkPolicyPortSchema)),
  to: z.optional(z.array(NetworkPolicyPeerSchema)),
});

/** `networkingv1.PolicyType`. */
export const PolicyTypeSchema = z.enum(["Ingress", "Egress"]);
/** A direction a NetworkPolicy applies to. */
export type PolicyType = z.infer<typeof PolicyTypeSchema>;

/**
 * `networkingv1.NetworkPolicySpec`, every field of v1, each checked: a field v1 does not
 * have (a newer release's) is refused too, since enim cannot know whether it narrows
 * what the policy admits.
 */
export const NetworkPolicySpecSchema = z.strictObject({
  podSelector: z._default(LabelSelectorSchema, {}),
  ingress: z.optional(z.array(NetworkPolicyIngressRuleSchema)),
  egress: z.optional(z.array(NetworkPolicyEgressRuleSchema)),
  policyTypes: z.optional(z.array(PolicyTypeSchema)),
});
/** A NetworkPolicy's spec as enim keeps it. */
export type NetworkPolicySpec = z.infer<typeof NetworkPolicySpecSchema>;

/** Why enim cannot read a NetworkPolicy (see {@linkcode NetworkPolicySchema}). */
export interface PolicyUnreadable {
  /** The first thing that could not be read, as `path: message` (`spec.ingress.0.ports.0.protocol: …`). */
  reason: string;
  /** `spec.podSelector` itself could not be read: the policy holds every pod of its namespace. */
  wholeNamespace: boolean;
}

/** A NetworkPolicy as enim keeps it. */
export interface NetworkPolicy {
  metadata: { name: string; namespace?: string; uid?: string; resourceVersion?: string };
  spec: NetworkPolicySpec;
  /**
   * Set when the spec could not be read: `spec` is then what fails closed (see
   * {@linkcode NetworkPolicySchema}), not what the cluster said.
   */
  unreadable?: PolicyUnreadable;
}

/** Object properties that are null, dropped (arrays' items are kept as they are). */
function _withoutNulls(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(_withoutNulls);
  if (v === null || typeof v !== "object") return v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) if (x !== null) out[k] = _withoutNulls(x);
  return out;
}

/** A failed parse's first issue as `path: message`, with the value found there when short. */
function _issueText(
  issues: readonly { path: readonly PropertyKey[]; message: string }[],
  root: unknown,
): string {
  const i = issues[0];
  if (i === undefined) return "invalid";
  let at: unknown = root;
  for (const k of i.path) at = at !== null && typeof at === "object" ? (at as never)[k] : undefined;
  const shown = typeof at === "string" || typeof at === "number" || typeof at === "boolean"
    ? JSON.stringify(at)
    : undefined;
  const got = shown !== undefined && shown.length <= 64 && !i.message.includes(shown)
    ? ` (got ${shown})`
    : "";
  return `${["spec", ...i.path.map(String)].join(".")}: ${i.message}${got}`;
}

/**
 * What an unreadable spec fails closed to: its own podSelector when that can be read
 * (else `{}`: every pod of the namespace), the directions it names (its `policyTypes`
 * when they can be read; absent, Ingress and, when it has any `egress` at all, Egress;
 * unreadable, both), and no rule: it isolates and admits nothing.
 */
function _failClosed(raw: unknown, reason: string): Pick<NetworkPolicy, "spec" | "unreadable"> {
  const spec = raw !== null && typeof raw === "object" && !Array.isArray(raw)
    ? raw as Record<string, unknown>
    : undefined;
  const sel = LabelSelectorSchema.safeParse(spec?.podSelector ?? {});
  const types = z.optional(z.array(PolicyTypeSchema)).safeParse(spec?.policyTypes);
  const egress = spec !== undefined && spec.egress !== undefined &&
    !(Array.isArray(spec.egress) && spec.egress.length === 0);
  const policyTypes: PolicyType[] = spec === undefined || !types.success
    ? ["Ingress", "Egress"]
    : types.data?.length
    ? types.data
    : egress
    ? ["Ingress", "Egress"]
    : ["Ingress"];
  return {
    spec: { podSelector: sel.success ? sel.data : {}, policyTypes },
    unreadable: { reason, wholeNamespace: !sel.success || spec === undefined },
  };
}

/**
 * `networking.k8s.io/v1.NetworkPolicy`. The API server accepted it, so it is valid
 * Kubernetes: every field of v1 is read (a null is taken for an absent field). What
 * still cannot be read (a protocol, selector operator or field of a newer release, a
 * malformed value) never makes the policy vanish, which would leave the pods it
 * selects open: the policy is kept with `unreadable` set and a spec that fails closed
 * — it isolates the pods its podSelector selects (every pod of its namespace when that
 * selector cannot be read) in the directions it names, and admits nothing. Only an
 * object whose metadata has no name cannot be kept (it has no key).
 */
export const NetworkPolicySchema = z.pipe(
  z.object({
    metadata: z.object({
      name: z.string(),
      namespace: z.optional(z.string()),
      uid: z.optional(z.string()),
      resourceVersion: z.optional(z.string()),
    }),
    spec: z.unknown(),
  }),
  z.transform((p): NetworkPolicy => {
    // The API server sends no nulls: only a spec that does not parse as it is is copied
    // without them and parsed again.
    const first = NetworkPolicySpecSchema.safeParse(p.spec ?? {});
    if (first.success) return { metadata: p.metadata, spec: first.data };
    const raw = _withoutNulls(p.spec ?? {});
    const spec = NetworkPolicySpecSchema.safeParse(raw);
    if (spec.success) return { metadata: p.metadata, spec: spec.data };
    return { metadata: p.metadata, ..._failClosed(raw, _issueText(spec.error.issues, raw)) };
  }),
);

/** `v1.ContainerPort`, the parts named-port resolution needs. */
export const ContainerPortSchema = z.object({
  name: z.optional(z.string()),
  containerPort: z.number().check(z.int()),
  protocol: z.optional(ProtocolSchema),
});

const ContainerSchema = z.object({
  ports: z.optional(z.array(ContainerPortSchema)),
  securityContext: z.optional(z.nullable(SecurityContextSchema)),
});

type ContainerPort = z.infer<typeof ContainerPortSchema>;
const NO_PORTS: ContainerPort[] = Object.freeze([]) as never;
const NO_IPS: string[] = Object.freeze([]) as never;

/**
 * Port lists by their text: the pods of one workload have equal ports, and keep one
 * frozen list of literals (a parsed port object is twice a literal's size). Bounded:
 * past {@linkcode SHARED_PORTS_MAX} lists the table starts again (the lists handed out
 * stay with their pods).
 */
const SHARED_PORTS = new Map<string, ContainerPort[]>();
const SHARED_PORTS_MAX = 4096;

function sharedPorts(ports: ContainerPort[]): ContainerPort[] {
  const key = JSON.stringify(ports.map((c) => [c.name, c.protocol ?? "", c.containerPort]));
  let shared = SHARED_PORTS.get(key);
  if (shared === undefined) {
    if (SHARED_PORTS.size >= SHARED_PORTS_MAX) SHARED_PORTS.clear();
    shared = Object.freeze(ports.map((c) =>
      Object.freeze(
        c.protocol === undefined
          ? { name: c.name, containerPort: c.containerPort }
          : { name: c.name, containerPort: c.containerPort, protocol: c.protocol },
      )
    )) as ContainerPort[];
    SHARED_PORTS.set(key, shared);
  }
  return shared;
}

/**
 * `v1.Pod`, the parts policy needs: its uid (a pod's identity: a pod re-created under
 * the same name is another pod), labels, node, host networking, named container ports
 * (of containers and init containers: a restartable init container, a sidecar, can serve
 * a port; unnamed ones are dropped), phase, IPs, and `deleting` when its deletion has
 * begun (`metadata.deletionTimestamp`, the pod Terminating: its containers run until
 * their grace period ends; `graceSeconds` is `metadata.deletionGracePeriodSeconds`, null
 * when absent), and what its containers hold of `NET_RAW` and `NET_ADMIN` (`netCaps`,
 * issue 48: what a policy needs the pod to lack where the kernel has no raw-socket guard).
 * Containers are flattened to their ports and those capabilities. Empty lists are one shared
 * frozen array.
 */
export const PodSchema = z.pipe(
  z.object({
    metadata: z.extend(ObjectMetaSchema, {
      deletionTimestamp: z.optional(z.string()),
      deletionGracePeriodSeconds: z.optional(z.number()),
    }),
    spec: z._default(
      z.object({
        nodeName: z.optional(z.string()),
        hostNetwork: z.optional(z.boolean()),
        containers: z.optional(z.array(ContainerSchema)),
        initContainers: z.optional(z.array(ContainerSchema)),
        ephemeralContainers: z.optional(z.array(ContainerSchema)),
      }),
      {},
    ),
    status: z._default(
      z.object({
        phase: z.optional(z.string()),
        podIP: z.optional(z.string()),
        podIPs: z.optional(z.array(z.object({ ip: z.string() }))),
      }),
      {},
    ),
  }),
  z.transform((p) => {
    // Only a named port can be named by a policy; most pods have none, and share one
    // empty list; the replicas of a workload share one frozen list of their ports.
    const named = [...(p.spec.containers ?? []), ...(p.spec.initContainers ?? [])]
      .flatMap((c) => c.ports ?? []).filter((c) => c.name !== undefined);
    const ports = named.length > 0 ? sharedPorts(named) : NO_PORTS;
    const listed = p.status.podIPs?.map((x) => x.ip) ?? (p.status.podIP ? [p.status.podIP] : []);
    const ips = listed.length > 0 ? listed : NO_IPS;
    const { deletionTimestamp, deletionGracePeriodSeconds, ...metadata } = p.metadata;
    // Every container shares the pod's network namespace (an ephemeral one too).
    const netCaps = netCapsOf([
      ...(p.spec.containers ?? []),
      ...(p.spec.initContainers ?? []),
      ...(p.spec.ephemeralContainers ?? []),
    ]);
    return {
      metadata,
      ...(deletionTimestamp !== undefined
        ? { deleting: { at: deletionTimestamp, graceSeconds: deletionGracePeriodSeconds ?? null } }
        : {}),
      nodeName: p.spec.nodeName,
      hostNetwork: p.spec.hostNetwork ?? false,
      ports,
      netCaps,
      phase: p.status.phase,
      ips,
    };
  }),
);
/** A Pod as enim keeps it. */
export type Pod = z.infer<typeof PodSchema>;

/** `v1.Namespace`, its metadata alone (name and labels). */
export const NamespaceSchema = z.pipe(
  z.object({ metadata: ObjectMetaSchema }),
  z.transform((n) => ({ metadata: n.metadata })),
);
/** A Namespace as enim keeps it. */
export type Namespace = z.infer<typeof NamespaceSchema>;
