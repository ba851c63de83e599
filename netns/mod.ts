/**
 * The real device layer: moves a whole ENI device into a pod's network namespace
 * and back by driving `ip` (through `./ip.ts`, the only module that spawns it).
 *
 * Spawns per operation (named namespaces such as /run/netns/x; a /proc/<pid>/ns/net
 * path costs one extra exec of nsenter for each command run inside it):
 * - plug: 3 (find by MAC on the node, one move+rename+alias, one configure batch in the pod),
 *   2 when the caller passes the device's node name it has just looked up;
 * - unplug from the pod: 2 (find by MAC in the pod, one batch: down, flush, move back renamed);
 * - unplug when the device is already on the node: 1 (plus 1 only when it needs scrubbing);
 * - inspect: 1 batch.
 *
 * Kernel behaviour this relies on (measured on 6.18 with iproute2 6.1):
 * - `ip link set dev X netns P name N alias A` is one netlink call, but when `N`
 *   exists in `P` the kernel may move the device first and fail the rename with
 *   EEXIST, leaving it in the pod under its node name; `plug` then looks for it in
 *   the pod by MAC and brings it back before throwing `ifname_exists`.
 * - Moving a device out of a namespace takes it down and drops its addresses and
 *   routes; `unplug` still sets it down and flushes it, in the same batch.
 * - A veth (the simulated ENI) is destroyed with its pair when the pod namespace
 *   is deleted, a few ms after `ip netns del` returns; a physical device would
 *   return to the initial namespace instead (see `./sim.ts`).
 *
 * @example
 * ```ts ignore
 * const devices = new IpDeviceLayer();
 * const { nodeName } = await devices.plug({
 *   mac: "02:00:0a:63:00:0b",
 *   netns: "/var/run/netns/cni-1234",
 *   ifName: "eth0",
 *   addresses: [{ cidr: "10.99.0.11/24", gateway: "10.99.0.1" }],
 *   routes: [],
 * });
 * await devices.unplug({ mac: "02:00:0a:63:00:0b", nodeName, netns: "/var/run/netns/cni-1234" });
 * ```
 *
 * @module
 */
import { z } from "zod";
import ipaddr from "ipaddr.js";
import { type Logger, nullLogger } from "../lib/log.ts";
import {
  AddrInfoSchema,
  ipBatch,
  IpError,
  ipJson,
  netnsPath,
  type NetnsRef,
  RouteEntrySchema,
  spawn,
} from "./ip.ts";
import {
  type AddressSpec,
  DeviceError,
  type DeviceLayer,
  type DevicePhase,
  type DeviceTiming,
  type Link,
  LinkSchema,
  type NetnsIdentity,
  type PlugParams,
  type PlugResult,
  type PodInterfaceState,
  type RouteSpec,
  type UnplugOutcome,
} from "./types.ts";

export * from "./types.ts";

/** A link with its addresses, as `ip -j addr show` reports it. */
const LinkAddrSchema = LinkSchema.extend({ addr_info: z.array(AddrInfoSchema).default([]) });
type LinkAddr = z.infer<typeof LinkAddrSchema>;

/** A Linux interface name: 1–15 bytes, no whitespace, '/' or ':', not "." or "..". */
const IFNAME = /^[A-Za-z0-9_.@+-]{1,15}$/;

/** Options for {@linkcode IpDeviceLayer}. */
export interface IpDeviceLayerOptions {
  /**
   * The namespace playing "the node" (a name under /run/netns or a path). Absent in
   * production: the node is the agent's own namespace. Tests that run outside the
   * simulated node namespace set it.
   */
  node?: string;
  log?: Logger;
}

/** The {@linkcode DeviceLayer} that drives iproute2. */
export class IpDeviceLayer implements DeviceLayer {
  readonly #node: NetnsRef;
  /** What `ip link set … netns X` takes to bring a device home. */
  readonly #home: string;
  readonly #log: Logger;

  constructor(opts: IpDeviceLayerOptions = {}) {
    this.#node = opts.node;
    this.#home = opts.node === undefined ? String(Deno.pid) : netnsPath(opts.node);
    this.#log = opts.log ?? nullLogger;
  }

  /** Finds a link by MAC in the node namespace, or in `netns` when given. */
  async findByMac(mac: string, netns?: string): Promise<Link | null> {
    if (netns !== undefined) await this.#requireNetns("find", netns);
    const want = normalizeMac(mac);
    const links = await this.#run(
      "find",
      `Cannot list links in netns "${netns ?? "node"}"`,
      () => ipJson(z.array(LinkSchema), ["link", "show"], { netns: netns ?? this.#node }),
    );
    return links.find((l) => l.address?.toLowerCase() === want) ?? null;
  }

  /** Moves the device into the pod renamed `ifName`, and configures it; rolls back on failure. */
  async plug(p: PlugParams): Promise<PlugResult> {
    checkIfName(p.ifName);
    const config = configureCommands(p);
    const timed = stepTimer(p.timing);
    await this.#requireNetns("netns", p.netns);
    let nodeName = p.nodeName;
    if (nodeName === undefined) {
      const link = await timed("device_lookup", () => this.#findOnNode(p.mac));
      if (!link) {
        throw new DeviceError(
          "find",
          "not_found",
          `Cannot find a link with MAC "${p.mac}" on the node`,
        );
      }
      nodeName = link.ifname;
    } else {
      checkIfName(nodeName);
    }
    const moveStarted = performance.now();
    try {
      await ipBatch([[
        "link",
        "set",
        "dev",
        nodeName,
        "netns",
        p.netns,
        "name",
        p.ifName,
        "alias",
        nodeName,
      ]], {
        netns: this.#node,
      });
      p.timing?.("move", performance.now() - moveStarted);
    } catch (err) {
      const exists = err instanceof IpError && /File exists/i.test(err.stderr);
      // Some kernels (6.18 here) move the device first and then fail the rename
      // with EEXIST, leaving it in the pod under its node name: bring it back.
      if (exists) await this.#recoverFailedMove(p.mac, p.netns, nodeName);
      throw new DeviceError(
        "move",
        exists ? "ifname_exists" : "failed",
        exists
          ? `Cannot move link "${nodeName}" into netns "${p.netns}" as "${p.ifName}": the name exists there`
          : `Cannot move link "${nodeName}" into netns "${p.netns}" as "${p.ifName}": ${
            errText(err)
          }`,
        { cause: err },
      );
    }
    try {
      const out = await timed(
        "configure",
        () =>
          ipBatch([...config, ["link", "show", "dev", p.ifName]], {
            netns: p.netns,
            json: true,
          }),
      );
      const shown = z.array(LinkSchema).parse(out.at(-1));
      if (shown.length !== 1) {
        throw new Error(`Expected one link "${p.ifName}", got ${shown.length}`);
      }
      return { nodeName, podIfindex: shown[0].ifindex };
    } catch (err) {
      try {
        await this.#bringBack(p.netns, p.ifName, nodeName);
      } catch (rollbackErr) {
        this.#log.error("Cannot roll back a failed plug", {
          mac: p.mac,
          netns: p.netns,
          ifName: p.ifName,
          err: rollbackErr,
        });
      }
      throw new DeviceError(
        "configure",
        "failed",
        `Cannot configure link "${p.ifName}" in netns "${p.netns}": ${errText(err)}`,
        { cause: err },
      );
    }
  }

  /** Brings the device back to the node renamed `nodeName`, down, without addresses. Idempotent. */
  async unplug(
    p: { mac: string; nodeName: string; netns?: string | null; timing?: DeviceTiming },
  ): Promise<UnplugOutcome> {
    checkIfName(p.nodeName);
    const timed = stepTimer(p.timing);
    if (p.netns && (await this.netnsIdentity(p.netns))) {
      let inPod: LinkAddr | null = null;
      try {
        inPod = await timed("device_lookup", () => this.#findWithAddrs(p.mac, p.netns!));
      } catch (err) {
        // The namespace may have vanished since the check: look on the node.
        this.#log.warn("Cannot list links in the pod; looking on the node", {
          netns: p.netns,
          err,
        });
      }
      if (inPod) {
        await this.#run(
          "move_back",
          `Cannot move link "${inPod.ifname}" from netns "${p.netns}" back to the node as "${p.nodeName}"`,
          () => timed("move", () => this.#bringBack(p.netns!, inPod.ifname, p.nodeName)),
        );
        return "pod";
      }
    }
    const onNode = await timed("device_lookup", () => this.#findOnNode(p.mac));
    if (!onNode) return "missing";
    const renamed = onNode.ifname !== p.nodeName;
    const up = onNode.flags.includes("UP");
    if (!renamed && !up && onNode.addr_info.length === 0) return "node";
    const cmds: string[][] = [["link", "set", "dev", onNode.ifname, "down"]];
    if (renamed) cmds.push(["link", "set", "dev", onNode.ifname, "name", p.nodeName]);
    cmds.push(["addr", "flush", "dev", p.nodeName]);
    await this.#run(
      "scrub",
      `Cannot restore link "${onNode.ifname}" on the node as "${p.nodeName}"`,
      () => timed("move", () => ipBatch(cmds, { netns: this.#node })),
    );
    return "node";
  }

  /** Reads the interface `ifName` in `netns`: link, global addresses, routes via it. */
  async inspect(p: { netns: string; ifName: string }): Promise<PodInterfaceState> {
    checkIfName(p.ifName);
    await this.#requireNetns("inspect", p.netns);
    let out: unknown[];
    try {
      // `addr show` first: in one batch, an `addr show` after a `link show` loses its addresses.
      out = await ipBatch([
        ["addr", "show", "dev", p.ifName],
        ["route", "show", "dev", p.ifName, "table", "all"],
        ["link", "show", "dev", p.ifName],
      ], { netns: p.netns, json: true });
    } catch (err) {
      if (err instanceof IpError && /does not exist|Cannot find device/.test(err.stderr)) {
        return { link: null, addresses: [], routes: [] };
      }
      throw new DeviceError(
        "inspect",
        "failed",
        `Cannot read link "${p.ifName}" in netns "${p.netns}": ${errText(err)}`,
        { cause: err },
      );
    }
    const addrs = z.array(LinkAddrSchema).parse(out[0])[0]?.addr_info ?? [];
    const routes = z.array(RouteEntrySchema).parse(out[1] ?? []);
    const link = z.array(LinkSchema).parse(out[2] ?? [])[0] ?? null;
    if (!link) return { link: null, addresses: [], routes: [] };
    return {
      link,
      addresses: addrs.filter((a) => a.scope === "global").map((a) => `${a.local}/${a.prefixlen}`),
      routes: routes
        .filter((r) => (r.table === undefined || r.table === "main") && r.protocol !== "kernel")
        .filter((r) => r.type === undefined || r.type === "unicast")
        .map((r) => {
          // `ip -j` prints "default" for both families; name the family explicitly.
          const dst = r.dst !== "default"
            ? r.dst
            : r.gateway?.includes(":") || r.dst.includes(":")
            ? "::/0"
            : "0.0.0.0/0";
          return r.gateway ? { dst, gw: r.gateway } : { dst };
        }),
    };
  }

  /** The identity of an nsfs file at an absolute path; null when it is missing or no namespace file. */
  netnsIdentity(path: string): Promise<NetnsIdentity | null> {
    return netnsIdentity(path);
  }

  async #requireNetns(step: string, netns: string): Promise<NetnsIdentity> {
    const id = await this.netnsIdentity(netns);
    if (!id) {
      throw new DeviceError(
        step,
        "netns_invalid",
        `Cannot use netns "${netns}": not a network namespace file`,
      );
    }
    return id;
  }

  /** The device with `mac` on the node, with its addresses. */
  #findOnNode(mac: string): Promise<LinkAddr | null> {
    return this.#run(
      "find",
      "Cannot list links on the node",
      () => this.#findWithAddrs(mac, this.#node),
    );
  }

  async #findWithAddrs(mac: string, netns: NetnsRef): Promise<LinkAddr | null> {
    const want = normalizeMac(mac);
    const links = await ipJson(z.array(LinkAddrSchema), ["addr", "show"], { netns });
    return links.find((l) => l.address?.toLowerCase() === want) ?? null;
  }

  /** After a failed move: if the device went into the pod anyway, move it back. */
  async #recoverFailedMove(mac: string, netns: string, nodeName: string): Promise<void> {
    try {
      const stray = await this.#findWithAddrs(mac, netns);
      if (stray) await this.#bringBack(netns, stray.ifname, nodeName);
    } catch (err) {
      this.#log.error("Cannot bring back a device after a failed move", { mac, netns, err });
    }
  }

  /** Down, flushed, moved home and renamed in one batch inside the pod. */
  async #bringBack(netns: string, ifName: string, nodeName: string): Promise<void> {
    await ipBatch([
      ["link", "set", "dev", ifName, "down"],
      ["addr", "flush", "dev", ifName],
      ["link", "set", "dev", ifName, "netns", this.#home, "name", nodeName],
    ], { netns });
  }

  async #run<T>(step: string, message: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof DeviceError) throw err;
      throw new DeviceError(step, "failed", `${message}: ${errText(err)}`, { cause: err });
    }
  }
}

/**
 * The identity (nsfs device and inode) of a namespace file; null unless `path` is
 * absolute, free of "..", exists and lives on nsfs (a bind mount such as
 * /run/netns/x, or /proc/<pid>/ns/net).
 *
 * The kernel reuses namespace inode numbers once a namespace is freed, so equal
 * identities taken far apart in time do not prove the same namespace; callers
 * also check that the device they put there (by MAC) is still there.
 */
export async function netnsIdentity(path: string): Promise<NetnsIdentity | null> {
  if (!path.startsWith("/") || path.split("/").includes("..")) return null;
  try {
    const [st, dev] = await Promise.all([statFollow(path), nsfsDevice()]);
    if (!st || !st.isFile || st.dev !== dev) return null;
    return { dev: st.dev, ino: st.ino };
  } catch (err) {
    // A path outside Deno's read permissions is a misconfiguration, not "no namespace".
    if (err instanceof Deno.errors.NotCapable) throw err;
    return null;
  }
}

/** `stat(1)` reads what Deno's permission model keeps out of reach (anything under /proc). */
const STAT_BIN = "/usr/bin/stat";
let nsfsDev: Promise<number> | undefined;

/** The device number every nsfs inode shares (read once per process). */
function nsfsDevice(): Promise<number> {
  nsfsDev ??= statFollow("/proc/self/ns/net").then((st) => {
    if (!st) throw new Error("Cannot stat /proc/self/ns/net");
    return st.dev;
  }).catch((err) => {
    nsfsDev = undefined;
    throw err;
  });
  return nsfsDev;
}

/**
 * Stats a path following links. Deno refuses /proc/<pid>/… and /proc/self/… to
 * anything short of --allow-all, so those go through one `stat -L` spawn (rare:
 * runtimes that pass /proc paths, and the nsfs device once per process).
 */
async function statFollow(
  path: string,
): Promise<{ dev: number; ino: number; isFile: boolean } | null> {
  if (!path.startsWith("/proc/")) {
    try {
      const st = await Deno.stat(path);
      return st.ino === null ? null : { dev: st.dev, ino: st.ino, isFile: st.isFile };
    } catch (err) {
      if (err instanceof Deno.errors.NotCapable) throw err;
      return null;
    }
  }
  try {
    const { stdout } = await spawn([STAT_BIN, "-L", "-c", "%d %i %F", "--", path]);
    const m = stdout.trim().match(/^(\d+) (\d+) (.+)$/);
    if (!m) return null;
    return {
      dev: Number(m[1]),
      ino: Number(m[2]),
      isFile: m[3] === "regular empty file" || m[3] === "regular file",
    };
  } catch {
    return null;
  }
}

/** Wraps steps so each reports its duration to `timing` (when given), success or not. */
function stepTimer(timing?: DeviceTiming) {
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

function normalizeMac(mac: string): string {
  return mac.trim().toLowerCase();
}

function checkIfName(name: string): void {
  if (!IFNAME.test(name) || name === "." || name === "..") {
    throw new DeviceError("validate", "failed", `Invalid interface name "${name}"`);
  }
}

function errText(err: unknown): string {
  if (err instanceof IpError) return err.stderr || err.message;
  return err instanceof Error ? err.message : String(err);
}

type Family = "ipv4" | "ipv6";

function familyOf(addr: string): Family {
  return ipaddr.parse(addr).kind();
}

/** A route destination in canonical CIDR form and its family ("default" follows `gw`, else IPv4). */
function routeDst(dst: string, gw: string | undefined): { dst: string; family: Family } {
  if (dst === "default") {
    const family = gw ? familyOf(gw) : "ipv4";
    return { dst: family === "ipv4" ? "0.0.0.0/0" : "::/0", family };
  }
  const [net, len] = ipaddr.parseCIDR(dst);
  return { dst: `${net.toString()}/${len}`, family: net.kind() };
}

/**
 * The `ip` commands that configure a freshly moved interface: mtu, up, addresses
 * (IPv6 with nodad: the ENI address is unique in the VPC), the default route via
 * each address's gateway, then the extra routes (gw defaulting to the gateway of
 * the route's family). An explicit route to a family's default replaces the implicit one.
 */
export function configureCommands(p: {
  ifName: string;
  addresses: AddressSpec[];
  routes: RouteSpec[];
  mtu?: number;
}): string[][] {
  const dev = p.ifName;
  const cmds: string[][] = [];
  const gateways = new Map<Family, string>();
  try {
    if (p.mtu !== undefined) {
      if (!Number.isInteger(p.mtu) || p.mtu < 68 || p.mtu > 65535) {
        throw new Error(`Invalid MTU ${p.mtu}`);
      }
      cmds.push(["link", "set", "dev", dev, "mtu", String(p.mtu)]);
    }
    cmds.push(["link", "set", "dev", dev, "up"]);
    for (const a of p.addresses) {
      const [addr, len] = ipaddr.parseCIDR(a.cidr);
      const cidr = `${addr.toString()}/${len}`;
      cmds.push(["addr", "add", cidr, "dev", dev, ...(addr.kind() === "ipv6" ? ["nodad"] : [])]);
      if (a.gateway) {
        if (familyOf(a.gateway) !== addr.kind()) {
          throw new Error(`Gateway "${a.gateway}" is not of the family of "${a.cidr}"`);
        }
        if (!gateways.has(addr.kind())) {
          gateways.set(addr.kind(), ipaddr.parse(a.gateway).toString());
        }
      }
    }
    const routes = new Map<string, { dst: string; gw?: string }>();
    for (const [family, gw] of gateways) {
      const dst = family === "ipv4" ? "0.0.0.0/0" : "::/0";
      routes.set(dst, { dst, gw });
    }
    for (const r of p.routes) {
      const { dst, family } = routeDst(r.dst, r.gw);
      const gw = r.gw ? ipaddr.parse(r.gw).toString() : gateways.get(family);
      if (gw && familyOf(gw) !== family) {
        throw new Error(`Gateway "${gw}" is not of the family of "${r.dst}"`);
      }
      routes.set(dst, gw ? { dst, gw } : { dst });
    }
    for (const r of routes.values()) {
      cmds.push(["route", "add", r.dst, ...(r.gw ? ["via", r.gw] : []), "dev", dev]);
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
