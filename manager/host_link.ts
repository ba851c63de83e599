/**
 * The host link's policy (issue 27): what a pod routes through it, how its ends are
 * named, which CIDRs a config may list, the node's addresses, and the GC of links
 * whose attachment is gone. The commands are `netns/host_link.ts`'s; the manager's
 * other route policy stays in `result.ts`.
 *
 * Why one file: everything the agent decides about a host link (its names, MACs and
 * table, its routes, the CIDR checks, the node's addresses, its upkeep and sweep) is
 * small and about one thing; a reader changing the link needs all of it at once.
 *
 * The pod routes through its host link: the config's Service CIDRs, the node's own
 * addresses (found here, never typed by an operator; each as a host route) and the
 * config's host-stack CIDRs. A node address inside one of those CIDRs needs no route
 * of its own. The node routes each of the pod's ENI addresses over the node end, with
 * the node's primary address of that family as the preferred source: a server on the
 * node bound to 0.0.0.0 answers a pod from the address a Service's endpoint names.
 *
 * @module
 */
import { createHash } from "node:crypto";
import type { Eni, ProfileInfo } from "../providers/contract.ts";
import { keyOf } from "../providers/schema.ts";
import { canonicalCidr, contains, normalizeIp, parseCidr, parseIp } from "../lib/ip.ts";
import type { DeviceLayer, HostLinkSpec, NodeAddresses } from "../netns/types.ts";
import {
  DEFAULT_MARKS,
  type HostLinkMarks,
  NFT_TABLE,
  NODE_TABLE_BASE,
} from "../netns/host_link.ts";
import type { Logger } from "../lib/log.ts";
import { ApiError, type HostLinkRequest } from "../api/schema.ts";
import { hostLinkOf, type StateStore } from "./state.ts";
import { userMessage } from "../lib/message.ts";
import { judgeTable, type TableFinding, type TableMark } from "../netns/table_check.ts";

/** The attachment key the names and MACs derive from. */
interface Key {
  containerId: string;
  ifName: string;
}

/** Hex digits of the attachment key's SHA-256 (names and MACs of its host link). */
function keyHash(k: Key): string {
  return createHash("sha256").update(`${k.containerId}/${k.ifName}`).digest("hex");
}

/**
 * The node end's name: the prefix and as many hex digits of the attachment key's
 * hash as make 15 bytes (`enimh` + 10 digits by default). Unique per attachment.
 */
export function nodeIfNameFor(prefix: string, k: Key): string {
  return (prefix + keyHash(k)).slice(0, 15);
}

/**
 * The two ends' MACs, from the key's hash: locally administered unicast, `0e:` for
 * the node end and `0a:` for the pod end, so each side's static neighbour is known
 * before the link exists.
 */
export function linkMacs(k: Key): { nodeMac: string; podMac: string } {
  const bytes = keyHash(k).slice(-10).match(/../g)!.join(":");
  return { nodeMac: `0e:${bytes}`, podMac: `0a:${bytes}` };
}

/** The alias of a node end: whose link it is (shown by `ip link`, read by the stress checker). */
export function linkAlias(k: Key): string {
  return `enim:${keyOf(k)}`.slice(0, 255);
}

/** An address as a host route's destination. */
function hostPrefix(addr: string): string {
  const n = normalizeIp(addr);
  return `${n}/${n.includes(":") ? 128 : 32}`;
}

/**
 * The host link of an attachment: its names and MACs, and the routes the pod takes
 * through it (Service CIDRs, then the node's addresses not inside one of the listed
 * CIDRs, then host-stack CIDRs; no duplicates), for the families the ENI has.
 */
export function planHostLink(
  eni: Pick<Eni, "ipv4" | "ipv6">,
  req: HostLinkRequest,
  k: Key,
  node: NodeAddresses,
  table: number = tableOf(k),
  nodeMarks: Pick<HostLinkMarks, "node" | "kubeProxyMasquerade"> = DEFAULT_MARKS,
): HostLinkSpec {
  const listed = [...req.serviceCidrs, ...req.hostStackCidrs].map((c) => parseCidr(c)!);
  const nodeRoutes = node.addresses
    .filter((a) => {
      const ip = parseIp(a);
      return ip !== null && !listed.some((c) => contains(c, ip));
    })
    .map(hostPrefix);
  const routes: string[] = [];
  for (const dst of [...req.serviceCidrs, ...nodeRoutes, ...req.hostStackCidrs]) {
    const c = canonicalCidr(parseCidr(dst)!);
    if (!routes.includes(c)) routes.push(c);
  }
  const podAddresses: HostLinkSpec["podAddresses"] = {};
  if (eni.ipv4) podAddresses.ipv4 = eni.ipv4.address;
  if (eni.ipv6) podAddresses.ipv6 = normalizeIp(eni.ipv6.address);
  return {
    nodeIfName: nodeIfNameFor(req.nodeIfPrefix, k),
    podIfName: req.podIfName,
    ...linkMacs(k),
    alias: linkAlias(k),
    podAddresses,
    nodeSource: { ...node.primary },
    routes: routes
      .filter((r) => r.includes(":") ? podAddresses.ipv6 : podAddresses.ipv4)
      .map((dst) => ({ dst })),
    table,
    marks: {
      ...DEFAULT_MARKS,
      node: nodeMarks.node,
      kubeProxyMasquerade: nodeMarks.kubeProxyMasquerade,
      ...req.marks,
    },
  };
}

/** The node-side table an attachment's link takes unless another link has it: 24 bits of its key's hash. */
export function tableOf(k: Key): number {
  return NODE_TABLE_BASE + parseInt(keyHash(k).slice(10, 16), 16);
}

/**
 * Refuses a host link whose CIDRs would take the pod's own VPC traffic: a Service
 * or host-stack CIDR overlapping one of `subnets` (the profile's, before allocation;
 * the ENI's, after) is a bad config (CNI code 7), named by its field.
 */
export function checkLinkCidrs(
  req: HostLinkRequest,
  subnets: { cidr: string; what: string }[],
): void {
  for (const field of ["serviceCidrs", "hostStackCidrs"] as const) {
    for (const [i, text] of req[field].entries()) {
      const c = parseCidr(text);
      if (!c) continue;
      for (const s of subnets) {
        const sub = parseCidr(s.cidr);
        if (!sub || sub.ip.family !== c.ip.family) continue;
        const net = (x: typeof c) => parseIp(canonicalCidr(x).split("/")[0])!;
        if (contains(c, net(sub)) || contains(sub, net(c))) {
          throw new ApiError(
            "bad_request",
            `Invalid network config: ${field}[${i}] ${text} overlaps ${s.what} ${
              canonicalCidr(sub)
            }: the pod's VPC traffic there would go to the node instead of the ENI`,
          );
        }
      }
    }
  }
}

/** The subnets of a profile, as {@linkcode checkLinkCidrs} takes them. */
export function profileSubnets(p: ProfileInfo | undefined): { cidr: string; what: string }[] {
  if (!p) return [];
  return [p.subnets.ipv4, p.subnets.ipv6]
    .filter((c): c is string => c !== undefined && parseCidr(c) !== null)
    .map((cidr) => ({ cidr, what: `the subnet of profile "${p.name}"` }));
}

/** The subnets of an ENI's addresses, as {@linkcode checkLinkCidrs} takes them. */
export function eniSubnets(
  eni: Pick<Eni, "id" | "ipv4" | "ipv6">,
): { cidr: string; what: string }[] {
  return [eni.ipv4, eni.ipv6].flatMap((a) => {
    if (!a) return [];
    const c = parseCidr(`${a.address}/${a.prefixLength}`);
    return c ? [{ cidr: canonicalCidr(c), what: `the subnet of ENI "${eni.id}"` }] : [];
  });
}

/** How long the node's addresses are reused before they are listed again. */
const NODE_ADDRESSES_TTL_MS = 30_000;

/**
 * The agent's host-link upkeep: the node's addresses (listed at most every 30 s),
 * the node's nftables table (loaded once, again after a failure and by every GC
 * pass), and which networks were warned about a missing Service CIDR.
 */
export class HostLinks {
  readonly #devices: DeviceLayer;
  readonly #log: Logger;
  #addresses: { at: number; value: Promise<NodeAddresses> } | null = null;
  #table: Promise<void> | null = null;
  /** Loads of the node's table begun and ended, each counted (odd: one in flight). */
  #tableLoads = 0;
  /** What the last check of the node's table saw. */
  #tableMark: TableMark | null = null;
  readonly #warned = new Set<string>();

  readonly #state: StateStore | null;
  /** Tables handed to ADDs that have not recorded their link yet, by attachment key. */
  readonly #reserved = new Map<number, string>();
  #legacyLogged = false;

  /** The node's marks, which every link's node rules and the node's table use. */
  readonly nodeMarks: { node: number; kubeProxyMasquerade: number };

  constructor(
    devices: DeviceLayer,
    log: Logger,
    state: StateStore | null = null,
    nodeMarks: { node: number; kubeProxyMasquerade: number } = DEFAULT_MARKS,
  ) {
    this.#devices = devices;
    this.#log = log;
    this.#state = state;
    this.nodeMarks = { node: nodeMarks.node, kubeProxyMasquerade: nodeMarks.kubeProxyMasquerade };
  }

  /**
   * The node-side table for an attachment's link: the one its row records already
   * (a retried ADD), else {@linkcode tableOf} its key, or the next one no other row
   * and no ADD under way has. Decided and reserved in one synchronous step, so two
   * ADDs at once never share one; {@linkcode releaseTable} once the row records it (or
   * the ADD failed).
   */
  reserveTable(k: Key): number {
    const key = keyOf(k);
    const taken = new Map<number, string>(this.#reserved);
    for (const r of this.#state?.hostLinkTables() ?? []) taken.set(r.table, keyOf(r.key));
    let table = tableOf(k);
    while (taken.has(table) && taken.get(table) !== key) {
      table = table + 1 >= 0x7fffffff ? NODE_TABLE_BASE : table + 1;
    }
    this.#reserved.set(table, key);
    return table;
  }

  /** Ends the reservations of an attachment's ADD (its row records its table now, or it failed). */
  releaseTable(k: Key): void {
    const key = keyOf(k);
    for (const [t, owner] of this.#reserved) if (owner === key) this.#reserved.delete(t);
  }

  /**
   * The node ends of links made before issue 34 (their rows record no table): the node
   * keeps masquerading their pods' traffic until their next ADD (logged once).
   */
  legacyNodeEnds(): string[] {
    const legacy = (this.#state?.all() ?? []).flatMap((r) => {
      const h = r.state === "held" ? null : hostLinkOf(r);
      return h && h.table === undefined ? [h.nodeIfName] : [];
    });
    if (legacy.length > 0 && !this.#legacyLogged) {
      this.#legacyLogged = true;
      this.#log.warn(
        "Pods ADDed before the pod-identity datapath keep the node's masquerade until their next ADD",
        { nodeEnds: legacy },
      );
    }
    return legacy;
  }

  /** The node's addresses, listed again when the last listing is older than 30 s or failed. */
  nodeAddresses(): Promise<NodeAddresses> {
    const now = performance.now();
    if (!this.#addresses || now - this.#addresses.at > NODE_ADDRESSES_TTL_MS) {
      const value = this.#devices.nodeAddresses();
      this.#addresses = { at: now, value };
      value.catch(() => {
        if (this.#addresses?.value === value) this.#addresses = null;
      });
    }
    return this.#addresses.value;
  }

  /** Drops the listed addresses: the node's addresses changed, the next caller lists them again. */
  forgetNodeAddresses(): void {
    this.#addresses = null;
  }

  /** Loads the node's table once (again when it failed, or with `again`). */
  ensureTable(again = false): Promise<void> {
    if (!this.#table || again) {
      this.#tableLoads++;
      const p = this.#devices.ensureHostLinkTable(this.legacyNodeEnds(), this.nodeMarks);
      this.#table = p;
      p.then(() => this.#tableLoads++, () => {
        this.#tableLoads++;
        if (this.#table === p) this.#table = null;
      });
    }
    return this.#table;
  }

  /**
   * Checks the node's table against what was loaded (`agent/policy/_table_check.ts`):
   * missing, or changed while no load of it ran, it is loaded again. Only once this
   * agent has loaded it (a node without host links has none). Resolves with the finding.
   */
  async checkTable(): Promise<TableFinding> {
    const table = this.#table;
    const runs = this.#tableLoads;
    // Never loaded, or a load in flight (begun, not ended: odd): the next check.
    if (!table || runs % 2 === 1) return "ok";
    const listing = await this.#devices.listTable(null, `inet ${NFT_TABLE}`);
    if (this.#tableLoads !== runs || this.#table !== table) return "ok";
    const r = judgeTable(listing, this.#tableMark, runs);
    this.#tableMark = r.mark;
    if (r.finding === "ok") return "ok";
    this.#log.warn(
      r.finding === "missing"
        ? "The node's host-link table is missing; loading it again"
        : "The node's host-link table is not what this agent loaded; loading it again",
      { table: `inet ${NFT_TABLE}`, finding: r.finding },
    );
    await this.ensureTable(true);
    return r.finding;
  }

  /** Logs, once per network and agent run, that its pods' Services will not route. */
  warnNoServiceCidrs(network: string, pod: string): void {
    if (this.#warned.has(network)) return;
    this.#warned.add(network);
    this.#log.warn(
      `Network "${network}" gives its pods a host link but no serviceCidrs: Services will not route from its pods (set "serviceCidrs" in the enim section of its config)`,
      { network, pod },
    );
  }
}

/**
 * Removes node ends that no attachment records (a pod gone without DEL, an ADD
 * killed before its rollback): links of the host-link group whose name no row's
 * host link has (a held row's link went with its DEL). The links are listed before the rows are read, and a row records
 * its link before the link is made, so a link in the making is never taken.
 * Returns the names removed.
 */
export async function sweepHostLinks(
  devices: DeviceLayer,
  state: StateStore,
  log: Logger,
): Promise<string[]> {
  const links = await devices.hostLinks();
  if (links.length === 0) return [];
  // A held row keeps its link's record, but its DEL removed the link.
  const recorded = new Set(
    state.all().flatMap((r) => {
      const h = r.state === "held" ? null : hostLinkOf(r);
      return h ? [h.nodeIfName] : [];
    }),
  );
  const removed: string[] = [];
  for (const l of links) {
    if (recorded.has(l.ifname)) continue;
    if (await devices.removeHostLink(l.ifname)) {
      removed.push(l.ifname);
      log.info("Removed a host link no attachment records", {
        nodeIfName: l.ifname,
        alias: l.ifalias ?? null,
      });
    }
  }
  return removed;
}

/** What ADD asks of the host link (interface mode, its request and the pod). */
interface LinkAdd {
  mode: "interface" | "ipam";
  network: string;
  profile: string;
  hostLink?: HostLinkRequest;
}

/**
 * ADD's host link checks before anything is recorded or allocated (interface mode
 * only; a Service or host-stack CIDR overlapping the profile's subnets is a bad
 * config), the node's nftables table loaded (once per agent run), and the warning
 * when the pod will not reach Services.
 */
export async function prepareHostLink(
  links: HostLinks,
  profiles: ProfileInfo[],
  req: LinkAdd,
  pod: string,
): Promise<void> {
  const hl = req.hostLink;
  if (!hl) return;
  if (req.mode !== "interface") {
    throw new ApiError(
      "bad_request",
      'Invalid network config: "hostLink" needs interface mode (enim as the interface plugin); in IPAM mode the calling plugin owns the pod\'s interfaces',
    );
  }
  checkLinkCidrs(hl, profileSubnets(profiles.find((p) => p.name === req.profile)));
  if (hl.serviceCidrs.length === 0) links.warnNoServiceCidrs(req.network, pod);
  try {
    await links.ensureTable();
  } catch (err) {
    throw new ApiError(
      "device_error",
      `Cannot give the pod a host link: ${
        userMessage(err)
      } (is nftables installed? "hostLink": {"enabled": false} turns the link off)`,
      undefined,
      { cause: err },
    );
  }
  // Listed now (at most every 30 s), so the plug does not wait for it.
  links.nodeAddresses().catch(() => {});
}

/** ADD's host link for this attachment, its CIDRs checked against the ENI's own subnets. */
export async function hostLinkFor(
  links: HostLinks,
  req: { hostLink?: HostLinkRequest },
  k: Key,
  eni: Pick<Eni, "id" | "ipv4" | "ipv6">,
): Promise<HostLinkSpec> {
  const hl = req.hostLink!;
  checkLinkCidrs(hl, eniSubnets(eni));
  let node;
  try {
    node = await links.nodeAddresses();
  } catch (err) {
    throw new ApiError(
      "device_error",
      `Cannot list the node's addresses for the host link: ${userMessage(err)}`,
      undefined,
      { cause: err },
    );
  }
  return planHostLink(eni, hl, k, node, links.reserveTable(k), links.nodeMarks);
}
