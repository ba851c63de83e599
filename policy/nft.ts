/**
 * A compiled policy as nftables ruleset text (pure: nothing here runs `nft`), for the
 * two places enim enforces it, both in a table `inet enim_policy`:
 *
 * - in the pod's namespace ({@linkcode podRuleset}), for what crosses its ENI: ingress
 *   is what is delivered to the pod after arriving by the ENI (`input`, `iifname`),
 *   egress what the pod sends out by the ENI (`output`, `oifname`). Packets the pod
 *   forwards (`forward`) are not judged there: they crossed the node, and were judged
 *   at the node end of the pod's host link.
 * - in the node's namespace ({@linkcode nodeRuleset}), at the node end of each local
 *   pod's host link, in the `forward` hook (after kube-proxy's DNAT: against the real
 *   backend): ingress to the pod is what leaves by its node end (`oifname`), egress
 *   from the pod what came in by it (`iifname`). One base chain dispatches by interface
 *   (verdict maps) to a chain per pod and direction; a packet that crosses two node ends
 *   (or one twice: a pod's Service traffic to a remote backend comes back to leave by
 *   its ENI) is judged by the egress chain of the one and the ingress chain of the
 *   other, so those chains `return` what they allow and only drop ends a packet.
 *
 * Each isolated direction's chain: replies of allowed connections (`ct state
 * established,related`, which also passes the ICMP errors that belong to them), then
 * (in the pod, IPv6) neighbour discovery, then the node's addresses and the pod's own,
 * then the allowed entries, then an optional rate-limited log line and a counted drop
 * (named counters: `nft -j list counters table inet enim_policy`, see
 * {@linkcode parseDropCounters}). A direction that is not isolated has an empty chain.
 *
 * Peer sets are named sets (`<key>_4`, `<key>_6`, always both families, so a member of
 * a family the pod lacks can still be added), flagged `interval` for ipBlocks, typed
 * `ipv4_addr . inet_service` for named ports. A label or address change becomes
 * {@linkcode setDeltaCommands} (or {@linkcode setReplaceCommands}), never a reload.
 *
 * Why one file: both places build their chains from the same pieces (set declarations
 * and fills, per-direction rules, port matchers); apart, each would import the other.
 *
 * Loading a ruleset is idempotent and never deletes the table (a table's deletion costs
 * an RCU grace period, and would zero the counters): objects are declared (a no-op when
 * they exist), chains and sets flushed and filled again, and what the `previous`
 * render had that this one has not is deleted, all in one transaction.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { judgedStamp } from "./fence.ts";
import type { CompiledPolicy, Direction, Entry, PeerSet, PortMatcher, SetDelta } from "./types.ts";

/** The table, in the pod's namespace and in the node's. */
export const POLICY_TABLE = "enim_policy";
const T = `inet ${POLICY_TABLE}`;

/** Logging of dropped packets (off unless given): at most `rate` lines a second per chain. */
export interface DropLog {
  /** Lines a second, at most, per chain (the `limit` is per rule). */
  rate: number;
}

type Fam = 4 | 6;

const IFNAME = /^[A-Za-z0-9_.-]{1,15}$/;

function checkIfName(name: string): string {
  if (!IFNAME.test(name)) throw new TypeError(`Invalid interface name "${name}"`);
  return name;
}

/** A chain-name-safe form of an interface name. */
function linkId(ifName: string): string {
  return checkIfName(ifName).replace(/[.-]/g, "_");
}

const setName = (key: string, fam: Fam) => `${key}_${fam}`;
const ipk = (fam: Fam) => (fam === 4 ? "ip" : "ip6");
const FAMS: Fam[] = [4, 6];

function families(c: CompiledPolicy): Fam[] {
  return FAMS.filter((f) => (f === 4 ? c.pod.ipv4 : c.pod.ipv6).length > 0);
}

function setDecl(s: PeerSet, fam: Fam): string {
  const addr = fam === 4 ? "ipv4_addr" : "ipv6_addr";
  const type = s.kind === "namedPort" ? `${addr} . inet_service` : addr;
  const flags = s.kind === "ipBlock" ? " flags interval;" : "";
  return `\tset ${setName(s.key, fam)} { type ${type};${flags} }`;
}

function elements(s: PeerSet, fam: Fam): string[] {
  const list = fam === 4 ? s.ipv4 : s.ipv6;
  return s.kind === "namedPort"
    ? (list as { addr: string; port: number }[]).map((e) => `${e.addr} . ${e.port}`)
    : list as string[];
}

function fill(name: string, els: string[]): string[] {
  return [
    `flush set ${T} ${name}`,
    ...(els.length > 0 ? [`add element ${T} ${name} { ${els.join(", ")} }`] : []),
  ];
}

function fillSet(s: PeerSet): string[] {
  return FAMS.flatMap((f) => fill(setName(s.key, f), elements(s, f)));
}

function nodeSetLines(node: { ipv4: string[]; ipv6: string[] }): string[] {
  return [...fill("node_4", node.ipv4), ...fill("node_6", node.ipv6)];
}

const NODE_SET_DECLS = ["\tset node_4 { type ipv4_addr; }", "\tset node_6 { type ipv6_addr; }"];

/** `tcp dport { 80, 90-100 }` or `meta l4proto udp`, one per protocol. */
function portMatches(ports: PortMatcher[]): string[] {
  const out: string[] = [];
  for (const protocol of ["TCP", "UDP", "SCTP"] as const) {
    const mine = ports.filter((m) => m.protocol === protocol && m.name === undefined);
    if (mine.length === 0) continue;
    const p = protocol.toLowerCase();
    if (mine.some((m) => m.port === undefined)) {
      out.push(`meta l4proto ${p}`);
      continue;
    }
    const items = mine.map((m) => (m.endPort ? `${m.port}-${m.endPort}` : String(m.port)));
    out.push(`${p} dport ${items.length === 1 ? items[0] : `{ ${items.join(", ")} }`}`);
  }
  return out;
}

function entryRules(
  e: Entry,
  c: CompiledPolicy,
  dir: "saddr" | "daddr",
  fams: Fam[],
  verdict: string,
): string[] {
  const set = e.peer === null ? null : c.sets.find((s) => s.key === e.peer);
  if (e.peer !== null && !set) throw new Error(`The compiled policy has no set "${e.peer}"`);
  if (set?.kind === "namedPort") {
    const p = set.protocol.toLowerCase();
    return fams.map((f) => `${ipk(f)} ${dir} . ${p} dport @${setName(set.key, f)} ${verdict}`);
  }
  const ports = e.ports === null ? [""] : portMatches(e.ports).map((m) => `${m} `);
  if (!set) return ports.map((m) => `${m}${verdict}`);
  return fams.flatMap((f) =>
    ports.map((m) => `${ipk(f)} ${dir} @${setName(set.key, f)} ${m}${verdict}`)
  );
}

function logPrefix(c: CompiledPolicy, dir: string): string {
  const who = `${c.pod.namespace}/${c.pod.name}`.replace(/[^A-Za-z0-9._/:-]/g, "_");
  return `enim-policy drop ${dir} ${who}: `.slice(0, 127);
}

const ICMPV6_LINK = [
  "nd-neighbor-solicit",
  "nd-neighbor-advert",
  "nd-router-solicit",
  "nd-router-advert",
  "mld-listener-report",
  "mld2-listener-report",
];

/** The rules of one direction's chain (bodies, without `add rule`). */
function directionRules(
  c: CompiledPolicy,
  which: "ingress" | "egress",
  place: "pod" | "node",
  counter: string,
  log?: DropLog,
): string[] {
  const d: Direction = c[which];
  if (!d.isolated) return [];
  const verdict = place === "pod" ? "accept" : "return";
  const dir = which === "ingress" ? "saddr" : "daddr";
  const fams = families(c);
  const out: string[] = [];
  if (place === "pod") {
    out.push("ct state established,related accept");
    // IPv6's own link signalling (neighbour discovery, multicast listener reports): no
    // policy speaks of it, and without it the ENI's IPv6 would not work at all.
    if (fams.includes(6)) out.push(`icmpv6 type { ${ICMPV6_LINK.join(", ")} } accept`);
  }
  for (const f of fams) out.push(`${ipk(f)} ${dir} @node_${f} ${verdict}`);
  for (const f of fams) {
    const self = f === 4 ? c.pod.ipv4 : c.pod.ipv6;
    out.push(
      `${ipk(f)} ${dir} ${self.length === 1 ? self[0] : `{ ${self.join(", ")} }`} ${verdict}`,
    );
  }
  for (const e of d.entries) out.push(...entryRules(e, c, dir, fams, verdict));
  if (log) {
    const rate = Math.max(1, Math.floor(log.rate));
    out.push(`limit rate ${rate}/second log prefix "${logPrefix(c, which)}"`);
  }
  out.push(`counter name "${counter}" drop`);
  return out;
}

/** Options of {@linkcode podRuleset}. */
export interface PodRulesetOptions {
  /** The pod's ENI, as named in its namespace (`eth0`). */
  eni: string;
  /** What was loaded before (its sets that this one lacks are deleted). */
  previous?: CompiledPolicy;
  /** Log dropped packets (off by default). */
  log?: DropLog;
}

/**
 * The pod's ruleset (loaded in its namespace with `nft -f`): table `inet enim_policy`
 * with base chains `input` and `output` that send what crosses the ENI to chains
 * `ingress` and `egress`, and counters `drop_ingress` and `drop_egress`.
 */
export function podRuleset(c: CompiledPolicy, opts: PodRulesetOptions): string {
  const eni = checkIfName(opts.eni);
  const gone = (opts.previous?.sets ?? []).filter((p) => !c.sets.some((s) => s.key === p.key));
  const lines = [
    `table ${T} {`,
    ...NODE_SET_DECLS,
    ...[...c.sets, ...gone].flatMap((s) => FAMS.map((f) => setDecl(s, f))),
    "\tcounter drop_ingress { }",
    "\tcounter drop_egress { }",
    "\tchain input { type filter hook input priority filter; policy accept; }",
    "\tchain output { type filter hook output priority filter; policy accept; }",
    "\tchain ingress { }",
    "\tchain egress { }",
    "}",
    ...["input", "output", "ingress", "egress"].map((ch) => `flush chain ${T} ${ch}`),
    ...gone.flatMap((s) => FAMS.map((f) => `delete set ${T} ${setName(s.key, f)}`)),
    ...nodeSetLines(c.node),
    ...c.sets.flatMap(fillSet),
    `add rule ${T} input iifname "${eni}" jump ingress`,
    `add rule ${T} output oifname "${eni}" jump egress`,
    ...directionRules(c, "ingress", "pod", "drop_ingress", opts.log)
      .map((r) => `add rule ${T} ingress ${r}`),
    ...directionRules(c, "egress", "pod", "drop_egress", opts.log)
      .map((r) => `add rule ${T} egress ${r}`),
  ];
  return lines.join("\n") + "\n";
}

/** One local pod in the node's table: the node end of its host link and its policy. */
export interface NodePod {
  /** The node end of the pod's host link (`enimh<hash>`). */
  nodeEnd: string;
  /** The pod's compiled policy. */
  policy: CompiledPolicy;
}

/** Options of {@linkcode nodeRuleset}. */
export interface NodeRulesetOptions {
  /** The node's addresses. */
  node: { ipv4: string[]; ipv6: string[] };
  /** What was loaded before: its pods' chains and its sets that this one lacks are deleted. */
  previous?: NodePod[];
  /** Log dropped packets (off by default). */
  log?: DropLog;
  /**
   * The judged bit (`policy/fence.ts`): the `forward` chain's first rule sets it on
   * every packet the chain sees, which the fence lets through. Unset: no stamp.
   */
  judgedMark?: number;
}

/** The names of one pod's chains and counters in the node's table. */
export function nodeNames(nodeEnd: string) {
  const id = linkId(nodeEnd);
  return {
    ingress: `in_${id}`,
    egress: `out_${id}`,
    dropIngress: `drop_in_${id}`,
    dropEgress: `drop_out_${id}`,
  };
}

/** A node pod's chains and counters, as declarations inside `table … { }`. */
function nodePodObjects(p: NodePod): string[] {
  const n = nodeNames(p.nodeEnd);
  return [
    `\tchain ${n.ingress} { }`,
    `\tchain ${n.egress} { }`,
    `\tcounter ${n.dropIngress} { }`,
    `\tcounter ${n.dropEgress} { }`,
  ];
}

/** A node pod's rules, into its two (flushed or new) chains. */
function nodePodRules(p: NodePod, log: DropLog | undefined): string[] {
  const n = nodeNames(p.nodeEnd);
  return [
    ...directionRules(p.policy, "ingress", "node", n.dropIngress, log)
      .map((r) => `add rule ${T} ${n.ingress} ${r}`),
    ...directionRules(p.policy, "egress", "node", n.dropEgress, log)
      .map((r) => `add rule ${T} ${n.egress} ${r}`),
  ];
}

/** The verdict map elements that send a node pod's traffic to its chains. */
function nodePodLinks(p: NodePod): string[] {
  const n = nodeNames(p.nodeEnd);
  const end = checkIfName(p.nodeEnd);
  return [
    `add element ${T} ingress_links { "${end}" : jump ${n.ingress} }`,
    `add element ${T} egress_links { "${end}" : jump ${n.egress} }`,
  ];
}

/** The flushes of a node pod's two chains. */
function nodePodFlushes(p: NodePod): string[] {
  const n = nodeNames(p.nodeEnd);
  return [`flush chain ${T} ${n.ingress}`, `flush chain ${T} ${n.egress}`];
}

/** The deletion of a node pod's (flushed, unreferenced) chains and its counters. */
function nodePodDeletes(p: NodePod): string[] {
  const n = nodeNames(p.nodeEnd);
  return [
    `delete chain ${T} ${n.ingress}`,
    `delete chain ${T} ${n.egress}`,
    `delete counter ${T} ${n.dropIngress}`,
    `delete counter ${T} ${n.dropEgress}`,
  ];
}

/**
 * The node's ruleset for every local pod (loaded in the node's namespace with `nft -f`;
 * render it again when a pod comes or goes, or its rules change): table `inet
 * enim_policy`, base chain `forward`, verdict maps `ingress_links` and `egress_links`
 * from node end to the pod's chain, per pod chains `in_<end>`/`out_<end>` and counters
 * `drop_in_<end>`/`drop_out_<end>`, and every set of every pod once.
 */
export function nodeRuleset(pods: NodePod[], opts: NodeRulesetOptions): string {
  const keys = new Set<string>();
  const sets: PeerSet[] = [];
  for (const p of pods) {
    for (const s of p.policy.sets) {
      if (keys.has(s.key)) continue;
      keys.add(s.key);
      sets.push(s);
    }
  }
  const ends = new Set(pods.map((p) => p.nodeEnd));
  const gonePods = (opts.previous ?? []).filter((p) => !ends.has(p.nodeEnd));
  const goneSets = new Map<string, PeerSet>();
  for (const p of opts.previous ?? []) {
    for (const s of p.policy.sets) if (!keys.has(s.key)) goneSets.set(s.key, s);
  }
  const lines = [
    `table ${T} {`,
    ...NODE_SET_DECLS,
    ...[...sets, ...goneSets.values()].flatMap((s) => FAMS.map((f) => setDecl(s, f))),
    "\tmap ingress_links { type ifname : verdict; }",
    "\tmap egress_links { type ifname : verdict; }",
    "\tchain forward { type filter hook forward priority filter; policy accept; }",
    ...pods.flatMap(nodePodObjects),
    ...gonePods.flatMap(nodePodObjects),
    "}",
    `flush chain ${T} forward`,
    `flush map ${T} ingress_links`,
    `flush map ${T} egress_links`,
    ...[...pods, ...gonePods].flatMap(nodePodFlushes),
    ...gonePods.flatMap(nodePodDeletes),
    ...[...goneSets.keys()].flatMap((k) => FAMS.map((f) => `delete set ${T} ${setName(k, f)}`)),
    ...nodeSetLines(opts.node),
    ...sets.flatMap(fillSet),
    ...(opts.judgedMark
      ? judgedStamp(opts.judgedMark).map((r) => `add rule ${T} forward ${r}`)
      : []),
    `add rule ${T} forward ct state established,related accept`,
    `add rule ${T} forward iifname vmap @egress_links`,
    `add rule ${T} forward oifname vmap @ingress_links`,
  ];
  for (const p of pods) lines.push(...nodePodLinks(p), ...nodePodRules(p, opts.log));
  return lines.join("\n") + "\n";
}

/** Options of {@linkcode nodeUpdate}. */
export interface NodeUpdateOptions {
  /** What the node's table holds now (the last render or update loaded). */
  previous: NodePod[];
  /** Node ends whose pod's rules changed (their chains are rendered again). */
  changed?: Iterable<string>;
  /** Log dropped packets (off by default). */
  log?: DropLog;
}

/**
 * The node's table brought from `previous` to `pods` without touching what did not
 * change: sets no pod had are declared and filled, sets no pod has any more deleted; the
 * chains, counters and verdict-map elements of pods that came (and of `changed` pods: their
 * chains only) are made, those of pods that went deleted. The other pods' chains and every
 * set both have are left as they are (their members change by set deltas), so an ADD or a
 * DEL costs the node one pod's worth, whatever the cluster's size. The node's addresses
 * must be those `previous` was loaded with (else render the whole table:
 * {@linkcode nodeRuleset}). Empty when nothing changed.
 */
export function nodeUpdate(pods: NodePod[], opts: NodeUpdateOptions): string {
  const setsOf = (list: NodePod[]) => {
    const m = new Map<string, PeerSet>();
    for (const p of list) for (const s of p.policy.sets) if (!m.has(s.key)) m.set(s.key, s);
    return m;
  };
  const before = setsOf(opts.previous), now = setsOf(pods);
  const newSets = [...now.values()].filter((s) => !before.has(s.key));
  const goneSets = [...before.keys()].filter((k) => !now.has(k));
  const prevEnds = new Set(opts.previous.map((p) => p.nodeEnd));
  const ends = new Set(pods.map((p) => p.nodeEnd));
  const changed = new Set(opts.changed ?? []);
  const touched = pods.filter((p) => !prevEnds.has(p.nodeEnd) || changed.has(p.nodeEnd));
  const gone = opts.previous.filter((p) => !ends.has(p.nodeEnd));
  if (!newSets.length && !goneSets.length && !touched.length && !gone.length) return "";
  const lines: string[] = [
    `table ${T} {`,
    ...newSets.flatMap((s) => FAMS.map((f) => setDecl(s, f))),
    ...touched.flatMap(nodePodObjects),
    "}",
    ...newSets.flatMap(fillSet),
  ];
  for (const p of touched) {
    lines.push(...nodePodFlushes(p), ...nodePodRules(p, opts.log));
    if (!prevEnds.has(p.nodeEnd)) lines.push(...nodePodLinks(p));
  }
  for (const p of gone) {
    const end = checkIfName(p.nodeEnd);
    lines.push(
      `delete element ${T} ingress_links { "${end}" }`,
      `delete element ${T} egress_links { "${end}" }`,
      ...nodePodFlushes(p),
      ...nodePodDeletes(p),
    );
  }
  lines.push(...goneSets.flatMap((k) => FAMS.map((f) => `delete set ${T} ${setName(k, f)}`)));
  return lines.join("\n") + "\n";
}

/**
 * A set's membership change as element edits (deletes, then adds), for every table
 * that holds the set (the pods' in `delta.users`, and the node's): no rule is touched.
 * An edit fails as a whole when an element to delete is missing (nft 1.0.6 has no
 * `destroy element`); fall back to {@linkcode setReplaceCommands}.
 */
export function setDeltaCommands(d: SetDelta): string {
  const lines: string[] = [];
  const text = (e: string | { addr: string; port: number }) =>
    typeof e === "string" ? e : `${e.addr} . ${e.port}`;
  for (const f of FAMS) {
    const edit = f === 4 ? d.ipv4 : d.ipv6;
    const del = (edit.delete as (string | { addr: string; port: number })[]).map(text);
    const add = (edit.add as (string | { addr: string; port: number })[]).map(text);
    if (del.length) lines.push(`delete element ${T} ${setName(d.key, f)} { ${del.join(", ")} }`);
    if (add.length) lines.push(`add element ${T} ${setName(d.key, f)} { ${add.join(", ")} }`);
  }
  return lines.length ? lines.join("\n") + "\n" : "";
}

/** A set's whole membership, replaced in one transaction (flush and add): no rule is touched. */
export function setReplaceCommands(s: PeerSet): string {
  return fillSet(s).join("\n") + "\n";
}

const CountersSchema = z.object({
  nftables: z.array(z.looseObject({
    counter: z.optional(z.looseObject({
      name: z.string(),
      table: z.string(),
      packets: z.number(),
      bytes: z.number(),
    })),
  })),
});

/** A drop counter: which direction, of which node end (absent in the pod's table). */
export interface DropCounter {
  /** The direction the dropped packets were judged in. */
  direction: "ingress" | "egress";
  /** The node end's chain id (the interface name with `.` and `-` as `_`). */
  link?: string;
  /** Packets dropped since the counter was made. */
  packets: number;
  /** Their bytes. */
  bytes: number;
}

/** The drop counters in `nft -j list counters table inet enim_policy`'s output. */
export function parseDropCounters(json: string): DropCounter[] {
  let value: unknown;
  try {
    value = JSON.parse(json);
  } catch (err) {
    throw new Error(`Cannot parse the output of "nft -j list counters" as JSON`, { cause: err });
  }
  const out: DropCounter[] = [];
  for (const item of z.parse(CountersSchema, value).nftables) {
    const c = item.counter;
    if (!c || c.table !== POLICY_TABLE) continue;
    const m = /^drop_(ingress|egress)$|^drop_(in|out)_(.+)$/.exec(c.name);
    if (!m) continue;
    out.push({
      direction: m[1] === "ingress" || m[2] === "in" ? "ingress" : "egress",
      ...(m[3] ? { link: m[3] } : {}),
      packets: c.packets,
      bytes: c.bytes,
    });
  }
  return out;
}
