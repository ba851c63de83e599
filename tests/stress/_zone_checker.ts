/**
 * The cross-node invariants of zone-wide sticky pods (issue 26), checked from
 * the cloud's side (the fake BCE's ENIs) and the kernel's (every node's
 * namespace and pod namespaces), beside each node's own invariants
 * (`_checker.ts`). {@linkcode checkZone} is a pure function of the views, so it
 * is unit-tested without root (zone_checker_test.ts); {@linkcode readZoneViews}
 * reads them from a running {@linkcode ZoneCluster}.
 *
 * The stress cloud holds only the cluster's ENIs (nothing foreign), so every ENI
 * attached to a node's instance must be that node's agent's.
 *
 * @module
 */
import type { Attachment } from "../../api/schema.ts";
import type { Eni, ParkedEni } from "../../providers/schema.ts";
import type { FakeEni } from "../support/bce_fake.ts";
import type { ZoneCluster } from "../support/zone_cluster.ts";
import { decodeRecord } from "../../providers/bce/_sticky.ts";
import { type KernelView, locate, readKernel, readVpcEnds } from "./_kernel.ts";
import type { Violation } from "./_checker.ts";

/** What one node's agent reports (null in {@linkcode ZoneNodeView} while it is down). */
export interface ZoneAgentView {
  attachments: Attachment[];
  enis: Eni[];
  /** The ENIs it lists as parking or parked by it (`enim status`). */
  parked: ParkedEni[];
  /** Claims in flight. */
  claiming: number;
}

/** One node as the cross-node checks see it. */
export interface ZoneNodeView {
  label: string;
  instanceId: string;
  agent: ZoneAgentView | null;
  /** Its node namespace and its pods' namespaces. */
  kernel: KernelView;
}

/** Everything {@linkcode checkZone} reads. */
export interface ZoneViews {
  /** The cloud's ENIs. */
  cloud: FakeEni[];
  nodes: ZoneNodeView[];
  /**
   * MACs whose VPC end existed all through the read (before the first namespace was
   * read and after the last) while no node or pod namespace of any node showed the
   * device ({@linkcode unaccountedDevices}).
   */
  unaccounted: string[];
  /** The time of the views (epoch ms), for parked holds. */
  now: number;
  /** After every pod was deleted, the final GC ran and every hold expired: nothing may be left. */
  final?: boolean;
}

const keyOf = (a: { containerId: string; ifName: string }) => `${a.containerId}/${a.ifName}`;

/** Checks the cross-node invariants; returns the violations (empty when all hold). */
export function checkZone(v: ZoneViews): Violation[] {
  const out: Violation[] = [];
  const add = (
    cls: Violation["class"],
    subject: string,
    message: string,
    context: Record<string, unknown>,
  ) => out.push({ class: cls, subject, message, context });
  const cloudById = new Map(v.cloud.map((e) => [e.eniId, e]));
  const nodeOf = new Map(v.nodes.map((n) => [n.instanceId, n]));
  const up = v.nodes.filter((n) => n.agent !== null);

  // ---- the cloud's side: every attached ENI is recorded by its node's agent
  for (const e of v.cloud) {
    const node = nodeOf.get(e.instanceId);
    if (!node?.agent || (e.status !== "inuse" && e.status !== "attaching")) continue;
    const a = node.agent;
    const recorded = a.enis.some((x) => x.id === e.eniId) ||
      a.parked.some((p) => p.eniId === e.eniId && p.state === "parking") ||
      (e.status === "attaching" && a.claiming > 0);
    if (!recorded) {
      add(
        "zone_attached_unrecorded",
        e.eniId,
        `ENI "${e.eniId}" is ${e.status} on instance "${e.instanceId}" (node ${node.label}), ` +
          `whose agent has no record of it`,
        { cloud: e, record: decodeRecord(e.description) },
      );
    }
  }

  // ---- the agents' side: an ENI recorded by one node at most, and where the cloud has it
  const recordedBy = new Map<string, string[]>();
  for (const n of up) {
    for (const x of n.agent!.enis) {
      recordedBy.set(x.id, [...(recordedBy.get(x.id) ?? []), n.label]);
      if (x.cloudState !== "ok") continue;
      const e = cloudById.get(x.id);
      if (!e || e.instanceId !== n.instanceId) {
        add(
          "zone_recorded_elsewhere",
          x.id,
          `Node ${n.label}'s agent records ENI "${x.id}" (${
            x.owner ? `owned by "${keyOf(x.owner)}"` : "free"
          }) but the cloud shows it ${
            e ? (e.instanceId ? `${e.status} on "${e.instanceId}"` : e.status) : "gone"
          }`,
          { recorded: x, cloud: e ?? null },
        );
      }
    }
  }
  for (const [id, labels] of recordedBy) {
    if (labels.length > 1) {
      add("zone_recorded_twice", id, `ENI "${id}" is recorded by nodes ${labels.join(" and ")}`, {
        cloud: cloudById.get(id) ?? null,
      });
    }
  }

  // ---- the kernels: an ENI's device on one node at most
  for (const e of v.cloud) {
    const on = v.nodes.filter((n) => locate(n.kernel, e.macAddress).length > 0);
    if (on.length > 1) {
      add(
        "zone_device_on_two_nodes",
        e.eniId,
        `The device of ENI "${e.eniId}" (MAC ${e.macAddress}) is on nodes ${
          on.map((n) => n.label).join(" and ")
        }`,
        { cloud: e },
      );
    }
  }
  for (const mac of v.unaccounted) {
    const e = v.cloud.find((x) => x.macAddress.toLowerCase() === mac);
    add(
      "device_in_unknown_namespace",
      mac,
      `The device of MAC ${mac} is alive (its VPC end exists) but no node or pod namespace ` +
        `of any node carries that MAC`,
      { cloud: e ?? null },
    );
  }

  // ---- a pod runs (a ready attachment) on one node at most
  const runs = new Map<string, string[]>();
  for (const n of up) {
    for (const a of n.agent!.attachments) {
      if (a.state !== "ready" || !a.pod) continue;
      const pod = `${a.pod}/${a.ifName}`;
      runs.set(pod, [...(runs.get(pod) ?? []), `${n.label} (${keyOf(a)}, ${a.eniId})`]);
    }
  }
  for (const [pod, where] of runs) {
    if (where.length > 1) {
      add("zone_pod_runs_twice", pod, `Pod ${pod} runs on ${where.join(" and ")}`, {});
    }
  }

  // ---- parked ENIs: one record each, listed by one agent at most
  const parkedByName = new Map<string, string[]>();
  for (const e of v.cloud) {
    const r = decodeRecord(e.description);
    if (e.status === "available" && r?.state !== "parked" && !v.final) {
      // Detached and not parked: a park or a claim's rollback left half done.
      if (r !== null || e.name.includes("/z/")) {
        add(
          "zone_parked_without_record",
          e.eniId,
          `ENI "${e.eniId}" (${e.name}) is detached into the VPC but its description is ${
            r ? `a record of state "${r.state}"` : "no parked record"
          }: "${e.description}"`,
          { cloud: e },
        );
      }
    }
    if (r?.state === "parked") {
      parkedByName.set(e.name, [...(parkedByName.get(e.name) ?? []), e.eniId]);
    }
  }
  for (const [name, ids] of parkedByName) {
    if (ids.length > 1) {
      add(
        "zone_parked_twice",
        name,
        `Sticky name "${name}" has ${ids.length} parked ENIs: ${ids.join(", ")}`,
        {},
      );
    }
  }
  const listers = new Map<string, string[]>();
  for (const n of up) {
    for (const p of n.agent!.parked) {
      if (p.state === "parked") listers.set(p.eniId, [...(listers.get(p.eniId) ?? []), n.label]);
    }
  }
  for (const [id, labels] of listers) {
    if (labels.length > 1) {
      add(
        "zone_parked_listed_twice",
        id,
        `Parked ENI "${id}" is listed by nodes ${labels.join(" and ")}`,
        { cloud: cloudById.get(id) ?? null },
      );
    }
  }

  // ---- after the final GC and every hold's expiry: nothing leaks
  if (v.final) {
    for (const e of v.cloud) {
      const node = nodeOf.get(e.instanceId);
      const r = decodeRecord(e.description);
      const unexpired = e.status === "available" && r?.state === "parked" &&
        (r.until ?? 0) > v.now;
      const onNode = node?.agent?.enis.some((x) => x.id === e.eniId) ?? false;
      if (!unexpired && !onNode) {
        add(
          "zone_cloud_leak",
          e.eniId,
          `ENI "${e.eniId}" (${e.name}) is ${e.status}${
            e.instanceId ? ` on "${e.instanceId}"` : ""
          } after the final GC and expiry, and no agent nor unexpired park accounts for it`,
          { cloud: e, record: r },
        );
      }
    }
  }
  return out;
}

/**
 * The devices no namespace accounts for: the MACs whose VPC end is in both `before`
 * and `after` (read before the first namespace of `kernels` and after the last) and
 * in no node or pod namespace of any of them. The namespaces are read one after the
 * other, not at one instant, so a device plugged or unplugged meanwhile (its VPC end
 * in one of the two reads only) may be missing from every namespace without being
 * lost; one alive through the whole read and shown by none is.
 */
export function unaccountedDevices(
  before: ReadonlySet<string>,
  after: ReadonlySet<string>,
  kernels: KernelView[],
): string[] {
  const seen = new Set<string>();
  for (const k of kernels) {
    for (const l of k.node.links) seen.add(l.mac);
    for (const p of k.pods.values()) for (const l of p.links) seen.add(l.mac);
  }
  return [...before].filter((m) => after.has(m) && !seen.has(m));
}

/**
 * Reads the views of every node of `cluster` (an agent that does not answer counts
 * as down) and the cloud; `podNames` lists each node's pod namespaces to read
 * (default: the ones its VPC made and did not delete).
 */
export async function readZoneViews(
  cluster: ZoneCluster,
  o: { podNames?: (label: string) => string[]; final?: boolean } = {},
): Promise<ZoneViews> {
  const nodes: ZoneNodeView[] = [];
  const vpcName = cluster.a.vpc.vpc.name;
  const before = await readVpcEnds(vpcName);
  for (const n of cluster.nodes) {
    const names = o.podNames?.(n.label) ?? n.node.vpc.pods.map((p) => p.name);
    let agent: ZoneAgentView | null = null;
    if (n.node.agentPid !== null) {
      const [attachments, enis, status] = await Promise.all([
        n.node.client.attachments(),
        n.node.client.enis(),
        n.node.client.status(),
      ]);
      agent = {
        attachments,
        enis,
        parked: status.sticky.parked,
        claiming: Number(status.providerDetails.claiming ?? 0),
      };
    }
    nodes.push({
      label: n.label,
      instanceId: n.instanceId,
      agent,
      kernel: await readKernel(n.node.vpc.node.name, vpcName, names),
    });
  }
  const after = await readVpcEnds(vpcName);
  const cloud = (await cluster.fake.state()).enis;
  return {
    cloud,
    nodes,
    unaccounted: unaccountedDevices(before, after, nodes.map((n) => n.kernel)),
    now: Date.now(),
    ...(o.final ? { final: true } : {}),
  };
}
