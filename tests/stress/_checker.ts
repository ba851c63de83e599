/**
 * The stress invariants: the agent's state (`GET /v1/attachments`), the
 * provider's (`GET /v1/enis`) and the kernel's (`ip -j` in the node and each pod
 * namespace, by MAC) must agree with each other and with what the clients were
 * told. A pure function of the three views and the clients' {@linkcode Model},
 * so it is unit-tested without root (checker_test.ts).
 *
 * @module
 */
import type { Attachment } from "../../api/schema.ts";
import type { Eni } from "../../providers/schema.ts";
import { type KernelLink, type KernelView, locate } from "./_kernel.ts";
import type { KeyRecord, Model } from "./_model.ts";

/** Every kind of violation the harness reports, with what it means. */
export const VIOLATION_CLASSES = {
  half_done:
    "an attachment is still adding/deleting after reconcile finished (deleting: but for a DEL answered since the agent started)",
  eni_held_twice: "two attachments record the same ENI",
  unknown_attachment: "an attachment for a key no client ever used",
  provider_owner_unrecorded:
    "the provider shows an ENI owned by a key that holds no such ENI in the state",
  attachment_eni_not_owned:
    "an attachment holds an ENI the provider shows free, owned by another key, or missing",
  device_duplicated: "an ENI's MAC is on more than one link",
  device_in_unknown_namespace:
    "an ENI's device is alive in a namespace that is neither the node nor a pod",
  attachment_device_missing:
    "an attachment's device is neither on the node nor in its pod namespace",
  free_eni_not_on_node: "a free ENI's device is not on the node",
  node_device_dirty: "an ENI device on the node is up or has addresses or routes",
  stray_device_in_pod: "a device sits in a pod namespace without an attachment recording it there",
  ack_add_lost: "an acknowledged ADD (no DEL since, pod alive) has no attachment",
  ack_add_changed: "an acknowledged ADD's attachment now records another ENI",
  ack_add_device:
    "an acknowledged ADD's device is not in its pod as configured (name, up, addresses, routes)",
  ack_del_undone: "an acknowledged DEL's attachment still holds its ENI (ready, recycling or held)",
  refused_add_recorded: "a refused ADD left an attachment",
  unexpected_answer: "an operation got an answer outside the set its situation allows",
  check_failed_intact: "CHECK failed (106) on an attachment that is intact",
  retry_add_changed: "a retried ADD of an acknowledged key answered another ENI",
  agent_start_failed: "the agent did not come back after a kill",
  leak_attachment: "after all pods were deleted and a GC pass ran, an attachment is left",
  leak_owned_eni:
    "after all pods were deleted and a GC pass ran, the provider still shows an ENI owned",
  leak_netns: "after the run, a pod namespace is left",
  host_link_orphan:
    "a host link's node end is on the node but no attachment (but a held one) records it",
  host_link_missing:
    "an acknowledged ADD's host link is not whole: its node end on the node or its pod end in the pod",
  host_link_rule_orphan:
    "a node rule of a host link (priority 1500/1501) names a node end that is gone or that no attachment records",
  host_link_rules_missing:
    "a ready attachment's host link lacks its node rule (priority 1501, its table) for the pod's Service traffic",
  plant_missed: "the checker did not report a planted violation",
  // ---- zone mode (two nodes, one cloud: `_zone_checker.ts`)
  zone_attached_unrecorded:
    "the cloud shows an ENI attached (or attaching) to a node whose agent has no record of it",
  zone_recorded_elsewhere:
    "an agent records an ENI the cloud shows attached to another instance, detached or gone",
  zone_recorded_twice: "two nodes' agents record the same ENI",
  zone_device_on_two_nodes: "an ENI's device is on two nodes at once",
  zone_pod_runs_twice: "a pod has a ready attachment on two nodes",
  zone_parked_without_record:
    "a zone-sticky ENI is detached into the VPC without a parked record (a park or rollback half done)",
  zone_parked_twice: "a sticky pod has two parked ENIs in the cloud",
  zone_parked_listed_twice: "a parked ENI is listed by two nodes' agents",
  zone_cloud_leak:
    "after the final GC and every hold's expiry, the cloud has an ENI no agent and no unexpired park accounts for",
  zone_move_stuck: "a pod's DEL or ADD kept failing past the runtime's retries",
} as const;

/** A violation class. */
export type ViolationClass = keyof typeof VIOLATION_CLASSES;

/** One violation, with what is needed to debug it. */
export interface Violation {
  class: ViolationClass;
  /** What it is about: an attachment key, an ENI id or a MAC. */
  subject: string;
  message: string;
  /** The state, provider and kernel views of the subject and the histories of the keys involved. */
  context: Record<string, unknown>;
}

/** States in which an attachment holds its ENI (`held`: a sticky pod's, device on the node). */
const HOLDING = new Set(["ready", "recycling", "held"]);

/** What {@linkcode checkInvariants} reads. */
export interface CheckViews {
  attachments: Attachment[];
  enis: Eni[];
  kernel: KernelView;
  model: Model;
  /** MACs whose device {@linkcode settleKernel} could not find in any namespace it reads. */
  unaccounted?: string[];
  /** The final check: all pods deleted and a GC pass run, so nothing may be left. */
  final?: { leftoverNetns: string[] };
}

const keyOf = (a: { containerId: string; ifName: string }) => `${a.containerId}/${a.ifName}`;

function sameSet(a: string[], b: string[]): boolean {
  const sa = new Set(a), sb = new Set(b);
  return sa.size === sb.size && [...sa].every((x) => sb.has(x));
}

function linkText(l: KernelLink): string {
  return `${l.ifname} ${l.up ? "UP" : "down"} addrs [${l.globalAddrs.join(" ")}] routes [${
    l.routes.join(", ")
  }]${l.alias ? ` alias ${l.alias}` : ""}`;
}

/** Checks every invariant; returns the violations (empty when all hold). */
export function checkInvariants(v: CheckViews): Violation[] {
  const out: Violation[] = [];
  const { attachments, enis, kernel, model } = v;
  const byKey = new Map(attachments.map((a) => [keyOf(a), a]));
  const eniById = new Map(enis.map((e) => [e.id, e]));
  const eniByMac = new Map(enis.map((e) => [e.mac.toLowerCase(), e]));

  const where = (mac: string) =>
    locate(kernel, mac).map((l) => `${l.ns === "node" ? "node" : l.ns}: ${linkText(l.link)}`);
  /** The histories of the keys involved (the last entries of each). */
  const histories = (keys: string[]) => {
    const h: Record<string, string[]> = {};
    for (const k of new Set(keys)) {
      const r = model.keys.get(k);
      if (r) {
        h[k] = [
          `status ${r.status}${r.reclaimable ? `, reclaimable (${r.reclaimable})` : ""}` +
          `${r.staleExcused ? `, ${r.staleExcused}` : ""}` +
          `, ADDed into netns generation ${r.netnsGen} of pod ${r.pod} (now ${
            model.pods[r.pod].exists ? `generation ${model.pods[r.pod].gen}` : "deleted"
          })`,
          ...r.history.slice(-25).map((e) => `r${e.round} +${e.t}ms ${e.what}`),
        ];
      }
    }
    return h;
  };
  /** Keys whose acknowledged ADD carried `mac` (the latest few). */
  const keysWithMac = (mac: string) =>
    [...model.keys.entries()].filter(([, r]) => r.added?.mac === mac).map(([k]) => k).slice(-3);
  const add = (
    cls: ViolationClass,
    subject: string,
    message: string,
    ctx: { keys?: string[]; mac?: string; attachment?: Attachment; eni?: Eni; extra?: unknown },
  ) => {
    const mac = ctx.mac?.toLowerCase();
    const keys = [...(ctx.keys ?? []), ...(mac ? keysWithMac(mac) : [])];
    out.push({
      class: cls,
      subject,
      message,
      context: {
        ...(ctx.attachment ? { attachment: ctx.attachment } : {}),
        ...(ctx.eni ? { providerEni: ctx.eni } : {}),
        ...(mac ? { kernel: where(mac) } : {}),
        ...(ctx.extra !== undefined ? { more: ctx.extra } : {}),
        histories: histories(keys),
      },
    });
  };

  // DELs acknowledged since the agent started may still be finishing (a DEL answers
  // before its device is home, and the views are read each at its own moment): their
  // record may be `deleting`, or gone while the provider, the kernel or the host link
  // still show the step before.
  const finishing = new Map(
    [...model.keys].filter(([, r]) => r.status === "deleted" && r.finishing),
  );
  /** Whether `mac` in namespace `path` is the device of a DEL still finishing. */
  const finishingDevice = (mac: string, path?: string) =>
    [...finishing.values()].some((r) =>
      r.added?.mac === mac.toLowerCase() && (path === undefined || r.netns === path)
    );

  // ---- the state alone
  const holders = new Map<string, Attachment[]>();
  for (const a of attachments) {
    if (a.state === "deleting" && finishing.has(keyOf(a))) {
      // Its answered DEL is bringing the device home.
    } else if (a.state === "adding" || a.state === "deleting") {
      add("half_done", keyOf(a), `Attachment "${keyOf(a)}" is left "${a.state}"`, {
        keys: [keyOf(a)],
        attachment: a,
        mac: a.mac ?? undefined,
      });
    }
    if (!model.keys.has(keyOf(a))) {
      add("unknown_attachment", keyOf(a), `Attachment "${keyOf(a)}" was never asked for`, {
        attachment: a,
      });
    }
    if (a.eniId) holders.set(a.eniId, [...(holders.get(a.eniId) ?? []), a]);
  }
  for (const [eni, hs] of holders) {
    if (hs.length > 1) {
      add("eni_held_twice", eni, `ENI "${eni}" is recorded for ${hs.map(keyOf).join(" and ")}`, {
        keys: hs.map(keyOf),
        mac: hs[0].mac ?? undefined,
        extra: hs,
      });
    }
  }

  // ---- state vs provider
  for (const e of enis) {
    if (!e.owner) continue;
    const k = keyOf(e.owner);
    const a = byKey.get(k);
    if (!a && finishing.has(k)) continue;
    if (!a || a.eniId !== e.id) {
      add(
        "provider_owner_unrecorded",
        e.id,
        `The provider shows ENI "${e.id}" owned by "${k}", but the state ${
          a ? `records "${a.eniId}" for that key` : "has no attachment for that key"
        }`,
        { keys: [k], eni: e, mac: e.mac, attachment: a },
      );
    }
  }
  for (const a of attachments) {
    if (!HOLDING.has(a.state)) continue;
    const e = a.eniId ? eniById.get(a.eniId) : undefined;
    if (!e?.owner || keyOf(e.owner) !== keyOf(a)) {
      add(
        "attachment_eni_not_owned",
        keyOf(a),
        `Attachment "${keyOf(a)}" (${a.state}) holds ENI "${a.eniId}" but the provider shows it ${
          e?.owner ? `owned by "${keyOf(e.owner)}"` : e ? "free" : "missing"
        }`,
        { keys: [keyOf(a)], attachment: a, eni: e, mac: a.mac ?? undefined },
      );
    }
  }

  // ---- the kernel, by MAC
  for (const mac of v.unaccounted ?? []) {
    add(
      "device_in_unknown_namespace",
      mac,
      `The device of MAC ${mac} is alive (its VPC end exists) but no link in the node or a pod carries ` +
        `that MAC: it sits in another namespace, or its MAC was changed`,
      { mac, eni: eniByMac.get(mac) },
    );
  }
  for (const e of enis) {
    const mac = e.mac.toLowerCase();
    const at = locate(kernel, mac);
    if (at.length > 1) {
      add("device_duplicated", e.id, `MAC ${mac} of ENI "${e.id}" is on ${at.length} links`, {
        mac,
        eni: e,
      });
    }
    const recorded = attachments.filter((a) => a.eniId === e.id || a.mac === mac);
    if (!e.owner && recorded.length === 0 && !finishingDevice(mac)) {
      const onNode = at.filter((l) => l.ns === "node");
      if (onNode.length === 0) {
        add(
          "free_eni_not_on_node",
          e.id,
          `ENI "${e.id}" is free but its device (MAC ${mac}) is ${
            at.length ? `in ${at.map((l) => l.ns).join(", ")}` : "nowhere"
          }`,
          { mac, eni: e },
        );
      }
    }
    for (const l of at.filter((x) => x.ns === "node")) {
      const dirty = l.link.up || l.link.addrs.length > 0 || l.link.routes.length > 0;
      if (dirty) {
        add(
          "node_device_dirty",
          e.id,
          `The device of ENI "${e.id}" on the node is ${
            linkText(l.link)
          } (expected down, no addresses)`,
          { mac, eni: e, keys: recorded.map(keyOf) },
        );
      }
    }
  }
  for (const a of attachments) {
    if (!HOLDING.has(a.state)) continue;
    if (!a.mac) continue;
    const at = locate(kernel, a.mac);
    // A held ENI waits for its sticky pod on the node; the others are in their pod or back.
    const usable = at.filter((l) => l.ns === "node" || (l.ns === a.netns && a.state !== "held"));
    if (usable.length === 0) {
      const pod = kernel.pods.get(a.netns);
      add(
        "attachment_device_missing",
        keyOf(a),
        `Attachment "${
          keyOf(a)
        }" (${a.state}) holds ENI "${a.eniId}" but its device (MAC ${a.mac}) ` +
          `is ${at.length ? `only in ${at.map((l) => l.ns).join(", ")}` : "nowhere"}, ` +
          `while its pod namespace ${pod?.exists ? "still exists" : "is gone"}`,
        {
          keys: [keyOf(a)],
          attachment: a,
          mac: a.mac,
          eni: a.eniId ? eniById.get(a.eniId) : undefined,
        },
      );
    }
  }
  // A held attachment's link went with its DEL: only the others may have one.
  const linked = attachments.filter((a) => a.hostLink && a.state !== "held");
  for (const pod of kernel.pods.values()) {
    for (const l of pod.links) {
      const rec = attachments.find((a) =>
        a.mac === l.mac && a.netns === pod.path && a.state !== "held"
      ) ?? linked.find((a) => a.hostLink!.podIfName === l.ifname && a.netns === pod.path);
      if (!rec && !finishingDevice(l.mac, pod.path)) {
        const e = eniByMac.get(l.mac);
        const elsewhere = attachments.filter((a) => a.mac === l.mac);
        add(
          "stray_device_in_pod",
          e?.id ?? l.mac,
          `Pod namespace ${pod.path} holds ${linkText(l)} (MAC ${l.mac}${
            e ? `, ENI "${e.id}" ${e.owner ? `owned by "${keyOf(e.owner)}"` : "free"}` : ""
          }) but no attachment records it there${
            elsewhere.length
              ? ` (recorded for ${elsewhere.map((a) => `"${keyOf(a)}" in ${a.netns}`).join(", ")})`
              : ""
          }`,
          { mac: l.mac, eni: e, keys: elsewhere.map(keyOf) },
        );
      }
    }
  }

  // ---- host links: every node end on the node belongs to an attachment that has one
  for (const l of kernel.node.links.filter((x) => x.nodeEnd)) {
    const owner = attachments.find((a) => a.hostLink?.nodeIfName === l.ifname);
    // A DEL still finishing removes its link (with the device, or after a hold's answer).
    const ownKey = owner ? keyOf(owner) : l.alias?.startsWith("enim:") ? l.alias.slice(5) : null;
    if (ownKey !== null && finishing.has(ownKey)) continue;
    if (!owner || owner.state === "held") {
      add(
        "host_link_orphan",
        l.ifname,
        `Host link node end ${linkText(l)} is on the node but ${
          owner
            ? `its attachment "${keyOf(owner)}" is held (its DEL removes the link)`
            : "no attachment records it"
        }`,
        { ...(owner ? { keys: [keyOf(owner)], attachment: owner } : {}), extra: l },
      );
    }
  }

  // ---- host-link rules on the node: each names a node end an attachment records, and
  // each ready attachment's link has its rule to its table (links of the layout before
  // issue 34 record no table and have none)
  for (const r of kernel.nodeRules ?? []) {
    const owner = r.iif === null
      ? undefined
      : attachments.find((a) => a.hostLink?.nodeIfName === r.iif);
    if (r.detached && owner?.state === "deleting") continue; // its DEL is removing them
    // A DEL still finishing removes its link's rules with the link (as for the link above).
    const link = r.iif === null
      ? undefined
      : kernel.node.links.find((x) => x.nodeEnd && x.ifname === r.iif);
    const linkKey = owner
      ? keyOf(owner)
      : link?.alias?.startsWith("enim:")
      ? link.alias.slice(5)
      : null;
    if (linkKey !== null && finishing.has(linkKey)) continue;
    if (r.detached || !owner) {
      add(
        "host_link_rule_orphan",
        `${r.iif ?? "?"}@${r.priority}/${r.family}`,
        `Node rule pref ${r.priority} (IPv${r.family}, iif ${r.iif ?? "none"}, lookup ${r.table}) ${
          r.detached ? "names a node end that is gone" : "names a node end no attachment records"
        }`,
        { extra: r },
      );
    }
  }
  for (const a of attachments) {
    const table = a.hostLink?.table;
    if (a.state !== "ready" || table === undefined) continue;
    const has = (kernel.nodeRules ?? []).some((r) =>
      r.priority === 1501 && r.iif === a.hostLink!.nodeIfName && r.table === String(table)
    );
    if (!has) {
      add(
        "host_link_rules_missing",
        keyOf(a),
        `Attachment "${keyOf(a)}" is ready but the node has no rule pref 1501 iif ${
          a.hostLink!.nodeIfName
        } lookup ${table}`,
        { keys: [keyOf(a)], attachment: a },
      );
    }
  }

  // ---- what the clients were told
  for (const [k, r] of model.keys) {
    const a = byKey.get(k);
    if (model.mustBeIntact(r)) checkIntact(k, r, a);
    // A DEL whose release failed answers 0 and leaves the record `deleting` with the error for
    // the agent to finish (docs/faults.md): only a record still holding the ENI is undone.
    else if (r.status === "deleted" && a && !r.delDeferred && a.state !== "deleting") {
      add(
        "ack_del_undone",
        k,
        `DEL of "${k}" was acknowledged but the attachment is recorded (${a.state})`,
        {
          keys: [k],
          attachment: a,
          mac: a.mac ?? undefined,
        },
      );
    } else if (r.status === "refused" && a) {
      add(
        "refused_add_recorded",
        k,
        `ADD of "${k}" was refused but left an attachment (${a.state})`,
        {
          keys: [k],
          attachment: a,
          mac: a.mac ?? undefined,
        },
      );
    }
  }

  function checkIntact(k: string, r: KeyRecord, a: Attachment | undefined) {
    const want = r.added!;
    const pod = model.pods[r.pod];
    if (!a) {
      add(
        "ack_add_lost",
        k,
        `ADD of "${k}" was acknowledged (ENI MAC ${want.mac}) but no attachment is recorded`,
        {
          keys: [k],
          mac: want.mac,
          eni: eniByMac.get(want.mac),
        },
      );
      return;
    }
    if (a.mac !== want.mac) {
      add(
        "ack_add_changed",
        k,
        `ADD of "${k}" answered MAC ${want.mac} but the attachment records ${a.mac}`,
        {
          keys: [k],
          attachment: a,
          mac: want.mac,
        },
      );
      return;
    }
    const inPod = kernel.pods.get(pod.path)?.links.find((l) => l.mac === want.mac);
    const problems: string[] = [];
    if (!inPod) {
      const at = locate(kernel, want.mac);
      problems.push(
        `its device is not in ${pod.path} but ${
          at.length ? `in ${at.map((l) => l.ns).join(", ")}` : "nowhere"
        }`,
      );
    } else {
      if (inPod.ifname !== r.ifName) problems.push(`named "${inPod.ifname}", not "${r.ifName}"`);
      if (!inPod.up) problems.push("down");
      if (!sameSet(inPod.globalAddrs, want.ips)) {
        problems.push(
          `addresses [${inPod.globalAddrs.join(" ")}], expected [${want.ips.join(" ")}]`,
        );
      }
      const missing = want.routes.filter((rt) => !inPod.routes.includes(rt));
      if (missing.length) problems.push(`routes lack ${missing.join(", ")}`);
    }
    if (want.hostLink) {
      const hl = want.hostLink;
      const nodeEnd = kernel.node.links.find((l) => l.ifname === hl.nodeIfName && l.nodeEnd);
      const podEnd = kernel.pods.get(pod.path)?.links.find((l) => l.ifname === hl.podIfName);
      const lacks = [
        ...(nodeEnd?.up
          ? []
          : [`its node end "${hl.nodeIfName}" ${nodeEnd ? "is down" : "is gone"}`]),
        ...(podEnd?.up && podEnd.mac === hl.podMac ? [] : [
          `its pod end "${hl.podIfName}" ${podEnd ? "is not the link's (or down)" : "is gone"}`,
        ]),
      ];
      if (lacks.length) {
        add(
          "host_link_missing",
          k,
          `ADD of "${k}" was acknowledged with a host link but ${lacks.join("; ")}`,
          { keys: [k], attachment: a, mac: want.mac },
        );
      }
    }
    if (problems.length) {
      add("ack_add_device", k, `ADD of "${k}" was acknowledged but ${problems.join("; ")}`, {
        keys: [k],
        attachment: a,
        mac: want.mac,
      });
    }
  }

  // ---- after the final GC pass
  if (v.final) {
    for (const a of attachments) {
      add(
        "leak_attachment",
        keyOf(a),
        `Attachment "${keyOf(a)}" (${a.state}) is left after the final GC`,
        {
          keys: [keyOf(a)],
          attachment: a,
          mac: a.mac ?? undefined,
        },
      );
    }
    for (const e of enis.filter((x) => x.owner)) {
      add(
        "leak_owned_eni",
        e.id,
        `ENI "${e.id}" is still owned by "${keyOf(e.owner!)}" after the final GC`,
        {
          keys: [keyOf(e.owner!)],
          eni: e,
          mac: e.mac,
        },
      );
    }
    for (const ns of v.final.leftoverNetns) {
      add("leak_netns", ns, `Namespace "${ns}" is left after the run`, {});
    }
  }
  return out;
}
