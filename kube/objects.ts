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
 * exactly what the cluster said.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";

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

/** `metav1.LabelSelectorRequirement`. */
export const LabelSelectorRequirementSchema = z.object({
  key: z.string(),
  operator: z.enum(["In", "NotIn", "Exists", "DoesNotExist"]),
  values: z.optional(z.array(z.string())),
});
/** One requirement of a label selector. */
export type LabelSelectorRequirement = z.infer<typeof LabelSelectorRequirementSchema>;

/**
 * `metav1.LabelSelector`: the requirements are ANDed; an empty selector (`{}`) matches
 * everything, and a selector that is absent where it is optional matches nothing or
 * everything as the field that holds it says.
 */
export const LabelSelectorSchema = z.object({
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
export const NetworkPolicyPortSchema = z.object({
  protocol: z.optional(ProtocolSchema),
  port: z.optional(PortRefSchema),
  endPort: z.optional(z.number().check(z.int())),
});
/** A port (or range) a NetworkPolicy rule admits. */
export type NetworkPolicyPort = z.infer<typeof NetworkPolicyPortSchema>;

/** `networkingv1.IPBlock`: a CIDR and the CIDRs inside it it leaves out. */
export const IPBlockSchema = z.object({
  cidr: z.string(),
  except: z.optional(z.array(z.string())),
});
/** An ipBlock peer. */
export type IPBlock = z.infer<typeof IPBlockSchema>;

/**
 * `networkingv1.NetworkPolicyPeer`: `podSelector` and `namespaceSelector` together select
 * the pods matching both; `ipBlock` stands alone.
 */
export const NetworkPolicyPeerSchema = z.object({
  podSelector: z.optional(LabelSelectorSchema),
  namespaceSelector: z.optional(LabelSelectorSchema),
  ipBlock: z.optional(IPBlockSchema),
});
/** One peer of a NetworkPolicy rule. */
export type NetworkPolicyPeer = z.infer<typeof NetworkPolicyPeerSchema>;

/** `networkingv1.NetworkPolicyIngressRule`. */
export const NetworkPolicyIngressRuleSchema = z.object({
  ports: z.optional(z.array(NetworkPolicyPortSchema)),
  from: z.optional(z.array(NetworkPolicyPeerSchema)),
});
/** `networkingv1.NetworkPolicyEgressRule`. */
export const NetworkPolicyEgressRuleSchema = z.object({
  ports: z.optional(z.array(NetworkPolicyPortSchema)),
  to: z.optional(z.array(NetworkPolicyPeerSchema)),
});

/** `networkingv1.NetworkPolicy`, the parts policy needs. */
export const NetworkPolicySchema = z.object({
  metadata: ObjectMetaSchema,
  spec: z.object({
    podSelector: z._default(LabelSelectorSchema, {}),
    ingress: z.optional(z.array(NetworkPolicyIngressRuleSchema)),
    egress: z.optional(z.array(NetworkPolicyEgressRuleSchema)),
    policyTypes: z.optional(z.array(z.enum(["Ingress", "Egress"]))),
  }),
});
/** A NetworkPolicy as enim keeps it. */
export type NetworkPolicy = z.infer<typeof NetworkPolicySchema>;

/** `v1.ContainerPort`, the parts named-port resolution needs. */
export const ContainerPortSchema = z.object({
  name: z.optional(z.string()),
  containerPort: z.number().check(z.int()),
  protocol: z.optional(ProtocolSchema),
});

const ContainerSchema = z.object({ ports: z.optional(z.array(ContainerPortSchema)) });

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
 * when absent). Containers are flattened to their ports. Empty lists are one shared
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
    return {
      metadata,
      ...(deletionTimestamp !== undefined
        ? { deleting: { at: deletionTimestamp, graceSeconds: deletionGracePeriodSeconds ?? null } }
        : {}),
      nodeName: p.spec.nodeName,
      hostNetwork: p.spec.hostNetwork ?? false,
      ports,
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
