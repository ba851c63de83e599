/**
 * The device layer's pure parts: which link is the ENI's, how interface names,
 * MACs and routes are checked, the `ip` commands that configure a moved
 * interface, and how an `ip` failure reads in an error.
 *
 * @module
 */
import { canonicalCidr, familyOf as ipFamily, normalizeIp, parseCidr } from "../lib/ip.ts";
import { IpError } from "./ip.ts";
import {
  type AddressEvent,
  type AddressSpec,
  DeviceError,
  type DevicePhase,
  type DeviceTiming,
  type Link,
  type RouteSpec,
} from "./types.ts";

/** A Linux interface name: 1–15 bytes, no whitespace, '/' or ':', not "." or "..". */
export const IFNAME = /^[A-Za-z0-9_.@+-]{1,15}$/;
/** Whether an `ip` failure says the named device does not exist. */
export function noSuchDevice(err: unknown): boolean {
  return err instanceof IpError &&
    /Cannot find device|does not exist|No such device/i.test(err.stderr);
}

/**
 * The ENI's device among `links`: by MAC; else by the alias enim set when it moved
 * the device (its node name: a chained plugin or a pod with NET_ADMIN may have
 * changed the MAC); else, inside the pod, the interface enim named `podName`, but
 * only when it carries no mark of another ENI (an alias other than `nodeName`, an
 * `enim<MAC>` altname of another MAC): a namespace deleted and created again at the
 * same path can get the same inode, so a DEL of the older container must not take
 * the newer container's device that happens to have the same name.
 */
export function pickDevice<L extends Link>(
  links: L[],
  mac: string,
  nodeName: string,
  podName?: string,
): L | null {
  const want = normalizeMac(mac);
  return links.find((l) => l.address?.toLowerCase() === want) ??
    links.find((l) => l.ifalias === nodeName && l.ifname !== nodeName) ??
    (podName === undefined
      ? undefined
      : links.find((l) => l.ifname === podName && !markedForAnother(l, want, nodeName))) ??
    null;
}

/** Whether a link carries enim's marks for another ENI than the one of MAC `mac`. */
function markedForAnother(l: Link, mac: string, nodeName: string): boolean {
  if (l.ifalias && l.ifalias !== nodeName) return true;
  const own = altnameOf(mac);
  return (l.altnames ?? []).some((a) => a.startsWith("enim") && a !== own);
}

/** Wraps steps so each reports its duration to `timing` (when given), success or not. */
export function stepTimer(timing?: DeviceTiming) {
  return async <T>(phase: DevicePhase, fn: () => Promise<T>): Promise<T> => {
    if (!timing) return await fn();
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      timing(phase, performance.now() - t0);
    }
  };
}

export function normalizeMac(mac: string): string {
  return mac.trim().toLowerCase();
}

export function checkIfName(name: string): void {
  if (!IFNAME.test(name) || name === "." || name === "..") {
    throw new DeviceError("validate", "failed", `Invalid interface name "${name}"`);
  }
}

/**
 * The explanation for a configure batch that failed on a route the pod already has
 * (a second interface of the pod bringing its own default route), naming the route
 * and the option that leaves it out; undefined for any other failure. `ip -batch`
 * names the failing line: the batch's first line shows the link, then `config`.
 */
export function routeConflict(err: unknown, config: string[][]): string | undefined {
  if (!(err instanceof IpError) || !/File exists/i.test(err.stderr)) return undefined;
  const line = Number(/Command failed \S+:(\d+)/.exec(err.stderr)?.[1] ?? NaN);
  const cmd = config[line - 2];
  if (!cmd || cmd[0] !== "route") return undefined;
  const dst = cmd[2];
  const isDefault = dst === "0.0.0.0/0" || dst === "::/0";
  return `the pod already has a route to ${dst}${
    isDefault
      ? ' (another interface\'s default route): set "defaultRoutes": false in the enim section of this network'
      : ""
  }`;
}

/**
 * The alternative name enim gives an ENI's device (`enim` and its MAC's hex
 * digits): unique per ENI, it follows the device between namespaces, and lets a
 * DEL address its device in the pod directly, with no lookup (`ip link set dev
 * <altname> …` finds no other device).
 */
export function altnameOf(mac: string): string {
  return `enim${normalizeMac(mac).replaceAll(":", "")}`;
}

/** The lines of an `ip -batch` that failed (1-based), as its stderr names them. */
export function failedLines(stderr: string): number[] {
  return [...stderr.matchAll(/Command failed \S+:(\d+)/g)].map((m) => Number(m[1]));
}

export function errText(err: unknown): string {
  if (err instanceof IpError) return err.stderr || err.message;
  return err instanceof Error ? err.message : String(err);
}

export type Family = 4 | 6;

/** The family of an address; throws for anything else. */
export function familyOf(addr: string): Family {
  const f = ipFamily(addr);
  if (f === null || addr.includes("/")) throw new Error(`"${addr}" is not an IP address`);
  return f;
}

/** A prefix; throws for anything else. */
export function cidrOf(s: string) {
  const c = parseCidr(s);
  if (!c) throw new Error(`"${s}" is not a prefix such as 10.0.0.0/24`);
  return c;
}

/** A route destination in canonical CIDR form and its family ("default" follows `gw`, else IPv4). */
export function routeDst(dst: string, gw: string | undefined): { dst: string; family: Family } {
  if (dst === "default") {
    const family = gw ? familyOf(gw) : 4;
    return { dst: family === 4 ? "0.0.0.0/0" : "::/0", family };
  }
  const c = cidrOf(dst);
  return { dst: canonicalCidr(c), family: c.ip.family };
}

/**
 * The `ip` commands that configure a freshly moved interface: mtu, up, addresses
 * (IPv6 with nodad: the ENI address is unique in the VPC), then exactly the routes
 * given (`gw` absent: on-link). The device layer derives no route of its own.
 */
export function configureCommands(p: {
  ifName: string;
  addresses: AddressSpec[];
  routes: RouteSpec[];
  mtu?: number;
}): string[][] {
  const dev = p.ifName;
  const cmds: string[][] = [];
  try {
    if (p.mtu !== undefined) {
      if (!Number.isInteger(p.mtu) || p.mtu < 68 || p.mtu > 65535) {
        throw new Error(`Invalid MTU ${p.mtu}`);
      }
      cmds.push(["link", "set", "dev", dev, "mtu", String(p.mtu)]);
    }
    cmds.push(["link", "set", "dev", dev, "up"]);
    for (const a of p.addresses) {
      const c = cidrOf(a.cidr);
      const cidr = `${normalizeIp(a.cidr.split("/")[0])}/${c.prefix}`;
      cmds.push(["addr", "add", cidr, "dev", dev, ...(c.ip.family === 6 ? ["nodad"] : [])]);
    }
    for (const r of p.routes) {
      const { dst, family } = routeDst(r.dst, r.gw);
      const gw = r.gw ? normalizeIp(r.gw) : undefined;
      if (gw && familyOf(gw) !== family) {
        throw new Error(`Gateway "${gw}" is not of the family of "${r.dst}"`);
      }
      cmds.push(["route", "add", dst, ...(gw ? ["via", gw] : []), "dev", dev]);
    }
  } catch (err) {
    throw new DeviceError(
      "validate",
      "failed",
      `Invalid interface configuration: ${errText(err)}`,
      {
        cause: err,
      },
    );
  }
  return cmds;
}

const ADDRESS_LINE =
  /^(Deleted\s+)?\d+:\s+(\S+)\s+(inet6?)\s+([0-9A-Fa-f:.]+)(?:\/\d+)?\s.*?\bscope\s+(\S+)/;

/**
 * One line of `ip -o monitor address` as an event; null for any other line (a
 * monitor may print more than addresses, and the format is iproute2's text).
 */
export function parseAddressEvent(line: string): AddressEvent | null {
  const m = ADDRESS_LINE.exec(line);
  if (!m) return null;
  const family = ipFamily(m[4]);
  if (family === null) return null;
  return {
    deleted: m[1] !== undefined,
    ifName: m[2].split("@")[0],
    family,
    address: normalizeIp(m[4]),
    scope: m[5],
  };
}
