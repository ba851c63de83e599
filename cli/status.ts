/**
 * `enim status`: the node's ENIs and pool counts, from the agent's `GET /v1/status`.
 *
 * @module
 */
import { Command } from "@commander-js/extra-typings";
import type { Status } from "../api/schema.ts";
import type { CliIo } from "./io.ts";
import { type Column, formatAge, renderTable, shortId } from "./_table.ts";
import { reportAgentError, SOCKET_HELP, socketPath } from "./_agent.ts";

type Row = Status["enis"][number];

const COLUMNS: Column<Row>[] = [
  { header: "ENI", cell: (e) => e.id },
  { header: "MAC", cell: (e) => e.mac },
  { header: "DEVICE", cell: (e) => e.device ?? e.attachment?.nodeName },
  { header: "IPV4", cell: (e) => e.ipv4 && `${e.ipv4.address}/${e.ipv4.prefixLength}` },
  { header: "IPV6", cell: (e) => e.ipv6 && `${e.ipv6.address}/${e.ipv6.prefixLength}` },
  { header: "STATE", cell: stateCell },
  { header: "OWNER", cell: (e) => e.attachment?.pod ?? e.owner?.pod },
  {
    header: "CONTAINER",
    cell: (e) => shortId(e.attachment?.containerId ?? e.owner?.containerId),
  },
  { header: "NETNS", cell: (e) => e.attachment?.netns },
  { header: "AGE", cell: (e) => (e.attachment ? formatAge(e.attachment.createdAt) : "-") },
];

/**
 * The state; for a sticky pod's held ENI how long the hold has left; for a DEL still
 * finishing, when it answered.
 */
function stateCell(e: Row): string {
  const a = e.attachment;
  if (a?.state === "deleting" && a.delAnsweredAt) {
    return `deleting (DEL answered ${formatAge(a.delAnsweredAt)} ago, finishing)`;
  }
  if (a?.state === "held" && a.holdUntil) {
    const left = formatAge(new Date().toISOString(), Date.parse(a.holdUntil));
    // Zone scope: after its node hold the ENI is parked in the VPC, not freed.
    return a.parkUntil ? `held (${left}, then parked)` : `held (${left} left)`;
  }
  return a?.state ?? e.state;
}

type Parked = Status["sticky"]["parked"][number];
type Claim = Status["sticky"]["claims"][number];

const PARKED_COLUMNS: Column<Parked>[] = [
  { header: "PARKED ENI", cell: (p) => p.eniId },
  { header: "POD", cell: (p) => p.pod },
  { header: "IFNAME", cell: (p) => p.ifName },
  { header: "PROFILE", cell: (p) => p.profile },
  { header: "STATE", cell: (p) => p.state },
  { header: "SINCE", cell: (p) => formatAge(p.since) },
  {
    header: "EXPIRES IN",
    cell: (p) => formatAge(new Date().toISOString(), Date.parse(p.until)),
  },
];

const CLAIM_COLUMNS: Column<Claim>[] = [
  { header: "CLAIMED ENI", cell: (c) => c.eniId },
  { header: "POD", cell: (c) => c.pod },
  { header: "IFNAME", cell: (c) => c.ifName },
  { header: "FROM", cell: (c) => c.from ?? "-" },
  { header: "AGO", cell: (c) => formatAge(c.at) },
];

/** Zone-wide sticky pods: what this node parked in the VPC, and the claims it made. */
function renderSticky(s: Status): string {
  let out = "";
  if (s.sticky.parked.length) {
    out +=
      "\nparked in the VPC by this node (any node of the zone can claim them for their pod):\n" +
      renderTable(PARKED_COLUMNS, s.sticky.parked);
  }
  if (s.sticky.claims.length) {
    out += "\nclaimed by this node from the VPC (most recent first):\n" +
      renderTable(CLAIM_COLUMNS, s.sticky.claims);
  }
  return out;
}

type ProfileRow = [string, Status["pool"]["profiles"][string]];

const PROFILE_COLUMNS: Column<ProfileRow>[] = [
  { header: "PROFILE", cell: ([name]) => name },
  { header: "FREE", cell: ([, c]) => String(c.free) },
  { header: "OWNED", cell: ([, c]) => String(c.owned) },
  { header: "RECYCLING", cell: ([, c]) => String(c.recycling) },
  { header: "HELD", cell: ([, c]) => String(c.held) },
];

/**
 * What an operator must act on or know: a full pool, owned ENIs the cloud lost, stuck
 * ENIs in quarantine, DELs still finishing, networks whose pods cannot reach Services.
 */
function providerWarnings(s: Status): string {
  const lines: string[] = [];
  if (s.pool.exhausted) {
    const p = s.pool;
    lines.push(
      `POOL EXHAUSTED: no free ENI and no room to attach another (free ${p.free}, owned ${p.owned}, recycling ${p.recycling}, held ${p.held}, attachable ${p.attachable}): a new pod's ADD fails (100) until one is released; the node's network stays ready (CNI STATUS 0)`,
    );
  }
  const lost = s.enis.filter((e) => e.cloudState === "lost");
  for (const e of lost) {
    lines.push(
      `LOST: ${e.id} (${e.mac}) of ${
        e.owner?.pod ?? "?"
      } is gone from the cloud; its DEL or the next GC forgets it`,
    );
  }
  const q = s.providerDetails.quarantined;
  if (typeof q === "number" && q > 0) {
    lines.push(
      `QUARANTINED: ${q} ENI(s) stuck attaching or detaching that the cloud would not release (see --json: providerDetails.quarantinedEnis)`,
    );
  }
  for (const d of s.unfinishedDels) {
    lines.push(
      `DEL FINISHING: ${d.pod} (${shortId(d.containerId)}/${d.ifName}${
        d.eniId ? `, ${d.eniId}` : ""
      }): its DEL answered ${
        formatAge(d.answeredAt)
      } ago and is still bringing the device home and releasing the ENI; GC takes it over only if that fails`,
    );
  }
  for (const n of s.hostLinks.withoutServiceCidrs) {
    lines.push(
      `NO SERVICES: network "${n.network}" gives its pods a host link but no serviceCidrs: Services will not route from ${n.pods.length} pod(s) (${
        n.pods.slice(0, 5).join(", ")
      }${n.pods.length > 5 ? ", …" : ""}); set "serviceCidrs" in its CNI config`,
    );
  }
  return lines.length ? lines.join("\n") + "\n\n" : "";
}

/** What the device plugin advertises to kubelet, and why devices are Unhealthy. */
function devicePluginLines(s: Status): string {
  const dp = s.devicePlugin;
  if (!dp) return "";
  if (dp.state === "off") return `device plugin ${dp.resourceName}: off (${dp.reason})\n\n`;
  const total = dp.healthy + dp.unhealthy;
  let out = `device plugin ${dp.resourceName}: ${
    dp.state === "registered" ? "registered with kubelet" : "NOT REGISTERED with kubelet"
  }, ${total} device${
    total === 1 ? "" : "s"
  } advertised: ${dp.healthy} healthy, ${dp.unhealthy} unhealthy\n`;
  if (dp.reason) out += `  ${dp.reason}\n`;
  for (const u of dp.unhealthyReasons) {
    out += `UNHEALTHY: ${u.devices} device${u.devices === 1 ? "" : "s"}: ${u.message}\n`;
  }
  return out + "\n";
}

type PolicyPod = NonNullable<Status["policy"]>["pods"][number];

const POLICY_COLUMNS: Column<PolicyPod>[] = [
  { header: "POD", cell: (p) => p.pod },
  { header: "POLICIES", cell: (p) => String(p.policies) },
  {
    header: "ISOLATED",
    cell: (p) =>
      [p.ingressIsolated ? "ingress" : "", p.egressIsolated ? "egress" : ""].filter(Boolean).join(
        ", ",
      ) || "no",
  },
  { header: "NODE END", cell: (p) => p.nodeIfName },
  { header: "STATE", cell: (p) => p.state },
];

/**
 * NetworkPolicy: whether the agent has synced (and so serves ADDs), the caches' watch
 * restarts and last event, each policy it cannot read (and what that fails closed to),
 * and per local pod how many policies select it.
 */
function policyLines(s: Status): string {
  const p = s.policy;
  if (!p) return "";
  const restarts = p.caches.reduce((n, c) => n + c.watchRestarts, 0);
  const last = p.caches.map((c) => c.lastEventAt).filter((t): t is string => t !== null).sort()
    .at(-1);
  let out = `NetworkPolicy: ${
    p.synced ? "synced" : "NOT SYNCED (new pods' ADDs fail with 11 until it is)"
  }, last event ${last ? `${formatAge(last)} ago` : "never"}, ${restarts} watch restart${
    restarts === 1 ? "" : "s"
  }, ${p.pendingEvents} event${p.pendingEvents === 1 ? "" : "s"} pending\n`;
  for (const c of p.caches) {
    if (c.lastError) out += `  ${c.resource}: ${c.lastError}\n`;
    if (c.bookmarks === "none") {
      out += `  ${c.resource}: the API server sends no watch bookmarks: a dead watch is ` +
        `noticed only past its timeout (kubernetes.watchTimeoutSeconds)\n`;
    }
  }
  for (const u of p.unreadable) {
    const [ns] = u.policy.split("/");
    const who = u.wholeNamespace ? `every pod of namespace ${ns}` : `pods ${u.selects} in ${ns}`;
    const dirs = [u.ingress ? "ingress" : "", u.egress ? "egress" : ""].filter(Boolean);
    out += `UNREADABLE NetworkPolicy ${u.policy}: ${u.reason}; failing closed: ${who} ` +
      `isolated for ${dirs.join(" and ")}, nothing admitted by it\n`;
  }
  if (!p.rawSocketGuard.on) {
    out += `NO RAW-SOCKET GUARD (${p.rawSocketGuard.why}): a pod a policy isolates must lack ` +
      `NET_RAW and NET_ADMIN for its policy to hold\n`;
  }
  for (const pod of p.pods) {
    if (pod.bypass) out += `POLICY NOT ENFORCED for ${pod.pod}: ${pod.bypass}\n`;
  }
  if (p.pods.length) out += renderTable(POLICY_COLUMNS, p.pods);
  return out + "\n";
}

/** kube-proxy's IPVS mode, when NetworkPolicy refuses ADDs because of it. */
function ipvsLines(s: Status): string {
  const i = s.ipvs;
  if (!i || !i.refusing) return "";
  return `NETWORKPOLICY REFUSES NEW PODS: kube-proxy's IPVS mode (${i.reason}) bypasses enim's node-side rules; ADDs fail with 111 (${i.refusedAdds} so far) until kube-proxy runs in iptables or nftables mode, or networkPolicy.enabled is false\n\n`;
}

/** Renders the Status object as `enim status` prints it. */
export function renderStatus(s: Status): string {
  const p = s.pool;
  const profiles = Object.entries(p.profiles);
  const several = profiles.length > 1;
  let head = `provider ${s.provider}, agent ${s.version}, ` +
    `${s.ready ? "ready" : "NOT READY"}, ${s.canAllocate ? "can allocate" : "CANNOT ALLOCATE"}\n` +
    `pool: ${p.free} free, ${p.owned} owned, ${p.recycling} recycling, ` +
    `${p.held > 0 ? `${p.held} held, ` : ""}` +
    `${p.attachable} more attachable${several ? " (shared by all profiles)" : ""}\n` +
    (s.hostLinks.links > 0 ? `host links: ${s.hostLinks.links}\n` : "") + "\n";
  if (several) head += renderTable(PROFILE_COLUMNS, profiles) + "\n";
  head += devicePluginLines(s);
  head += policyLines(s);
  head += ipvsLines(s);
  head += providerWarnings(s);
  const columns = several
    ? [
      ...COLUMNS.slice(0, 1),
      { header: "PROFILE", cell: (e: Row) => e.profile },
      ...COLUMNS.slice(1),
    ]
    : COLUMNS;
  return head + (s.enis.length ? renderTable(columns, s.enis) : "no ENIs attached to this node\n") +
    renderSticky(s);
}

/**
 * `enim status`'s exit code when the agent answered but is not ready (it has not reconciled,
 * or it is shutting down): what CNI STATUS answers 50 for. A readiness probe fails on it.
 * 1 stays "the agent cannot be reached, or answered an error"; 2 is a usage error.
 */
export const NOT_READY_EXIT = 3;

/** The `status` subcommand. */
export function statusCommand(io: CliIo, exit: { code: number }) {
  return new Command("status")
    .description(
      "Show the node's ENIs and pool counts (asks the running agent).\n" +
        `Exits 0 when the agent is ready, ${NOT_READY_EXIT} when it answers not ready, ` +
        "1 when it cannot be reached.",
    )
    .option("--socket <path>", SOCKET_HELP)
    .option("--json", "print the agent's Status object as JSON")
    .action(async (opts) => {
      const client = io.agent(socketPath(opts.socket));
      try {
        const s = await client.status();
        io.out(opts.json ? JSON.stringify(s, null, 2) + "\n" : renderStatus(s));
        if (!s.ready) exit.code = NOT_READY_EXIT;
      } catch (err) {
        exit.code = reportAgentError(io, "status", err);
      }
    });
}
