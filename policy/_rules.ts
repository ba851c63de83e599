/**
 * One local pod's rules (pure): from the prepared policies of its namespace, which
 * select it, whether each direction is isolated, and the (peer, ports) entries each
 * direction admits, with the specs of the sets those entries name. Set members are not
 * here (see `_sets.ts`): the rules of a pod depend only on its labels, its own named
 * ports and the policies, never on other pods.
 *
 * @module
 */
import type { Protocol } from "../kube/objects.ts";
import { matches } from "./_selector.ts";
import {
  ALL_PODS,
  namedPortKey,
  type PodDef,
  podDefText,
  type PreparedPeer,
  type PreparedPolicy,
  type PreparedRule,
} from "./_prepare.ts";
import type { PodRec } from "./_pod_index.ts";
import type { Direction, PortMatcher, SelectingPolicy } from "./types.ts";

/** What a set is, enough to create it (its members are then found in the index). */
export type SetSpec =
  | { kind: "pods"; key: string; def: PodDef; text: string }
  | {
    kind: "namedPort";
    key: string;
    def: PodDef;
    text: string;
    protocol: Protocol;
    portName: string;
  }
  | { kind: "ipBlock"; key: string; text: string; family: 4 | 6; prefixes: string[] };

/** A pod's rules: the compiled policy without set members. */
export interface Rules {
  ingress: Direction;
  egress: Direction;
  policies: SelectingPolicy[];
  warnings: string[];
  /** The sets the entries name, by key. */
  specs: Map<string, SetSpec>;
}

const PROTOCOLS: Protocol[] = ["TCP", "UDP", "SCTP"];

/** Canonical matchers: per protocol (TCP, UDP, SCTP), all ports, or merged sorted ranges. */
export function normalizePorts(list: PortMatcher[]): PortMatcher[] {
  const out: PortMatcher[] = [];
  for (const protocol of PROTOCOLS) {
    const mine = list.filter((m) => m.protocol === protocol);
    if (mine.length === 0) continue;
    const names = [...new Set(mine.filter((m) => m.name !== undefined).map((m) => m.name!))];
    out.push(...names.sort().map((name) => ({ protocol, name })));
    const numeric = mine.filter((m) => m.name === undefined);
    if (numeric.length === 0) continue;
    if (numeric.some((m) => m.port === undefined)) {
      out.push({ protocol });
      continue;
    }
    const ranges = numeric.map((m) => [m.port!, m.endPort ?? m.port!])
      .sort((a, b) => a[0] - b[0]);
    const merged: number[][] = [];
    for (const r of ranges) {
      const last = merged.at(-1);
      if (last && r[0] <= last[1] + 1) last[1] = Math.max(last[1], r[1]);
      else merged.push([...r]);
    }
    for (const [lo, hi] of merged) {
      out.push(hi > lo ? { protocol, port: lo, endPort: hi } : { protocol, port: lo });
    }
  }
  return out;
}

type Acc = Map<string | null, PortMatcher[] | null>;

/** Adds what one rule admits to a direction's (peer → ports) map. */
function addRule(
  dir: "ingress" | "egress",
  r: PreparedRule,
  rec: PodRec,
  acc: Acc,
  specs: Map<string, SetSpec>,
  warn: (w: string) => void,
): void {
  const numeric: PortMatcher[] = [];
  const named: { protocol: Protocol; name: string }[] = [];
  for (const port of r.ports ?? []) {
    const protocol = port.protocol ?? "TCP";
    if (port.port === undefined) {
      // endPort without port is invalid (the API server rejects it): admit nothing
      // rather than every port.
      if (port.endPort !== undefined) warn(`endPort ${port.endPort} without a port: ignored`);
      else numeric.push({ protocol });
    } else if (typeof port.port === "number") {
      const p = port.port, end = port.endPort;
      if (p < 1 || p > 65535 || (end !== undefined && (end < p || end > 65535))) {
        warn(`port ${p}${end !== undefined ? `-${end}` : ""} is out of range: ignored`);
      } else {
        numeric.push(
          end !== undefined && end > p ? { protocol, port: p, endPort: end } : {
            protocol,
            port: p,
          },
        );
      }
    } else if (port.endPort !== undefined) {
      warn(`endPort ${port.endPort} with the named port "${port.port}": ignored`);
    } else if (dir === "ingress") {
      // The target pod's own port of that name and protocol.
      const found = rec.ports.filter((c) =>
        c.name === port.port && (c.protocol ?? "TCP") === protocol
      );
      if (found.length === 0) {
        warn(`ingress port "${port.port}"/${protocol} names no port of the pod: matches nothing`);
      }
      for (const c of found) numeric.push({ protocol, port: c.containerPort });
    } else named.push({ protocol, name: port.port });
  }
  const put = (peer: string | null, ports: PortMatcher[] | null) => {
    if (!acc.has(peer)) acc.set(peer, ports && [...ports]);
    else {
      const cur = acc.get(peer)!;
      if (cur === null || ports === null) acc.set(peer, null);
      else cur.push(...ports);
    }
  };
  const peers: (PreparedPeer | null)[] = r.peers ?? [null];
  for (const peer of peers) {
    if (r.ports === null || numeric.length > 0) {
      put(peer?.key ?? null, r.ports === null ? null : numeric);
      if (peer?.kind === "pods") {
        specs.set(peer.key, { kind: "pods", key: peer.key, def: peer.def, text: peer.text });
      } else if (peer) {
        const { key, text, family, prefixes } = peer;
        specs.set(key, { kind: "ipBlock", key, text, family, prefixes });
      }
    }
    for (const n of named) {
      if (peer?.kind === "ipBlock") {
        warn(`egress port "${n.name}" names a pod's port: it matches nothing of ${peer.text}`);
        continue;
      }
      // Each destination pod's own port of that name: (address, port) elements.
      const def = peer?.def ?? ALL_PODS;
      const key = namedPortKey(def, n.protocol, n.name);
      specs.set(key, {
        kind: "namedPort",
        key,
        def,
        text: `port ${n.name}/${n.protocol} of ${podDefText(def)}`,
        protocol: n.protocol,
        portName: n.name,
      });
      put(key, [{ protocol: n.protocol, name: n.name }]);
    }
  }
}

function direction(isolated: boolean, acc: Acc): Direction {
  return {
    isolated,
    entries: [...acc.entries()]
      .sort(([a], [b]) => (a === b ? 0 : a === null ? -1 : b === null ? 1 : a < b ? -1 : 1))
      .map(([peer, ports]) => ({ peer, ports: ports && normalizePorts(ports) })),
  };
}

/** The rules of pod `rec` under the policies of its namespace (any order). */
export function podRules(rec: PodRec, policies: Iterable<PreparedPolicy>): Rules {
  const selecting = [...policies]
    .filter((p) => p.namespace === rec.namespace && matches(p.podSelector, rec.labels))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const specs = new Map<string, SetSpec>();
  const warnings = new Set<string>();
  const ingress: Acc = new Map(), egress: Acc = new Map();
  for (const p of selecting) {
    for (const w of p.warnings) warnings.add(w);
    const warn = (w: string) => warnings.add(`${p.name}: ${w}`);
    if (p.ingress) {
      for (const r of p.ingressRules) addRule("ingress", r, rec, ingress, specs, warn);
    }
    if (p.egress) { for (const r of p.egressRules) addRule("egress", r, rec, egress, specs, warn); }
  }
  return {
    ingress: direction(selecting.some((p) => p.ingress), ingress),
    egress: direction(selecting.some((p) => p.egress), egress),
    policies: selecting.map((p) => ({
      name: p.name,
      ingress: p.ingress,
      egress: p.egress,
      ingressRules: p.ingressRules.length,
      egressRules: p.egressRules.length,
      ...(p.unreadable !== undefined ? { unreadable: p.unreadable } : {}),
    })),
    warnings: [...warnings].sort(),
    specs,
  };
}
