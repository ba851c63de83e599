/**
 * Reading one sample of the agent's `GET /metrics` text (Prometheus exposition format).
 *
 * @module
 */

/**
 * The value of the series `series` in `text`, written as the agent writes it (`name`, or
 * `name{label="value",…}` with its labels in the agent's order); null when it is absent.
 */
export function sampleOf(text: string, series: string): number | null {
  const escaped = series.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const m = new RegExp(`^${escaped} (\\S+)$`, "m").exec(text);
  return m ? Number(m[1]) : null;
}
