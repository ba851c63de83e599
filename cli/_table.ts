/**
 * Plain-text tables for the operator commands: left-aligned columns separated by
 * two spaces, `-` for empty cells, no colour.
 *
 * @module
 */

/** One column: a header and how to read a row's cell. */
export interface Column<R> {
  header: string;
  cell(row: R): string | null | undefined;
}

/** Renders `rows` under `columns` as text lines ending in "\n". */
export function renderTable<R>(columns: Column<R>[], rows: R[]): string {
  const cells = rows.map((r) =>
    columns.map((c) => {
      const v = c.cell(r);
      return v === null || v === undefined || v === "" ? "-" : v;
    })
  );
  const widths = columns.map((c, i) =>
    Math.max(c.header.length, ...cells.map((row) => row[i].length))
  );
  const line = (vals: string[]) =>
    vals.map((v, i) => (i === vals.length - 1 ? v : v.padEnd(widths[i]))).join("  ").trimEnd();
  return [line(columns.map((c) => c.header)), ...cells.map(line)].join("\n") + "\n";
}

/** A short age: `45s`, `12m`, `3h05m`, `2d04h`. */
export function formatAge(fromIso: string | null | undefined, now = Date.now()): string {
  if (!fromIso) return "-";
  const t = Date.parse(fromIso);
  if (Number.isNaN(t)) return "-";
  const s = Math.max(0, Math.floor((now - t) / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h}h${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(h / 24)}d${String(h % 24).padStart(2, "0")}h`;
}

/** A container id shortened the way runtimes show it (12 characters). */
export function shortId(id: string | null | undefined): string {
  return id ? id.slice(0, 12) : "-";
}
