/**
 * What operators see of the enforcer: `GET /v1/status`'s policy part, `enim policy`'s
 * view of a pod, the rule counts and the drop counters of the metrics.
 *
 * @module
 */
import type { PodPolicyView, PolicyStatus } from "../../api/schema.ts";
import type { DeviceLayer } from "../../netns/types.ts";
import type { InformerStats } from "../../kube/mod.ts";
import {
  type CompiledPolicy,
  nodeNames,
  parseDropCounters,
  POLICY_TABLE,
  type UnreadablePolicy,
} from "../../policy/mod.ts";
import type { Att } from "./_attachment.ts";
import type { TableLoads } from "./_table_loads.ts";

const TABLE = `inet ${POLICY_TABLE}`;

/** A dropped-packet count of one pod, direction and place. */
export interface PolicyDrops {
  pod: string;
  direction: "ingress" | "egress";
  place: "pod" | "node";
  packets: number;
}

/** What {@linkcode policyStatus} reads. */
export interface StatusInput {
  synced: boolean;
  pendingEvents: number;
  loadFailures: number;
  caches: InformerStats[];
  enforcedRv(resource: string): string | null;
  atts: Iterable<Att>;
  /** The cluster's policies the agent cannot read (`agent/policy_unreadable.ts`). */
  unreadable: UnreadablePolicy[];
  /** Why a pod can reach past its policy (`_raw.ts`; null: it cannot). */
  bypass(pod: string, c: CompiledPolicy | null): string | null;
  /** The node's raw-socket guard. */
  rawSocketGuard: { on: boolean; why: string };
  /** The node's table is to be rendered again (a failed load), or was found missing or changed. */
  nodeStale?: boolean;
}

/** The enforcer's state for `GET /v1/status`. */
export function policyStatus(s: StatusInput): PolicyStatus {
  const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());
  return {
    synced: s.synced,
    pendingEvents: s.pendingEvents,
    loadFailures: s.loadFailures,
    caches: s.caches.map((c) => ({
      resource: c.resource,
      synced: c.synced,
      objects: c.objects,
      relists: c.relists,
      watchRestarts: c.watchRestarts,
      errors: c.errors,
      lastError: c.lastError,
      lastEventAt: iso(c.lastEventAt),
      bookmarks: c.bookmarkSupport,
      silentWatches: c.silentWatches,
      enforcedResourceVersion: s.enforcedRv(c.resource),
    })),
    pods: [...s.atts].sort((a, b) => a.pod.localeCompare(b.pod)).map((a) => {
      const c = a.registered ? a.compiled : null;
      return {
        pod: a.pod,
        key: a.key,
        nodeIfName: a.nodeEnd,
        policies: c?.policies.length ?? 0,
        ingressIsolated: c?.ingress.isolated ?? false,
        egressIsolated: c?.egress.isolated ?? false,
        state: !s.synced
          ? "waiting"
          : a.unknown
          ? "unknown"
          : a.stale || a.broken || (s.nodeStale && a.nodeChains)
          ? "retrying"
          : "enforced",
        bypass: s.bypass(a.pod, c),
      };
    }),
    unreadable: s.unreadable,
    rawSocketGuard: s.rawSocketGuard,
  };
}

/** Per pod and direction, how many rules its policy has (metrics). */
export function ruleCounts(
  atts: Iterable<Att>,
): { pod: string; direction: "ingress" | "egress"; rules: number }[] {
  const out: { pod: string; direction: "ingress" | "egress"; rules: number }[] = [];
  const seen = new Set<string>();
  for (const a of atts) {
    if (seen.has(a.pod) || !a.registered) continue;
    seen.add(a.pod);
    const c = a.compiled;
    if (!c) continue;
    for (const d of ["ingress", "egress"] as const) {
      out.push({ pod: a.pod, direction: d, rules: c[d].isolated ? c[d].entries.length : 0 });
    }
  }
  return out;
}

/** The drop counters of every local pod, in its namespace and at its node end. */
export async function readDrops(
  devices: DeviceLayer,
  loads: TableLoads,
  all: Att[],
): Promise<PolicyDrops[]> {
  const out: PolicyDrops[] = [];
  const atts = all.filter((a) => a.netns !== null && !a.noTable);
  await Promise.all(atts.map((a) =>
    loads.podLoads.run(async () => {
      try {
        const json = await devices.listCounters(a.netns, TABLE);
        for (const c of parseDropCounters(json)) {
          out.push({ pod: a.pod, direction: c.direction, place: "pod", packets: c.packets });
        }
      } catch { /* a namespace going away: no counters */ }
    })
  ));
  try {
    const byLink = new Map(all.map((a) => [nodeNames(a.nodeEnd).ingress.slice(3), a.pod]));
    for (const c of parseDropCounters(await devices.listCounters(null, TABLE))) {
      const pod = c.link ? byLink.get(c.link) : undefined;
      if (pod) out.push({ pod, direction: c.direction, place: "node", packets: c.packets });
    }
  } catch { /* no table on the node yet */ }
  return out;
}

/** What `enim policy` shows of a compiled policy. */
export function policyView(c: CompiledPolicy): PodPolicyView {
  const direction = (d: CompiledPolicy["ingress"]) => ({
    isolated: d.isolated,
    rules: d.entries.map((e) => {
      const set = e.peer === null ? undefined : c.sets.find((s) => s.key === e.peer);
      const ports = e.ports === null
        ? ["any"]
        : e.ports.map((m) =>
          m.name !== undefined
            ? `${m.protocol} port ${m.name}`
            : m.port === undefined
            ? `${m.protocol} any port`
            : m.endPort !== undefined
            ? `${m.protocol} ${m.port}-${m.endPort}`
            : `${m.protocol} ${m.port}`
        );
      if (!set) return { kind: "any" as const, peer: "any address", ports, members: [] };
      const members = set.kind === "namedPort"
        ? [...set.ipv4, ...set.ipv6].map((m) => `${m.addr} ${m.port}`)
        : [...set.ipv4, ...set.ipv6];
      return { kind: set.kind, peer: set.text, ports, members };
    }),
  });
  return {
    pod: `${c.pod.namespace}/${c.pod.name}`,
    addresses: [...c.pod.ipv4, ...c.pod.ipv6],
    nodeAddresses: [...c.node.ipv4, ...c.node.ipv6],
    policies: c.policies,
    ingress: direction(c.ingress),
    egress: direction(c.egress),
    warnings: c.warnings,
    rawSocketGuard: false,
    bypass: null,
  };
}
