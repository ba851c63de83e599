/**
 * Label selectors as the policy compiler uses them: a canonical list of requirements
 * (so that two selectors that mean the same thing share one peer set), matching, the
 * text `kubectl describe` would show, and the stable keys that name peer sets.
 *
 * Semantics (`metav1.LabelSelector`): `matchLabels` and `matchExpressions` are ANDed;
 * `In` needs the label with one of the values, `NotIn` is true when the label is absent
 * or has none of the values, `Exists` and `DoesNotExist` look at the key alone. An empty
 * selector (no requirement) matches everything.
 *
 * @module
 */
import type { LabelSelector } from "../kube/objects.ts";

/** Labels of an object (absent: none). */
export type Labels = Readonly<Record<string, string>> | undefined;

/** One requirement of a canonical selector: `values` sorted and unique (empty for Exists/DoesNotExist). */
export interface Requirement {
  key: string;
  operator: "In" | "NotIn" | "Exists" | "DoesNotExist";
  values: string[];
}

/**
 * The canonical requirements of a selector: `matchLabels` become single-value `In`
 * requirements, values are sorted and deduplicated, duplicates dropped, the list sorted.
 */
export function requirements(sel: LabelSelector): Requirement[] {
  const out = new Map<string, Requirement>();
  const put = (r: Requirement) => out.set(JSON.stringify([r.key, r.operator, r.values]), r);
  for (const [key, value] of Object.entries(sel.matchLabels ?? {})) {
    put({ key, operator: "In", values: [value] });
  }
  for (const e of sel.matchExpressions ?? []) {
    const values = e.operator === "In" || e.operator === "NotIn"
      ? [...new Set(e.values ?? [])].sort()
      : [];
    put({ key: e.key, operator: e.operator, values });
  }
  return [...out.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, r]) => r);
}

/** Whether `labels` satisfy every requirement (an empty list matches everything). */
export function matches(reqs: readonly Requirement[], labels: Labels): boolean {
  for (const r of reqs) {
    const v = labels?.[r.key];
    switch (r.operator) {
      case "In":
        if (v === undefined || !r.values.includes(v)) return false;
        break;
      case "NotIn":
        if (v !== undefined && r.values.includes(v)) return false;
        break;
      case "Exists":
        if (v === undefined) return false;
        break;
      case "DoesNotExist":
        if (v !== undefined) return false;
        break;
    }
  }
  return true;
}

/**
 * Whether a namespace selector selects a namespace whose labels are `labels`; undefined:
 * the namespace is not (yet) known (the gap between the pods' and the namespaces' first
 * lists, a lagging namespace watch), whose labels may be any: only a selector that
 * selects every label set (no requirement) selects it. Read as none, `env notin (prod)`
 * would admit the pods of a new `env=prod` namespace until its labels came.
 */
export function namespaceMatches(reqs: readonly Requirement[], labels: Labels): boolean {
  return labels === undefined ? reqs.length === 0 : matches(reqs, labels);
}

/** A selector as `kubectl` prints it (`app=web,tier in (a,b),!legacy`); `<all>` when empty. */
export function selectorText(reqs: readonly Requirement[]): string {
  if (reqs.length === 0) return "<all>";
  return reqs.map((r) => {
    switch (r.operator) {
      case "In":
        return r.values.length === 1 ? `${r.key}=${r.values[0]}` : `${r.key} in (${r.values})`;
      case "NotIn":
        return `${r.key} notin (${r.values})`;
      case "Exists":
        return r.key;
      case "DoesNotExist":
        return `!${r.key}`;
    }
  }).join(",");
}

/**
 * A stable name for a value: `prefix` and 16 hex digits of a 64-bit FNV-1a hash of its
 * JSON (two 32-bit lanes). The same canonical value always gives the same key, in every
 * process and on every node; it is a valid nftables identifier when `prefix` is one.
 */
export function stableKey(prefix: string, value: unknown): string {
  const text = JSON.stringify(value);
  let a = 0x811c9dc5, b = 0xcbf29ce4;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c ^ (a >>> 13), 0x5bd1e995);
  }
  b = Math.imul(b ^ (b >>> 15), 0x2c1b3c6d) ^ a;
  const hex = (n: number) => (n >>> 0).toString(16).padStart(8, "0");
  return `${prefix}${hex(a)}${hex(b)}`;
}
