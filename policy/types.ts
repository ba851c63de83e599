/**
 * The compiled policy of one local pod, as zod schemas (the agent serves it to
 * `enim policy` and `enim status`; the schema is the one source of the type).
 *
 * A direction (ingress, egress) is isolated or not; when isolated, its entries are
 * what it admits, each a peer (a set named by a stable key, or any address) and port
 * matchers (or every protocol and port). The sets carry their current members, so that
 * a change of one pod's labels or addresses changes a set's elements and never the
 * rules: see {@linkcode SetDelta}.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { ProtocolSchema } from "../kube/objects.ts";

const Port = z.number().check(z.int(), z.gte(0), z.lte(65535));

/**
 * What an entry admits of one protocol: every port (`port` absent), one port, a range
 * (`port`..`endPort`), or, with `name`, the port each member of the entry's named-port
 * set gives that name (the set's elements are address and port pairs).
 */
export const PortMatcherSchema = z.object({
  protocol: ProtocolSchema,
  port: z.optional(Port),
  endPort: z.optional(Port),
  name: z.optional(z.string()),
});
/** A port matcher. */
export type PortMatcher = z.infer<typeof PortMatcherSchema>;

/**
 * One allowed (peer, ports) pair: `peer` is a set's key (null: any address), `ports`
 * the matchers (null: every protocol and port, ICMP included).
 */
export const EntrySchema = z.object({
  peer: z.nullable(z.string()),
  ports: z.nullable(z.array(PortMatcherSchema)),
});
/** An allowed (peer, ports) pair. */
export type Entry = z.infer<typeof EntrySchema>;

/** One direction: isolated (some policy applies to it) and what it admits. */
export const DirectionSchema = z.object({
  isolated: z.boolean(),
  entries: z.array(EntrySchema),
});
/** One direction of a compiled policy. */
export type Direction = z.infer<typeof DirectionSchema>;

/** An address and port (an element of a named-port set). */
export const AddrPortSchema = z.object({ addr: z.string(), port: Port });
/** An address and port. */
export type AddrPort = z.infer<typeof AddrPortSchema>;

const Addrs = z.array(z.string());

/**
 * A peer set: `pods` (the addresses of the pods a selector pair selects), `ipBlock`
 * (disjoint prefixes: the block minus its excepts) or `namedPort` (address and port of
 * each selected pod's container port of that name and protocol). `text` says what it is.
 */
export const PeerSetSchema = z.discriminatedUnion("kind", [
  z.object({
    key: z.string(),
    kind: z.literal("pods"),
    text: z.string(),
    ipv4: Addrs,
    ipv6: Addrs,
  }),
  z.object({
    key: z.string(),
    kind: z.literal("ipBlock"),
    text: z.string(),
    ipv4: Addrs,
    ipv6: Addrs,
  }),
  z.object({
    key: z.string(),
    kind: z.literal("namedPort"),
    text: z.string(),
    protocol: ProtocolSchema,
    portName: z.string(),
    ipv4: z.array(AddrPortSchema),
    ipv6: z.array(AddrPortSchema),
  }),
]);
/** A peer set with its current members. */
export type PeerSet = z.infer<typeof PeerSetSchema>;
/** The kinds of peer set. */
export type PeerSetKind = PeerSet["kind"];

/**
 * A policy that selects the pod: which directions it applies to, how many rules each
 * has, and, when enim cannot read it, why (it then isolates and admits nothing).
 */
export const SelectingPolicySchema = z.object({
  name: z.string(),
  ingress: z.boolean(),
  egress: z.boolean(),
  ingressRules: z.number().check(z.int()),
  egressRules: z.number().check(z.int()),
  unreadable: z.optional(z.string()),
});
/** A policy selecting the pod. */
export type SelectingPolicy = z.infer<typeof SelectingPolicySchema>;

const Family = z.object({ ipv4: Addrs, ipv6: Addrs });

/** The effective policy of one local pod. */
export const CompiledPolicySchema = z.object({
  /** The pod and its own addresses (always allowed: a pod never blocks itself). */
  pod: z.object({ namespace: z.string(), name: z.string(), ipv4: Addrs, ipv6: Addrs }),
  /** The node's addresses (always allowed both ways). */
  node: Family,
  ingress: DirectionSchema,
  egress: DirectionSchema,
  /** Every set an entry names, sorted by key. */
  sets: z.array(PeerSetSchema),
  /** The policies of the pod's namespace that select it, by name. */
  policies: z.array(SelectingPolicySchema),
  /** What of those policies was ignored, and why (an invalid CIDR, an unresolvable named port). */
  warnings: z.array(z.string()),
});
/** The effective policy of one local pod. */
export type CompiledPolicy = z.infer<typeof CompiledPolicySchema>;

/** Elements to add and delete, per family (addresses, prefixes, or address and port). */
const Edit = <T extends z.core.$ZodType>(el: T) =>
  z.object({ add: z.array(el), delete: z.array(el) });

/**
 * A change of one set's members: apply it (`add element`/`delete element`) to every
 * table that holds the set; `users` are the local pods whose tables hold it (the node's
 * table holds every set of every local pod).
 */
export const SetDeltaSchema = z.discriminatedUnion("kind", [
  z.object({
    key: z.string(),
    kind: z.enum(["pods", "ipBlock"]),
    users: z.array(z.string()),
    ipv4: Edit(z.string()),
    ipv6: Edit(z.string()),
  }),
  z.object({
    key: z.string(),
    kind: z.literal("namedPort"),
    users: z.array(z.string()),
    ipv4: Edit(AddrPortSchema),
    ipv6: Edit(AddrPortSchema),
  }),
]);
/** A change of one set's members. */
export type SetDelta = z.infer<typeof SetDeltaSchema>;
