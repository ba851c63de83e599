/**
 * The ADD result and its route policy, in one place: the ENI's addresses in CIDR
 * form, a default route per family via the ENI's gateway (unless `defaultRoutes`
 * is false or the config routes that default itself), then the config's routes
 * (`gw` defaulting to the ENI's gateway of the route's family). The device layer
 * installs exactly these routes and derives none of its own.
 *
 * @module
 */
import type { Eni } from "../providers/contract.ts";
import type { RouteSpec } from "../netns/types.ts";
import type { AddResponse } from "../api/schema.ts";
import type { AddInput } from "./types.ts";

/** Whether a route's destination is IPv6. */
const isV6 = (dst: string) => dst.includes(":");
/** The ADD result for `eni`: addresses in CIDR form, default routes and the config's routes. */
export function buildResult(
  eni: Eni,
  req: Pick<AddInput, "routes"> & { defaultRoutes?: boolean },
): Pick<AddResponse, "ips" | "routes"> {
  const ips: AddResponse["ips"] = [];
  const routes: RouteSpec[] = [];
  const wanted = req.routes.map((r) => ({
    dst: r.dst === "default" ? "0.0.0.0/0" : r.dst,
    gw: r.gw ?? (isV6(r.dst) ? eni.ipv6?.gateway : eni.ipv4?.gateway),
  }));
  for (const [fam, a] of [["4", eni.ipv4], ["6", eni.ipv6]] as const) {
    if (!a) continue;
    ips.push({ address: `${a.address}/${a.prefixLength}`, gateway: a.gateway });
    const dflt = fam === "4" ? "0.0.0.0/0" : "::/0";
    if (req.defaultRoutes !== false && !wanted.some((r) => r.dst === dflt)) {
      routes.push({ dst: dflt, gw: a.gateway });
    }
  }
  for (const r of wanted) routes.push(r.gw ? { dst: r.dst, gw: r.gw } : { dst: r.dst });
  return { ips, routes };
}
