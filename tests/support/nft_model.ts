/**
 * A model of what nftables does with the texts enim's policy loads (policy/nft.ts): the
 * tables of each namespace as the kernel would hold them, and a device layer that loads
 * into the model instead of spawning `nft`. Each text is one transaction, as `nft -f`
 * makes it: it applies whole or not at all, and fails where the kernel fails (a delete of
 * an element, set, chain or counter that is not there; a delete of a set, chain or
 * counter still in use; a rule or an element naming an object that is not there; a
 * verdict-map key added again with another verdict). Only the grammar enim writes is
 * known; anything else fails the load, so a change of the renderers shows here.
 *
 * {@linkcode NftModel.view} reads a table as what it does: the rules reachable from its
 * base chains, a jump (or a verdict-map element) to a chain that has no rule left out as
 * it changes nothing, and the members of the sets those rules use. Two tables with the
 * same view judge every packet the same.
 *
 * @module
 */
import { DeviceError } from "../../netns/types.ts";
import { FakeDeviceLayer, NODE } from "../../netns/fake.ts";
import { FENCE_TABLE } from "../../policy/fence.ts";

interface ModelSet {
  type: string;
  interval: boolean;
  elements: Set<string>;
}

interface ModelChain {
  hook: string | null;
  rules: string[];
}

interface ModelTable {
  sets: Map<string, ModelSet>;
  maps: Map<string, Map<string, string>>;
  chains: Map<string, ModelChain>;
  counters: Set<string>;
}

/** What a table does (see the module doc): reachable non-empty chains, their maps and sets. */
export interface TableView {
  chains: Record<string, string[]>;
  maps: Record<string, string[]>;
  sets: Record<string, string[]>;
}

/** A load the model (as the kernel) refuses. */
export class NftModelError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NftModelError";
  }
}

const TABLE = "inet enim_policy";

function cloneTable(t: ModelTable): ModelTable {
  return {
    sets: new Map(
      [...t.sets].map(([k, s]) => [k, { ...s, elements: new Set(s.elements) }]),
    ),
    maps: new Map([...t.maps].map(([k, m]) => [k, new Map(m)])),
    chains: new Map([...t.chains].map(([k, c]) => [k, { hook: c.hook, rules: [...c.rules] }])),
    counters: new Set(t.counters),
  };
}

/** The objects a rule names. */
function refs(rule: string): { sets: string[]; chains: string[]; counters: string[] } {
  return {
    sets: [...rule.matchAll(/@([A-Za-z0-9_]+)/g)].map((m) => m[1]),
    chains: [...rule.matchAll(/\bjump ([A-Za-z0-9_]+)/g)].map((m) => m[1]),
    counters: [...rule.matchAll(/counter name "([^"]+)"/g)].map((m) => m[1]),
  };
}

function elementsOf(body: string, line: string): string[] {
  const m = /^\{ (.*) \}$/.exec(body);
  if (!m) throw new NftModelError(`Cannot read the elements of "${line}"`);
  return m[1].split(", ");
}

/** The nftables tables of every namespace (see the module doc). */
export class NftModel {
  /** By namespace (`NODE` or a path): the table `inet enim_policy`, when there is one. */
  readonly tables = new Map<string, ModelTable>();

  /**
   * By namespace: the fence's text (`policy/fence.ts`) as last loaded, null once taken
   * away. Kept as written, not modelled: it judges nothing the policy table decides.
   */
  readonly fences = new Map<string, string | null>();

  /** Applies `text` in `where` as one transaction; throws {@linkcode NftModelError}. */
  apply(where: string, text: string): void {
    if (text.startsWith(`table inet ${FENCE_TABLE} {`)) {
      if (text.startsWith(`table inet ${FENCE_TABLE} {}\ndelete table`)) {
        this.fences.set(where, null);
      } else this.fences.set(where, text);
      return;
    }
    const had = this.tables.get(where);
    let t: ModelTable | undefined = had ? cloneTable(had) : undefined;
    const table = (line: string): ModelTable => {
      if (!t) throw new NftModelError(`No table ${TABLE} for "${line}"`);
      return t;
    };
    const lines = text.split("\n");
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      if (line.trim() === "") continue;
      if (line === `table ${TABLE} {}`) {
        t ??= { sets: new Map(), maps: new Map(), chains: new Map(), counters: new Set() };
        continue;
      }
      if (line === `table ${TABLE} {`) {
        t ??= { sets: new Map(), maps: new Map(), chains: new Map(), counters: new Set() };
        for (i++; i < lines.length && lines[i] !== "}"; i++) this.#declare(t, lines[i].trim());
        if (i >= lines.length) throw new NftModelError(`Unterminated table block`);
        continue;
      }
      if (line === `delete table ${TABLE}`) {
        table(line);
        t = undefined;
        continue;
      }
      const m =
        /^(flush|delete|add) (chain|set|map|counter|element|rule) inet enim_policy (\S+)(?: (.*))?$/
          .exec(line);
      if (!m) throw new NftModelError(`The model does not know "${line}"`);
      const [, verb, kind, name, rest] = m;
      this.#statement(table(line), verb, kind, name, rest ?? "", line);
    }
    if (t) this.tables.set(where, t);
    else this.tables.delete(where);
  }

  #declare(t: ModelTable, decl: string): void {
    let m = /^set (\S+) \{ type ([^;]+);( flags interval;)? \}$/.exec(decl);
    if (m) {
      const was = t.sets.get(m[1]);
      if (was && (was.type !== m[2] || was.interval !== !!m[3])) {
        throw new NftModelError(`Set "${m[1]}" exists with another type`);
      }
      if (!was) t.sets.set(m[1], { type: m[2], interval: !!m[3], elements: new Set() });
      return;
    }
    m = /^map (\S+) \{ type ifname : verdict; \}$/.exec(decl);
    if (m) {
      if (!t.maps.has(m[1])) t.maps.set(m[1], new Map());
      return;
    }
    m = /^chain (\S+) \{ (?:type filter hook (\S+) priority filter; policy accept; )?\}$/.exec(
      decl,
    );
    if (m) {
      const was = t.chains.get(m[1]);
      const hook = m[2] ?? null;
      if (was && was.hook !== hook) throw new NftModelError(`Chain "${m[1]}" exists as another`);
      if (!was) t.chains.set(m[1], { hook, rules: [] });
      return;
    }
    m = /^counter (\S+) \{ \}$/.exec(decl);
    if (m) {
      t.counters.add(m[1]);
      return;
    }
    throw new NftModelError(`The model does not know the declaration "${decl}"`);
  }

  /** The first chain with a rule `pred` holds (null: none). */
  #inUse(t: ModelTable, pred: (r: ReturnType<typeof refs>) => boolean): string | null {
    for (const [name, c] of t.chains) if (c.rules.some((r) => pred(refs(r)))) return name;
    return null;
  }

  #statement(
    t: ModelTable,
    verb: string,
    kind: string,
    name: string,
    rest: string,
    line: string,
  ): void {
    const need = <T>(v: T | undefined, what: string): T => {
      if (v === undefined) throw new NftModelError(`No ${what} "${name}" for "${line}"`);
      return v;
    };
    if (verb === "flush") {
      if (kind === "chain") need(t.chains.get(name), "chain").rules = [];
      else if (kind === "set") need(t.sets.get(name), "set").elements.clear();
      else if (kind === "map") need(t.maps.get(name), "map").clear();
      else throw new NftModelError(`The model does not know "${line}"`);
      return;
    }
    if (verb === "delete" && kind !== "element") {
      if (kind === "set") {
        need(t.sets.get(name), "set");
        const user = this.#inUse(t, (r) => r.sets.includes(name));
        if (user) throw new NftModelError(`Set "${name}" is in use by chain "${user}": "${line}"`);
        t.sets.delete(name);
      } else if (kind === "chain") {
        const c = need(t.chains.get(name), "chain");
        if (c.rules.length > 0) throw new NftModelError(`Chain "${name}" is not empty`);
        const jumped = this.#inUse(t, (r) => r.chains.includes(name)) !== null ||
          [...t.maps.values()].some((m) => [...m.values()].includes(`jump ${name}`));
        if (jumped) throw new NftModelError(`Chain "${name}" is in use: "${line}"`);
        t.chains.delete(name);
      } else if (kind === "counter") {
        need(t.counters.has(name) ? true : undefined, "counter");
        if (this.#inUse(t, (r) => r.counters.includes(name)) !== null) {
          throw new NftModelError(`Counter "${name}" is in use: "${line}"`);
        }
        t.counters.delete(name);
      } else throw new NftModelError(`The model does not know "${line}"`);
      return;
    }
    if (kind === "element") {
      const els = elementsOf(rest, line);
      const set = t.sets.get(name);
      const map = t.maps.get(name);
      if (!set && !map) throw new NftModelError(`No set or map "${name}" for "${line}"`);
      for (const el of els) {
        if (map) {
          const [key, verdict] = el.split(" : ");
          if (verb === "delete") {
            if (!map.delete(key)) throw new NftModelError(`No element ${key} in "${name}"`);
            continue;
          }
          const target = /^jump (\S+)$/.exec(verdict ?? "")?.[1];
          if (!target || !t.chains.has(target)) {
            throw new NftModelError(`No chain for "${el}" in "${line}"`);
          }
          if (map.has(key) && map.get(key) !== verdict) {
            throw new NftModelError(`Element ${key} of "${name}" exists with another verdict`);
          }
          map.set(key, verdict);
        } else if (verb === "delete") {
          if (!set!.elements.delete(el)) throw new NftModelError(`No element ${el} in "${name}"`);
        } else set!.elements.add(el);
      }
      return;
    }
    if (verb === "add" && kind === "rule") {
      const chain = need(t.chains.get(name), "chain");
      const r = refs(rest);
      for (const s of r.sets) {
        if (!t.sets.has(s) && !t.maps.has(s)) {
          throw new NftModelError(`No set "${s}" for "${line}"`);
        }
      }
      for (const c of r.chains) {
        if (!t.chains.has(c)) throw new NftModelError(`No chain "${c}" for "${line}"`);
      }
      for (const c of r.counters) {
        if (!t.counters.has(c)) throw new NftModelError(`No counter "${c}" for "${line}"`);
      }
      chain.rules.push(rest);
      return;
    }
    throw new NftModelError(`The model does not know "${line}"`);
  }

  /**
   * What the table in `where` does (see the module doc); empty without a table. With
   * `exclude`, the verdict-map elements of those node ends are left out (and so what only
   * they reach).
   */
  view(where: string, o: { exclude?: string[] } = {}): TableView {
    const out: TableView = { chains: {}, maps: {}, sets: {} };
    const t = this.tables.get(where);
    if (!t) return out;
    const excluded = new Set((o.exclude ?? []).map((e) => `"${e}"`));
    const memo = new Map<string, string[]>();
    const live = (chain: string): string[] => {
      const had = memo.get(chain);
      if (had) return had;
      memo.set(chain, []);
      const rules: string[] = [];
      for (const rule of t.chains.get(chain)?.rules ?? []) {
        const jump = /\bjump ([A-Za-z0-9_]+)/.exec(rule)?.[1];
        if (jump && live(jump).length === 0) continue;
        const vmap = /vmap @([A-Za-z0-9_]+)/.exec(rule)?.[1];
        if (vmap) {
          const entries = [...(t.maps.get(vmap) ?? new Map<string, string>())]
            .filter(([k, v]) => !excluded.has(k) && live(v.slice("jump ".length)).length > 0)
            .map(([k, v]) => `${k} : ${v}`).sort();
          if (entries.length === 0) continue;
          out.maps[vmap] = entries;
        }
        rules.push(rule);
      }
      memo.set(chain, rules);
      if (rules.length > 0) out.chains[chain] = rules;
      return rules;
    };
    for (const [name, c] of t.chains) {
      if (!c.hook) continue;
      // A base chain (policy accept) whose every rule accepts judges nothing.
      if (live(name).every((r) => r.endsWith(" accept"))) delete out.chains[name];
    }
    for (const rules of Object.values(out.chains)) {
      for (const r of rules) {
        for (const s of refs(r).sets) {
          const set = t.sets.get(s);
          if (set) out.sets[s] = [...set.elements].sort();
        }
      }
    }
    return out;
  }

  /** The chains a node end's verdict-map elements jump to (empty: none), by direction. */
  nodeLinks(where: string, nodeEnd: string): { ingress?: string; egress?: string } {
    const t = this.tables.get(where);
    const jumpOf = (map: string) => t?.maps.get(map)?.get(`"${nodeEnd}"`)?.slice("jump ".length);
    const ingress = jumpOf("ingress_links"), egress = jumpOf("egress_links");
    return { ...(ingress ? { ingress } : {}), ...(egress ? { egress } : {}) };
  }

  /** A chain's rules (undefined: no such chain). */
  rules(where: string, chain: string): string[] | undefined {
    const c = this.tables.get(where)?.chains.get(chain);
    return c ? [...c.rules] : undefined;
  }
}

/**
 * The fake device layer (netns/fake.ts) whose `loadRuleset` loads into an
 * {@linkcode NftModel} (after the fake's own fault injection: `failOn("nft")`); a text
 * the model refuses fails the load as `nft` would. `onLoad` sees the model after each
 * load that applied.
 */
export class ModelDeviceLayer extends FakeDeviceLayer {
  readonly model = new NftModel();
  /** Every load the model refused, with why. */
  readonly refused: { where: string; error: string }[] = [];
  onLoad: ((where: string) => void) | null = null;

  override async loadRuleset(netns: string | null, text: string): Promise<void> {
    await super.loadRuleset(netns, text);
    const where = netns ?? NODE;
    try {
      this.model.apply(where, text);
    } catch (err) {
      if (!(err instanceof NftModelError)) throw err;
      this.refused.push({ where, error: err.message });
      throw new DeviceError("nft", "failed", `nft refused the ruleset: ${err.message}`);
    }
    this.onLoad?.(where);
  }
}
