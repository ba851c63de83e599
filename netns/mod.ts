/**
 * The real device layer: moves a whole ENI device into a pod's network namespace
 * and back by driving `ip` (through `./ip.ts`, the only module that spawns it).
 *
 * Spawns per operation (named namespaces such as /run/netns/x; a /proc/<pid>/ns/net
 * path costs one extra exec of nsenter for each command run inside it):
 * - plug: 3 (find by MAC on the node, one move+rename+alias, one configure batch in the pod,
 *   which also gives the device its altname `enim<MAC hex>`), 2 when the device's node name
 *   is known (the name cache, or the caller's fresh lookup);
 * - unplug of a device a plug placed (`podName` given): 1, a batch addressed by the altname
 *   (down, its own MAC, home renamed); when that fails (no altname, a driver's refusal), 2
 *   more: find it in the pod (by MAC, alias or name), then the batch by its name;
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
 *   addresses: [{ cidr: "10.99.0.11/24" }],
 *   routes: [{ dst: "0.0.0.0/0", gw: "10.99.0.1" }],
 * });
 * await devices.unplug({ mac: "02:00:0a:63:00:0b", nodeName, netns: "/var/run/netns/cni-1234" });
 * ```
 *
 * Why one file: `IpDeviceLayer` is one class whose steps (plug, unplug, inspect,
 * the stray-device recovery) share its node-name cache and namespace handling;
 * its pure parts (commands, device picking, validation) are in `commands.ts`.
 *
 * Bandwidth shaping (`./bandwidth.ts`, when `PlugParams.bandwidth` asks for it) adds
 * one `tc -batch` in the pod to plug (the ifb it needs is created in the configure
 * batch) and no spawn to unplug (the ifb's removal rides in its batch, and the
 * device's qdiscs leave it with the move); `inspectShaping` is one `tc -j -batch`.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { type Logger, nullLogger } from "../lib/log.ts";
import { expandedIp, formatIp, parseIp } from "../lib/ip.ts";
import { namesOneNamespace, netnsIdentity, type PinnedNetns, pinNetns } from "./pin.ts";
import {
  altnameOf,
  checkIfName,
  configureCommands,
  errText,
  failedLines,
  normalizeMac,
  noSuchDevice,
  parseAddressEvent,
  pickDevice,
  routeConflict,
  stepTimer,
} from "./commands.ts";
import {
  FilterSchema,
  ifbName,
  inspectTcCommands,
  type InstalledShaping,
  installedShaping,
  isShaped,
  type LiveShaping,
  QdiscSchema,
  shapingLinkCommands,
  shapingTcCommands,
} from "./bandwidth.ts";
import { tcBatch } from "./tc.ts";
import {
  AddrInfoSchema,
  batchLine,
  CommandTimeoutError,
  CONNTRACK_BIN,
  DEFAULT_SCRATCH_DIR,
  type FedProcess,
  inNetnsArgv,
  IP_BIN,
  ipBatch,
  IpError,
  ipJson,
  iprouteArgv,
  netnsPath,
  type NetnsRef,
  NFT_BIN,
  nftApply,
  parseJsonLines,
  RouteEntrySchema,
  RuleEntrySchema,
  runIp,
  scratchFile,
  SH_BIN,
  spawn,
  startFed,
  startWatch,
} from "./ip.ts";
import {
  DEFAULT_MARKS,
  HOST_LINK_GROUP,
  type HostLinkRef,
  type HostLinkSpec,
  isNodeEnd,
  NODE_END_SYSCTL_SCRIPT,
  NODE_RULE_PREF,
  NODE_SYSCTL_SCRIPT,
  nodeCommands,
  nodeRouteCommands,
  nodeRuleCommands,
  nodeTableRuleset,
  POD_POLICY_FAILED,
  POD_POLICY_SCRIPT,
  podCommands,
  podPolicyArgs,
  podRuleset,
} from "./host_link.ts";
import {
  type AddressEvent,
  type AddressWatch,
  DeviceError,
  type DeviceLayer,
  type HostLinkNodeSide,
  type HostLinkNodeState,
  type HostLinkState,
  KUBE_IPVS_LINK,
  type Link,
  LinkSchema,
  type NetnsIdentity,
  type NodeAddresses,
  type PlugParams,
  type PlugResult,
  type PodInterfaceState,
  type UnplugOutcome,
  type UnplugParams,
} from "./types.ts";

export * from "./types.ts";
export { configureCommands } from "./commands.ts";
export { netnsIdentity, type PinnedNetns, pinNetns } from "./pin.ts";
export { CommandTimeoutError, setCommandTimeout } from "./child.ts";

/** A neighbour entry, as `ip -j neigh show` reports it. */
const NeighbourSchema = z.looseObject({
  dst: z.string(),
  dev: z.string(),
  lladdr: z.optional(z.string()),
});

/** A link with its addresses, as `ip -j addr show` reports it. */
const LinkAddrSchema = z.extend(LinkSchema, {
  addr_info: z._default(z.array(AddrInfoSchema), []),
});
type LinkAddr = z.infer<typeof LinkAddrSchema>;

/** Options for {@linkcode IpDeviceLayer}. */
export interface IpDeviceLayerOptions {
  /**
   * The namespace playing "the node" (a name under /run/netns or a path). Absent in
   * production: the node is the agent's own namespace. Tests that run outside the
   * simulated node namespace set it.
   */
  node?: string;
  log?: Logger;
  /** Where `ip -batch` files go (default `DEFAULT_SCRATCH_DIR` of `./ip.ts`). */
  scratchDir?: string;
}

/** A namespace as the commands use it (`ref`) and as messages name it (`path`). */
interface Ns {
  ref: string;
  path: string;
}

/** The `ip` a plug starts in the pod's namespace and feeds its configure batch. */
const POD_IP = [IP_BIN, "-force", "-j", "-batch", "-"];

/** A plug's process in the pod's namespace (`#startPodIp`). */
interface PodIp {
  process: FedProcess;
  /** With a host link, its policy's nftables ruleset file (the policy runs before the `ip`). */
  ruleset?: string;
}

/** The host link's policy failed in the pod's process (its `ip` never ran). */
class PolicyError extends Error {
  constructor(cause: IpError) {
    super("The host link's policy failed", { cause });
  }
}

/** The {@linkcode DeviceLayer} that drives iproute2. */
/** Work a step left under way, for a later step to wait for (a promise in a box: `await` would flatten it). */
interface Pending {
  pending: Promise<void>;
}

/** grep (Debian's `grep`, essential), for the node's tracked connections. */
const GREP_BIN = "/bin/grep";

/**
 * Deletes the tracked connections of addresses, original and reply direction, source and
 * destination; `conntrack -D` exits 1 when it found none, which is fine. Fails (127)
 * without `conntrack`. `$1` is `all` (every address), or `listed` or `grep`: only the
 * addresses `/proc/net/nf_conntrack` lists as a source or destination (`=<form> `), read
 * with the shell's builtins (`listed`: a pod's namespace, which tracks few, costs this one
 * process) or one `grep -q` an address (`grep`: the node's, which may track many; the
 * builtins without grep); every address when the file cannot be read. Then pairs: an
 * address, and its form in that file (`expandedIp`: IPv6 in full).
 */
const CONNTRACK_FLUSH_SCRIPT =
  `[ -x ${CONNTRACK_BIN} ] || { echo "${CONNTRACK_BIN} (conntrack-tools) is not installed" >&2; exit 127; }
mode=$1
shift
listed=" "
if [ "$mode" = grep ] && [ -r /proc/net/nf_conntrack ] && [ -x ${GREP_BIN} ]; then
  n=0
  for x in "$@"; do
    n=$((n + 1))
    [ $((n % 2)) -eq 0 ] || continue
    ${GREP_BIN} -q -F -e "=$x " /proc/net/nf_conntrack && listed="$listed$n "
  done
elif [ "$mode" != all ] && [ -r /proc/net/nf_conntrack ]; then
  while read -r line; do
    n=0
    for x in "$@"; do
      n=$((n + 1))
      [ $((n % 2)) -eq 0 ] || continue
      case "$line" in *"=$x "*) case "$listed" in *" $n "*) ;; *) listed="$listed$n ";; esac;; esac
    done
  done < /proc/net/nf_conntrack
else
  listed=all
fi
n=0
for x in "$@"; do
  n=$((n + 1))
  if [ $((n % 2)) -eq 1 ]; then a=$x; continue; fi
  case "$listed" in all | *" $n "*) ;; *) continue ;; esac
  for f in --orig-src --orig-dst --reply-src --reply-dst; do ${CONNTRACK_BIN} -D "$f" "$a" >/dev/null 2>&1; done
done
exit 0`;

export class IpDeviceLayer implements DeviceLayer {
  readonly #node: NetnsRef;
  /** What `ip link set … netns X` takes to bring a device home. */
  readonly #home: string;
  readonly #log: Logger;
  readonly #scratch: string | undefined;
  /** False once a driver refused to change a MAC: then nothing can have changed one. */
  #macSettable = true;
  /**
   * The node-side name of each device last seen on the node, by MAC: `plug` moves by
   * this name without listing the node first. Refreshed by every listing of the node
   * and by `unplug`; a stale entry costs one lookup (the move fails, or the moved
   * device's MAC is checked and it is brought back).
   */
  #names = new Map<string, string>();

  constructor(opts: IpDeviceLayerOptions = {}) {
    this.#node = opts.node;
    this.#home = opts.node === undefined ? String(Deno.pid) : netnsPath(opts.node);
    this.#log = opts.log ?? nullLogger;
    this.#scratch = opts.scratchDir;
  }

  #batch(
    commands: (string | number)[][],
    netns: NetnsRef,
    json = false,
    force = false,
    family?: 6,
  ): Promise<unknown[]> {
    return ipBatch(commands, {
      netns,
      json,
      force,
      scratchDir: this.#scratch,
      ...(family ? { family } : {}),
    });
  }

  /** Lists the node's links with their addresses and refreshes the name cache. */
  async #nodeLinks(): Promise<LinkAddr[]> {
    const links = await this.#run(
      "find",
      "Cannot list links on the node",
      () => ipJson(z.array(LinkAddrSchema), ["addr", "show"], { netns: this.#node }),
    );
    this.#names = new Map(
      links.filter((l) => l.address).map((l) => [normalizeMac(l.address!), l.ifname]),
    );
    return links;
  }

  async nodeLinks(): Promise<Link[]> {
    return await this.#nodeLinks();
  }

  /** Finds a link by MAC in the node namespace, or in `netns` when given. */
  async findByMac(mac: string, netns?: string): Promise<Link | null> {
    const want = normalizeMac(mac);
    if (netns === undefined) {
      return (await this.#nodeLinks()).find((l) => l.address?.toLowerCase() === want) ?? null;
    }
    await this.#requireNetns("find", netns);
    const links = await this.#run(
      "find",
      `Cannot list links in netns "${netns}"`,
      () => ipJson(z.array(LinkSchema), ["link", "show"], { netns }),
    );
    return links.find((l) => l.address?.toLowerCase() === want) ?? null;
  }

  /** The device's node name: the caller's, the cached one, or (one spawn) a lookup. */
  async #nodeNameOf(p: PlugParams, lookup: boolean): Promise<string> {
    if (!lookup) {
      const known = p.nodeName ?? this.#names.get(normalizeMac(p.mac));
      if (known !== undefined) return known;
    }
    const timed = stepTimer(p.timing);
    const link = await timed(
      "device_lookup",
      async () =>
        (await this.#nodeLinks()).find((l) => l.address?.toLowerCase() === normalizeMac(p.mac)),
    );
    if (!link) {
      throw new DeviceError(
        "find",
        "not_found",
        `Cannot find a link with MAC "${p.mac}" on the node`,
      );
    }
    return link.ifname;
  }

  /**
   * Moves the device into the pod renamed `ifName`, and configures it; rolls back on
   * failure. Two spawns when the device's node name is known (the caller's or the
   * cache's): the pod's `ip -batch -`, started first so that its exec (and nsenter's)
   * overlaps the move (with a `policyRuleset`, just after the move's, once that text is
   * made: its making overlaps the move), and the move (one netlink call: netns, name
   * and alias); the pod's process is fed the configure batch once the device is there,
   * whose first command shows the moved link so its MAC is checked. With a host link,
   * its node side runs in the move's batch, its pod side in the configure batch, and its
   * policy first in the pod's process, before that `ip` (`POD_POLICY_SCRIPT`); with
   * bandwidth limits, the configure batch also makes the ifb and one `tc -batch` shapes.
   * A failure anywhere brings the device back and removes the ifb and the host link.
   */
  async plug(p: PlugParams): Promise<PlugResult> {
    checkIfName(p.ifName);
    if (p.nodeName !== undefined) checkIfName(p.nodeName);
    const link = p.hostLink;
    if (link) {
      checkIfName(link.podIfName);
      checkIfName(link.nodeIfName);
    }
    const config = [
      ...configureCommands(p),
      ...shapingLinkCommands(p.mac, p.bandwidth),
      ...(link ? podCommands(link) : []),
    ];
    const ns = await this.#useNetns("netns", p.netns);
    let pod: Promise<PodIp> | undefined;
    // Once: with the policy's text, when the plug's `policyRuleset` gives it.
    const startPod = () =>
      pod ??= (async () =>
        this.#startPodIp(
          ns,
          link,
          p.ifName,
          p.policyRuleset ? await p.policyRuleset() : undefined,
        ))();
    // Without a policy to wait for, the pod's process starts before the move.
    if (!p.policyRuleset) startPod().catch(() => {});
    try {
      return await this.#plugDevice(p, ns, config, startPod);
    } finally {
      // Not fed (the move failed): it reads end-of-file and exits; what its policy left
      // after a failed plug is inert (`netns/host_link.ts`). Fed: this is its outcome
      // again, which the configure step has turned into the plug's error already (a
      // deadline missed, say), never to replace that error here. Never started (the
      // policy's text failed): nothing to end.
      const started = await pod?.catch(() => null);
      if (started) {
        await started.process.feed("").catch(() => {});
        if (started.ruleset) await Deno.remove(started.ruleset).catch(() => {});
      }
    }
  }

  /**
   * The plug's one process in the pod's namespace, started before the move (with a
   * policy to wait for: once the move's processes run): with a host link,
   * `POD_POLICY_SCRIPT` (which needs neither the ENI nor the link in the pod) runs its
   * policy and the `ip` (its rules beside them, waiting for the move's rtnl lock);
   * without, the `ip` alone. `policyRuleset` (the pod's NetworkPolicy table) rides in
   * the host link's ruleset file: one `nft -f`, before the device is configured (it
   * stays down until then).
   */
  #startPodIp(
    ns: Ns,
    link: HostLinkSpec | undefined,
    ifName: string,
    policyRuleset?: string,
  ): PodIp {
    if (!link) return { process: startFed(inNetnsArgv(POD_IP, ns.ref)) };
    const ruleset = scratchFile(
      this.#scratch ?? DEFAULT_SCRATCH_DIR,
      podRuleset(link, ifName) + (policyRuleset ?? ""),
    );
    const argv = inNetnsArgv([
      SH_BIN,
      "-c",
      POD_POLICY_SCRIPT,
      "enim-host-link",
      ...podPolicyArgs(link, ruleset, { ip: IP_BIN, nft: NFT_BIN }),
      ...POD_IP,
    ], ns.ref);
    return { process: startFed(argv), ruleset };
  }

  /**
   * The device moved (with the host link's node side), configured and shaped; rolled
   * back on failure (the device, its ifb, the host link).
   */
  async #plugDevice(
    p: PlugParams,
    ns: Ns,
    config: string[][],
    startPod: () => Promise<PodIp>,
  ): Promise<PlugResult> {
    const link = p.hostLink;
    const mac = normalizeMac(p.mac);
    for (let attempt = 0;; attempt++) {
      const lookup = attempt > 0;
      const nodeName = await this.#nodeNameOf(p, lookup);
      p.beforeMove?.(nodeName);
      let pending: Pending;
      // The move's processes are running once `#move` returns its promise (their batch
      // files are written synchronously): the policy's text is made while they work.
      const moving = this.#move(p, ns, nodeName);
      const podStarted = startPod();
      podStarted.catch(() => {});
      try {
        pending = await moving;
      } catch (err) {
        if (!lookup && err instanceof DeviceError && noSuchDevice(err.cause)) {
          this.#log.debug("Stale device name; looking the device up", { mac, nodeName });
          continue;
        }
        throw err;
      }
      this.#names.delete(mac);
      let shaping: InstalledShaping | undefined;
      let shown: Link | null;
      try {
        let pod: PodIp;
        try {
          pod = await podStarted;
        } catch (err) {
          // The policy's text failed (its own error is the plug's): the device goes home.
          await pending.pending.catch(() => {});
          await this.#bringBackLogged(p, ns, nodeName);
          throw err;
        }
        shown = await this.#configure(p, ns, config, nodeName, pod);
        if (shown !== null) {
          try {
            await pending.pending;
          } catch (err) {
            await this.#bringBackLogged(p, ns, nodeName);
            throw err;
          }
        }
        // The shaping's failure brings the device back (and its ifb): the link goes too.
        if (shown !== null && isShaped(p.bandwidth)) {
          shaping = await this.#shape(p, ns, nodeName, shown);
        }
      } catch (err) {
        if (link) await this.#dropHostLinkLogged(link);
        throw err;
      }
      if (shown !== null) {
        return { nodeName, podIfindex: shown.ifindex, ...(shaping ? { shaping } : {}) };
      }
      if (link) await this.#dropHostLinkLogged(link);
      // The name led to another device: it is back on the node; look ours up once.
      if (lookup) {
        throw new DeviceError(
          "move",
          "failed",
          `The device named "${nodeName}" on the node does not have MAC "${p.mac}"`,
        );
      }
      this.#log.warn("A stale device name led to another device; it was moved back", {
        mac,
        nodeName,
      });
    }
  }

  /**
   * One netlink call: into the pod, renamed, the node name kept as the alias. With a
   * host link, the same `ip -batch` creates it first (its pod end directly in the pod,
   * the node end's routes and neighbours); a failure removes what the batch made.
   */
  async #move(p: PlugParams, ns: Ns, nodeName: string): Promise<Pending> {
    const started = performance.now();
    const move = [
      "link",
      "set",
      "dev",
      nodeName,
      "netns",
      ns.ref,
      "name",
      p.ifName,
      "alias",
      nodeName,
    ];
    const link = p.hostLink;
    // The node's IPv4 rules first (a batch line's `ip rule` is IPv4): a failure there
    // has made nothing yet.
    const rules4 = link?.podAddresses.ipv4
      ? nodeRuleCommands(link, link.podAddresses.ipv4, "add")
      : [];
    const lines = link ? [...rules4, ...nodeCommands(link, ns.ref), move] : [move];
    let pending: Pending = { pending: Promise.resolve() };
    try {
      try {
        pending = await this.#moveBatch(lines, link);
      } catch (err) {
        if (!link || !(err instanceof IpError)) throw err;
        // The batch stops at its first failure: what came before it was done.
        const failed = failedLines(err.stderr)[0] ?? lines.length;
        const exists = /File exists/i.test(err.stderr);
        // "File exists" at a rule: rules of an earlier node end of this name; at the link:
        // that node end itself, or the pod end's name taken in the pod (no node end then).
        let leftover = false;
        if (exists && failed === rules4.length + 1) {
          leftover = await this.removeHostLink(link.nodeIfName).catch(() => false);
        }
        if (!leftover) {
          await this.#dropHostLinkLogged(link);
          leftover = exists && failed <= rules4.length;
        }
        if (failed === lines.length) throw err;
        if (!leftover) throw this.#hostLinkError(link, ns, err);
        // What an earlier node end of this attachment's name left: gone now, once more.
        this.#log.warn("Removed a leftover node end of this attachment's host link", {
          nodeIfName: link.nodeIfName,
        });
        try {
          pending = await this.#moveBatch(lines, link);
        } catch (again) {
          await this.#dropHostLinkLogged(link);
          if (again instanceof IpError && (failedLines(again.stderr)[0] ?? 0) < lines.length) {
            throw this.#hostLinkError(link, ns, again);
          }
          throw again;
        }
      }
      p.timing?.("move", performance.now() - started);
      return pending;
    } catch (err) {
      if (err instanceof DeviceError) throw err;
      const exists = err instanceof IpError && /File exists/i.test(err.stderr);
      // Some kernels (6.18 here) move the device first and then fail the rename
      // with EEXIST, leaving it in the pod under its node name: bring it back.
      if (exists) await this.#recoverFailedMove(p.mac, ns.ref, nodeName);
      throw new DeviceError(
        "move",
        exists ? "ifname_exists" : "failed",
        exists
          ? `Cannot move link "${nodeName}" into netns "${ns.path}" as "${p.ifName}": the name exists there`
          : `Cannot move link "${nodeName}" into netns "${ns.path}" as "${p.ifName}": ${
            errText(err)
          }`,
        { cause: err },
      );
    }
  }

  /**
   * The move's batch on the node and, for a host link of a pod with IPv6, its IPv6
   * rules on the node beside it (`ip -6 -batch`: a batch line cannot say its family; a
   * rule needs no link, and its exec overlaps the move), which the plug waits for. When
   * the move's batch fails, it returns once the rules have settled (the caller removes
   * them with the link). A failure of the rules is the host link's (the caller removes
   * the link, and with it the rules).
   */
  async #moveBatch(lines: string[][], link: HostLinkSpec | undefined): Promise<Pending> {
    const v6 = link?.podAddresses.ipv6;
    if (!link) {
      await this.#batch(lines, this.#node);
      return { pending: Promise.resolve() };
    }
    const rules = v6 ? this.#nodeRules6(link, v6) : Promise.resolve();
    rules.catch(() => {});
    try {
      await this.#batch(lines, this.#node);
    } catch (err) {
      await rules.catch(() => {});
      throw err;
    }
    const p = rules.catch((err) => {
      throw new DeviceError(
        "host_link",
        "failed",
        `Cannot add the node's IPv6 rules of the host link "${link.nodeIfName}": ${errText(err)}`,
        { cause: err },
      );
    });
    // The node end made: its sysctls (no router advertisements, redirects or source
    // routes from the pod), beside the plug's next steps, before it answers.
    const hardened = this.#hardenNodeEnd(link.nodeIfName);
    const both = Promise.all([p, hardened]).then(() => {});
    both.catch(() => {});
    return { pending: both };
  }

  /** {@linkcode NODE_END_SYSCTL_SCRIPT} for a new node end, on the node. */
  async #hardenNodeEnd(nodeIfName: string): Promise<void> {
    try {
      await spawn(inNetnsArgv(
        [SH_BIN, "-c", NODE_END_SYSCTL_SCRIPT, "enim-sysctl", nodeIfName],
        this.#node ?? "/proc/self/ns/net",
      ));
    } catch (err) {
      throw new DeviceError(
        "host_link",
        "failed",
        `Cannot set the sysctls of the host link's node end "${nodeIfName}" (accept_ra, accept_redirects, accept_source_route): ${
          errText(err)
        }`,
        { cause: err },
      );
    }
  }

  /**
   * Adds the node's IPv6 rules of a new link; when that fails (rules of an earlier node
   * end of the same name, not removed yet) they are deleted and added again.
   */
  async #nodeRules6(link: HostLinkSpec, addr: string): Promise<void> {
    const add = nodeRuleCommands(link, addr, "add");
    try {
      await this.#batch(add, this.#node, false, false, 6);
    } catch {
      await this.#batch(nodeRuleCommands(link, addr, "del"), this.#node, false, true, 6)
        .catch(() => {});
      await this.#batch(add, this.#node, false, false, 6);
    }
  }

  /** The error for a host link the node-side batch could not create. */
  #hostLinkError(link: HostLinkSpec, ns: Ns, err: IpError): DeviceError {
    const exists = /File exists/i.test(err.stderr);
    return new DeviceError(
      "host_link",
      exists ? "ifname_exists" : "failed",
      exists
        ? `Cannot create the host link "${link.podIfName}" in netns "${ns.path}": the pod has an interface of that name (set "hostLink": {"podIfName": …} or "hostLink": {"enabled": false} in the network config)`
        : `Cannot create the host link "${link.nodeIfName}"/"${link.podIfName}" for netns "${ns.path}": ${
          errText(err)
        }`,
      { cause: err },
    );
  }

  async #dropHostLinkLogged(link: HostLinkRef): Promise<void> {
    try {
      await this.removeHostLink(link.nodeIfName);
    } catch (err) {
      this.#log.error("Cannot remove a host link after a failed plug", {
        nodeIfName: link.nodeIfName,
        err,
      });
    }
  }

  /**
   * Configures the moved link in one batch and returns it as it is in the pod, or
   * null when the moved link is not the ENI's (then it is back on the node). Any
   * failure brings the device back and throws.
   */
  async #configure(
    p: PlugParams,
    ns: Ns,
    config: string[][],
    nodeName: string,
    pod: PodIp,
  ): Promise<Link | null> {
    const timed = stepTimer(p.timing);
    let shown: Link[];
    // Last, and allowed to fail (the device has it already from an earlier pod, or the
    // kernel predates altnames): the name a DEL finds the device by without a lookup.
    const alt = ["link", "property", "add", "dev", p.ifName, "altname", altnameOf(p.mac)];
    const lines = [["link", "show", "dev", p.ifName], ...config, alt];
    try {
      let out: unknown[];
      try {
        out = await timed("configure", () => this.#configureBatch(lines, ns, pod));
      } catch (err) {
        // -force ran every line: only the altname's failing is fine.
        if (!(err instanceof IpError)) throw err;
        const failed = failedLines(err.stderr);
        if (failed.length !== 1 || failed[0] !== lines.length) throw err;
        if (!/File exists/i.test(err.stderr)) {
          this.#log.debug("No altname on the device; DEL looks it up", { error: errText(err) });
        }
        out = parseJsonLines(err.stdout);
      }
      shown = z.array(LinkSchema).parse(out[0]);
      if (shown.length !== 1) {
        throw new Error(`Expected one link "${p.ifName}", got ${shown.length}`);
      }
    } catch (err) {
      await this.#bringBackLogged(p, ns, nodeName);
      throw new DeviceError(
        "configure",
        "failed",
        err instanceof PolicyError
          ? `Cannot set the host link's policy in netns "${ns.path}": ${errText(err.cause)}`
          : `Cannot configure link "${p.ifName}" in netns "${ns.path}": ${
            routeConflict(err, config) ?? errText(err)
          }`,
        { cause: err },
      );
    }
    if (shown[0].address?.toLowerCase() !== normalizeMac(p.mac)) {
      await this.#bringBackLogged(p, ns, nodeName);
      return null;
    }
    return shown[0];
  }

  /**
   * The configure batch, through the plug's pod process when it is still waiting (the
   * first try), else one `ip -batch FILE` in the pod (a second try, after a stale
   * name). Throws {@linkcode PolicyError} when the pod process's policy failed.
   */
  async #configureBatch(lines: string[][], ns: Ns, pod: PodIp): Promise<unknown[]> {
    if (pod.process.fed) return await this.#batch(lines, ns.ref, true, true);
    const { code, stdout, stderr } = await pod.process.feed(
      lines.map(batchLine).join("\n") + "\n",
    );
    const argv = inNetnsArgv(POD_IP, ns.ref);
    if (pod.ruleset !== undefined && code === POD_POLICY_FAILED) {
      throw new PolicyError(new IpError(argv, code, stderr));
    }
    if (code !== 0) throw new IpError(argv, code, stderr, { stdout });
    return parseJsonLines(stdout);
  }

  /**
   * Shapes the configured link's bandwidth (`./bandwidth.ts`) in one `tc -batch`; the
   * ifb for ingress exists already (the configure batch made it). A failure brings the
   * device back, removes the ifb and throws.
   */
  async #shape(p: PlugParams, ns: Ns, nodeName: string, link: Link): Promise<InstalledShaping> {
    const mtu = typeof link.mtu === "number" ? link.mtu : p.mtu ?? 1500;
    const installed = installedShaping(p.bandwidth!, mtu);
    try {
      await stepTimer(p.timing)(
        "shape",
        () =>
          tcBatch(shapingTcCommands(p.ifName, p.mac, installed), {
            netns: ns.ref,
            scratchDir: this.#scratch,
          }),
      );
    } catch (err) {
      await this.#bringBackLogged(p, ns, nodeName);
      throw new DeviceError(
        "shape",
        "failed",
        `Cannot shape the bandwidth of link "${p.ifName}" in netns "${ns.path}": ${errText(err)}`,
        { cause: err },
      );
    }
    return installed;
  }

  /** Rolls a failed plug back: the device home, and the ifb a shaped plug made removed. */
  async #bringBackLogged(p: PlugParams, ns: Ns, nodeName: string): Promise<void> {
    try {
      await this.#bringBack(ns.ref, p.ifName, nodeName);
    } catch (rollbackErr) {
      this.#log.error("Cannot roll back a failed plug", {
        mac: p.mac,
        netns: ns.path,
        ifName: p.ifName,
        err: rollbackErr,
      });
    }
    if (p.bandwidth?.ingress) await this.#removeIfb(ns, p.mac);
  }

  /** Removes the ENI's ifb from the pod, if it is there; a failure is only logged. */
  async #removeIfb(ns: Ns, mac: string): Promise<void> {
    try {
      await runIp(["link", "del", "dev", ifbName(mac)], { netns: ns.ref });
    } catch (err) {
      if (!noSuchDevice(err)) {
        this.#log.error("Cannot remove the ifb device of a failed plug", {
          mac,
          netns: ns.path,
          ifb: ifbName(mac),
          err,
        });
      }
    }
  }

  /**
   * Brings the device back to the node renamed `nodeName`, down, without addresses and
   * with its own MAC again. Idempotent. The device is found by MAC, else by the alias
   * enim set (its MAC was changed), else (`podName`) by the name enim gave it in the pod.
   */
  async unplug(p: UnplugParams): Promise<UnplugOutcome> {
    checkIfName(p.nodeName);
    const link = p.hostLink;
    if (link) {
      checkIfName(link.nodeIfName);
      checkIfName(link.podIfName);
    }
    const done = { hostLink: false };
    const outcome = await this.#unplugEni(p, done);
    // Not removed with the device's batch: by the node end's name (the pair goes with it).
    if (link && !done.hostLink) {
      await this.#run(
        "host_link",
        `Cannot remove the host link "${link.nodeIfName}" from the node`,
        () => this.removeHostLink(link.nodeIfName),
      );
    } else if (link) {
      await this.#dropNodeRules(link.nodeIfName);
    }
    return outcome;
  }

  async #unplugEni(p: UnplugParams, done: { hostLink: boolean }): Promise<UnplugOutcome> {
    const timed = stepTimer(p.timing);
    const mac = normalizeMac(p.mac);
    const ns = p.netns ? await this.#usableNetns(p.netns) : null;
    // The one-spawn way: the device placed by an ADD carries its altname, which names
    // no other device. Its own MAC again (a chained plugin may have changed it; a driver
    // that cannot change a MAC cannot have had it changed), then home. Anything else
    // (no such device, a driver's refusal) takes the way below, which looks first.
    if (ns && p.podName !== undefined) {
      const alt = altnameOf(mac);
      try {
        await timed("move", () =>
          this.#batch([
            // First: when it is gone already, nothing else runs and the way below looks.
            ...(p.shapedIngress ? [["link", "del", "dev", ifbName(mac)]] : []),
            ["link", "set", "dev", alt, "down"],
            ...(this.#macSettable ? [["link", "set", "dev", alt, "address", mac]] : []),
            ["link", "set", "dev", alt, "netns", this.#home, "name", p.nodeName],
            // Last: the host link's pod end, and with it the node end.
            ...(p.hostLink ? [["link", "del", "dev", p.hostLink.podIfName]] : []),
          ], ns.ref));
        this.#names.set(mac, p.nodeName);
        done.hostLink = true;
        return "pod";
      } catch (err) {
        if (err instanceof IpError && /Operation not supported/i.test(err.stderr)) {
          this.#macSettable = false;
        }
        if (!noSuchDevice(err)) {
          this.#log.debug("The direct way home failed; looking the device up", {
            mac,
            error: errText(err),
          });
        }
      }
    }
    if (ns) {
      let inPod: Link | null = null;
      // The ifb of a shaped ingress, whether or not the caller knows of one (a crash
      // in the middle of a shaped ADD leaves no record of it): it goes with the device.
      let ifb: string[][] = [];
      try {
        const links = await timed(
          "device_lookup",
          () => ipJson(z.array(LinkSchema), ["link", "show"], { netns: ns.ref }),
        );
        // By the name enim gave it only where that name can be no other pod's device.
        inPod = pickDevice(
          links,
          mac,
          p.nodeName,
          namesOneNamespace(p.netns!) ? p.podName : undefined,
        );
        if (links.some((l) => l.ifname === ifbName(mac))) {
          ifb = [["link", "del", "dev", ifbName(mac)]];
          if (!inPod) await this.#removeIfb(ns, mac);
        }
      } catch (err) {
        // A pinned namespace cannot vanish: the device is there, unreadable. Fail, so the
        // ENI stays held until a retry finds it (never freed while unaccounted for).
        if (typeof p.netns !== "string") {
          throw new DeviceError(
            "unplug",
            "failed",
            `Cannot list the links of netns "${ns.path}" to bring the device back: ${errText(err)}`,
            { cause: err },
          );
        }
        // A path's namespace may have vanished since the check: look on the node.
        this.#log.warn("Cannot list links in the pod; looking on the node", {
          netns: ns.path,
          err,
        });
      }
      if (inPod) {
        const restore = inPod.address?.toLowerCase() !== mac;
        if (restore) {
          this.#log.warn("The device's MAC was changed in the pod; restoring it", {
            mac,
            found: inPod.address,
            ifName: inPod.ifname,
          });
        }
        await this.#run(
          "move_back",
          `Cannot move link "${inPod.ifname}" from netns "${ns.path}" back to the node as "${p.nodeName}"`,
          () =>
            timed(
              "move",
              () =>
                this.#bringBack(ns.ref, inPod.ifname, p.nodeName, restore ? mac : undefined, ifb),
            ),
        );
        this.#names.set(mac, p.nodeName);
        return "pod";
      }
    }
    const links = await timed("device_lookup", () => this.#nodeLinks());
    const onNode = pickDevice(links, mac, p.nodeName);
    if (!onNode) return "missing";
    const renamed = onNode.ifname !== p.nodeName;
    const restore = onNode.address?.toLowerCase() !== mac;
    const up = onNode.flags.includes("UP");
    const addrs = links.find((l) => l.ifindex === onNode.ifindex)?.addr_info.length ?? 0;
    if (!renamed && !restore && !up && addrs === 0) return "node";
    const cmds: string[][] = [["link", "set", "dev", onNode.ifname, "down"]];
    if (renamed) cmds.push(["link", "set", "dev", onNode.ifname, "name", p.nodeName]);
    if (restore) cmds.push(["link", "set", "dev", p.nodeName, "address", mac]);
    cmds.push(["addr", "flush", "dev", p.nodeName]);
    await this.#run(
      "scrub",
      `Cannot restore link "${onNode.ifname}" on the node as "${p.nodeName}"`,
      () => timed("move", () => this.#batch(cmds, this.#node)),
    );
    this.#names.set(mac, p.nodeName);
    return "node";
  }

  /** Reads the interface `ifName` in `netns`: link, global addresses, and the pod's routes. */
  async inspect(p: { netns: string; ifName: string }): Promise<PodInterfaceState> {
    checkIfName(p.ifName);
    const ns = await this.#useNetns("inspect", p.netns);
    let out: unknown[];
    try {
      // `addr show` first: in one batch, an `addr show` after a `link show` loses its addresses.
      out = await ipBatch([
        ["addr", "show", "dev", p.ifName],
        ["route", "show", "table", "all"],
        ["link", "show", "dev", p.ifName],
      ], { netns: ns.ref, json: true, scratchDir: this.#scratch });
    } catch (err) {
      if (err instanceof IpError && /does not exist|Cannot find device/.test(err.stderr)) {
        return { link: null, addresses: [], routes: [] };
      }
      throw new DeviceError(
        "inspect",
        "failed",
        `Cannot read link "${p.ifName}" in netns "${ns.path}": ${errText(err)}`,
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
          // `ip -j` prints "default" for both families, and a host route without its
          // prefix length: name both explicitly.
          const dst = r.dst !== "default"
            ? (r.dst.includes("/") ? r.dst : `${r.dst}/${r.dst.includes(":") ? 128 : 32}`)
            : r.gateway?.includes(":") || r.dst.includes(":")
            ? "::/0"
            : "0.0.0.0/0";
          return r.gateway ? { dst, gw: r.gateway } : { dst };
        }),
    };
  }

  /** Reads the namespace's qdiscs and the interface's ingress filters (one `tc -j -batch`). */
  async inspectShaping(p: { netns: string | PinnedNetns; ifName: string }): Promise<LiveShaping> {
    checkIfName(p.ifName);
    const ns = await this.#useNetns("inspect", p.netns);
    try {
      const out = await tcBatch(inspectTcCommands(p.ifName), {
        netns: ns.ref,
        json: true,
        scratchDir: this.#scratch,
      });
      return {
        qdiscs: z.array(QdiscSchema).parse(out[0] ?? []),
        filters: z.array(FilterSchema).parse(out[1] ?? []),
      };
    } catch (err) {
      throw new DeviceError(
        "inspect",
        "failed",
        `Cannot read the bandwidth shaping of link "${p.ifName}" in netns "${ns.path}": ${
          errText(err)
        }`,
        { cause: err },
      );
    }
  }

  /** Reads a host link: its pod end in `netns` (one spawn), its node end and routes (one more). */
  async inspectHostLink(
    p: { netns: string | PinnedNetns; hostLink: HostLinkRef },
  ): Promise<HostLinkState> {
    checkIfName(p.hostLink.podIfName);
    checkIfName(p.hostLink.nodeIfName);
    const ns = await this.#useNetns("inspect", p.netns);
    const missing = (err: unknown) =>
      err instanceof IpError && /does not exist|Cannot find device/.test(err.stderr);
    const podRead = (err: unknown): never => {
      throw new DeviceError(
        "inspect",
        "failed",
        `Cannot read link "${p.hostLink.podIfName}" in netns "${ns.path}": ${errText(err)}`,
        { cause: err },
      );
    };
    const [podEnd, podRules] = await Promise.all([
      ipJson(z.array(LinkSchema), ["link", "show", "dev", p.hostLink.podIfName], { netns: ns.ref })
        .then((l) => l[0] ?? null, (err) => missing(err) ? null : podRead(err)),
      Promise.all([
        this.#batch([["rule", "list"]], ns.ref, true),
        this.#batch([["rule", "list"]], ns.ref, true, false, 6),
      ]).then(
        (outs) => outs.flatMap((o) => z.array(RuleEntrySchema).parse(o[0] ?? [])),
        podRead,
      ),
    ]);
    let out: unknown[];
    try {
      out = await this.#batch(
        [
          ["link", "show", "dev", p.hostLink.nodeIfName],
          ["route", "show", "table", "all", "dev", p.hostLink.nodeIfName],
        ],
        this.#node,
        true,
      );
    } catch (err) {
      if (missing(err)) return { podEnd, nodeEnd: null, nodeRoutes: [], podRules };
      throw new DeviceError(
        "inspect",
        "failed",
        `Cannot read link "${p.hostLink.nodeIfName}" on the node: ${errText(err)}`,
        { cause: err },
      );
    }
    const nodeEnd = z.array(LinkSchema).parse(out[0] ?? [])[0] ?? null;
    const routes = z.array(RouteEntrySchema).parse(out[1] ?? []);
    return {
      podEnd,
      nodeEnd,
      nodeRoutes: routes
        .filter((r) => (r.table === undefined || r.table === "main") && r.protocol !== "kernel")
        .filter((r) => r.type === undefined || r.type === "unicast")
        .map((r) => r.dst.includes("/") ? r.dst : `${r.dst}/${r.dst.includes(":") ? 128 : 32}`),
      podRules,
    };
  }

  /** The node ends on the node: one `ip -j link show group …`. */
  async hostLinks(): Promise<Link[]> {
    const links = await this.#run(
      "find",
      "Cannot list the host links on the node",
      () =>
        // iproute2 prints `{}` for each link the group filter leaves out: keep the real ones.
        ipJson(z.array(z.looseObject({})), ["link", "show", "group", String(HOST_LINK_GROUP)], {
          netns: this.#node,
        }),
    );
    return z.array(LinkSchema).parse(links.filter((l) => "ifname" in l)).filter(isNodeEnd);
  }

  /**
   * Deletes the node end `nodeIfName` (its pod end goes with it, and the routes of its
   * table) and its rules on the node (both families; a rule already gone is fine);
   * false when the link was not there.
   */
  async removeHostLink(nodeIfName: string): Promise<boolean> {
    checkIfName(nodeIfName);
    try {
      await Promise.all([
        runIp(["link", "del", "dev", nodeIfName], { netns: this.#node }),
        this.#dropNodeRules(nodeIfName),
      ]);
      return true;
    } catch (err) {
      if (noSuchDevice(err)) return false;
      throw new DeviceError(
        "host_link",
        "failed",
        `Cannot remove the host link "${nodeIfName}" from the node: ${errText(err)}`,
        { cause: err },
      );
    }
  }

  /**
   * Deletes the node's rules of a host link, both families (`-force`: a rule already
   * gone is fine; what a failure leaves, GC's sweep of detached rules removes).
   */
  async #dropNodeRules(nodeIfName: string): Promise<void> {
    const ref = { nodeIfName, table: 0, marks: DEFAULT_MARKS };
    await Promise.all([false, true].map((v6) =>
      this.#batch(
        nodeRuleCommands(ref, v6 ? "::" : "0.0.0.0", "del"),
        this.#node,
        false,
        true,
        v6 ? 6 : undefined,
      ).catch(() => {})
    ));
  }

  /** The node's addresses and its primary one per family: one `ip -j -batch` (links, defaults). */
  async nodeAddresses(): Promise<NodeAddresses> {
    const out = await this.#run(
      "find",
      "Cannot list the node's addresses",
      () =>
        // `table all`: both families' defaults (`table main` would show IPv4 only).
        this.#batch(
          [["addr", "show"], ["route", "show", "table", "all", "default"]],
          this.#node,
          true,
        ),
    );
    const links = z.array(LinkAddrSchema).parse(out[0] ?? []);
    const defaults = z.array(RouteEntrySchema).parse(out[1] ?? [])
      .filter((r) => r.table === undefined || r.table === "main");
    return nodeAddressesOf(links, defaults);
  }

  /**
   * The node side of every host link: one `ip -j -batch` on the node (the node ends,
   * the routes of all tables, the permanent neighbours), kept to the node ends.
   */
  async hostLinkNodeState(): Promise<HostLinkNodeState> {
    const out = await this.#run(
      "find",
      "Cannot list the node's routes over the host links",
      () =>
        this.#batch(
          [
            ["link", "show", "group", String(HOST_LINK_GROUP)],
            ["route", "show", "table", "all"],
            ["neigh", "show", "nud", "permanent"],
          ],
          this.#node,
          true,
        ),
    );
    // iproute2 prints `{}` for each link the group filter leaves out.
    const ends = z.array(z.looseObject({})).parse(out[0] ?? []).filter((l) => "ifname" in l);
    const nodeEnds = z.array(LinkSchema).parse(ends).filter(isNodeEnd).map((l) => l.ifname);
    const on = new Set(nodeEnds);
    const hostPrefix = (dst: string) =>
      dst.includes("/") ? dst : `${dst}/${dst.includes(":") ? 128 : 32}`;
    const routes = z.array(RouteEntrySchema).parse(out[1] ?? [])
      .filter((r) => (r.table === undefined || r.table === "main") && on.has(r.dev ?? ""))
      .map((r) => ({
        dst: hostPrefix(r.dst),
        dev: r.dev!,
        ...(r.prefsrc ? { prefsrc: r.prefsrc } : {}),
      }));
    const neighbours = z.array(NeighbourSchema).parse(out[2] ?? [])
      .filter((n) => on.has(n.dev))
      .map((n) => ({
        dst: n.dst,
        dev: n.dev,
        ...(n.lladdr ? { lladdr: n.lladdr.toLowerCase() } : {}),
      }));
    return { nodeEnds, routes, neighbours };
  }

  /**
   * Sets the node's routes and permanent neighbours of `links` again: one `ip -batch
   * -force` on the node (`nodeRouteCommands` of `./host_link.ts`); returns each failed
   * line's message.
   */
  async restoreHostLinkNodeSide(links: HostLinkNodeSide[]): Promise<string[]> {
    for (const l of links) checkIfName(l.nodeIfName);
    const lines = links.flatMap((l) => nodeRouteCommands(l));
    if (lines.length === 0) return [];
    try {
      await this.#batch(lines, this.#node, false, true);
      return [];
    } catch (err) {
      if (!(err instanceof IpError) || err instanceof CommandTimeoutError) {
        throw new DeviceError(
          "host_link",
          "failed",
          `Cannot restore the node's routes over the host links: ${errText(err)}`,
          { cause: err },
        );
      }
      const failed = failedLines(err.stderr);
      const text = err.stderr.split("\n").filter((l) => l.trim() !== "");
      return failed.length === 0
        ? [errText(err)]
        : failed.map((n) => `"ip ${lines[n - 1]?.join(" ")}" failed: ${text.join("; ")}`);
    }
  }

  /**
   * Watches the node's addresses (`ip -o monitor address` in the node's namespace,
   * the one child that runs without a deadline) until closed.
   */
  watchNodeAddresses(onEvent: (e: AddressEvent) => void): AddressWatch {
    const watch = startWatch(
      iprouteArgv(IP_BIN, ["-o", "monitor", "address"], this.#node),
      (line) => {
        const e = parseAddressEvent(line);
        if (e) onEvent(e);
      },
    );
    return {
      ended: watch.ended.then(
        ({ code, stderr }) =>
          `"ip monitor address" exited with code ${code}: ${stderr || "no output"}`,
        (err) => `"ip monitor address" failed: ${errText(err)}`,
      ),
      close: () => watch.close(),
    };
  }

  /**
   * Loads enim's nftables table on the node (`nft -f`, replacing the table; `legacy`:
   * the node ends of pods on the layout before issue 34, `nodeTableRuleset`) and sets
   * the node's `net.ipv4.conf.all.src_valid_mark` (see {@linkcode NODE_SYSCTL_SCRIPT}).
   */
  async ensureHostLinkTable(
    legacy: string[] = [],
    marks: { node: number; kubeProxyMasquerade: number } = DEFAULT_MARKS,
  ): Promise<void> {
    await Promise.all([
      this.#run(
        "host_link",
        "Cannot load enim's nftables table on the node",
        () =>
          nftApply(nodeTableRuleset(legacy, marks), {
            netns: this.#node,
            scratchDir: this.#scratch,
          }),
      ),
      // `sh` through `nsenter` (the agent runs `sh` only that way).
      this.#run(
        "host_link",
        "Cannot set the node's src_valid_mark",
        () =>
          spawn(
            inNetnsArgv(
              [SH_BIN, "-c", NODE_SYSCTL_SCRIPT, "enim-sysctl", IP_BIN],
              this.#node ?? "/proc/self/ns/net",
            ),
          ),
      ),
    ]);
  }

  /**
   * Reads a file as the node's namespace shows it, through `sh` there: `/proc/net/ip_vs`
   * (`agent/ipvs.ts`) is the node's namespace's, and Deno lets no process read under
   * /proc/net without every permission. Null when the file does not exist.
   */
  async readNodeFile(path: string): Promise<string | null> {
    if (!/^\/[^\0]*$/.test(path)) throw new TypeError(`Invalid path "${path}": not absolute`);
    try {
      const argv = [SH_BIN, "-c", READ_FILE_SCRIPT, "enim-read", path];
      return (await spawn(inNetnsArgv(argv, this.#node ?? "/proc/self/ns/net"))).stdout;
    } catch (err) {
      if (err instanceof IpError && err.code === READ_FILE_MISSING) return null;
      throw new DeviceError(
        "find",
        "failed",
        `Cannot read "${path}" in the node's namespace: ${errText(err)}`,
        { cause: err },
      );
    }
  }

  /** Loads an nftables ruleset in `netns` (a path), or on the node when it is null (`nft -j` JSON when it starts with `{`). */
  async loadRuleset(netns: string | null, text: string): Promise<void> {
    const where = netns === null ? "on the node" : `in netns "${netns}"`;
    if (netns !== null) await this.#requireNetns("nft", netns);
    await this.#run(
      "nft",
      `Cannot load an nftables ruleset ${where}`,
      () =>
        nftApply(text, {
          netns: netns ?? this.#node,
          scratchDir: this.#scratch,
          json: isNftJson(text),
        }),
    );
  }

  /**
   * Checks an nftables ruleset on the node without loading it (`nft -c`: the kernel
   * validates the transaction and never commits it); JSON as {@linkcode loadRuleset}.
   */
  async checkRuleset(text: string): Promise<void> {
    await this.#run(
      "nft",
      "The kernel refuses an nftables ruleset on the node",
      () =>
        nftApply(text, {
          netns: this.#node,
          scratchDir: this.#scratch,
          json: isNftJson(text),
          check: true,
        }),
    );
  }

  /** The named counters of `table` (`inet enim_policy`) in `netns` (null: the node), as JSON text. */
  async listCounters(netns: string | null, table: string): Promise<string> {
    if (!/^(inet|ip|ip6|bridge|netdev|arp) [A-Za-z0-9_]{1,64}$/.test(table)) {
      throw new TypeError(`Invalid nftables table "${table}"`);
    }
    const where = netns === null ? "on the node" : `in netns "${netns}"`;
    if (netns !== null) await this.#requireNetns("nft", netns);
    const { stdout } = await this.#run(
      "nft",
      `Cannot list the counters of table "${table}" ${where}`,
      () =>
        spawn(
          inNetnsArgv(
            [NFT_BIN, "-j", "list", "counters", "table", ...table.split(" ")],
            netns ?? this.#node,
          ),
        ),
    );
    return stdout;
  }

  /** `table` (`inet enim_policy`) in `netns` (null: the node), terse, as JSON text; null: none. */
  async listTable(netns: string | null, table: string): Promise<string | null> {
    if (!/^(inet|ip|ip6|bridge|netdev|arp) [A-Za-z0-9_]{1,64}$/.test(table)) {
      throw new TypeError(`Invalid nftables table "${table}"`);
    }
    const where = netns === null ? "on the node" : `in netns "${netns}"`;
    if (netns !== null) await this.#requireNetns("nft", netns);
    const argv = inNetnsArgv(
      [NFT_BIN, "-t", "-j", "list", "table", ...table.split(" ")],
      netns ?? this.#node,
    );
    let missing = false;
    const { stdout } = await this.#run("nft", `Cannot list table "${table}" ${where}`, async () => {
      try {
        return await spawn(argv);
      } catch (err) {
        // nft says ENOENT's words for a table that is not there.
        if (/No such file or directory/.test(errText(err))) {
          missing = true;
          return { stdout: "", stderr: "" };
        }
        throw err;
      }
    });
    return missing ? null : stdout;
  }

  /**
   * Deletes the tracked connections of `addresses` in `netns` (null: the node): one
   * shell in the namespace runs `conntrack -D` for each address as the original and the
   * reply direction's source and destination (a connection a Service's DNAT rewrote
   * names the pod in its reply direction only).
   */
  async flushConntrack(
    netns: string | null,
    addresses: string[],
    opts: { listedOnly?: boolean } = {},
  ): Promise<void> {
    const addrs = addresses.map((a) => {
      const ip = parseIp(a);
      if (!ip) throw new TypeError(`Invalid address "${a}"`);
      return { text: formatIp(ip), listed: expandedIp(ip) };
    });
    if (addrs.length === 0) return;
    const where = netns === null ? "on the node" : `in netns "${netns}"`;
    if (netns !== null) await this.#requireNetns("conntrack", netns);
    await this.#run(
      "conntrack",
      `Cannot delete the tracked connections of ${addrs.map((a) => a.text).join(", ")} ${where}`,
      () =>
        spawn(inNetnsArgv(
          [
            SH_BIN,
            "-c",
            CONNTRACK_FLUSH_SCRIPT,
            "sh",
            !opts.listedOnly ? "all" : netns === null ? "grep" : "listed",
            ...addrs.flatMap((a) => [a.text, a.listed]),
          ],
          netns ?? this.#node ?? "/proc/self/ns/net",
        )),
    );
  }

  /**
   * Deletes the node's host-link rules whose node end is gone (`[detached]`: a pod gone
   * without DEL, an agent killed before its removal): both families, at enim's
   * priorities. Returns how many went.
   */
  async sweepHostLinkRules(): Promise<number> {
    let removed = 0;
    for (const v6 of [false, true]) {
      const family = v6 ? 6 as const : undefined;
      const out = await this.#run(
        "find",
        "Cannot list the node's rules",
        () => this.#batch([["rule", "list"]], this.#node, true, false, family),
      );
      const stale = z.array(RuleEntrySchema).parse(out[0] ?? [])
        .filter((r) =>
          (Object.values(NODE_RULE_PREF) as number[]).includes(r.priority) &&
          r.iif !== undefined && "iif_detached" in r
        );
      if (stale.length === 0) continue;
      await this.#batch(
        stale.map((r) => ["rule", "del", "pref", String(r.priority), "iif", r.iif!]),
        this.#node,
        false,
        true,
        family,
      ).catch(() => {});
      removed += stale.length;
    }
    return removed;
  }

  /** The identity of an nsfs file at an absolute path; null when it is missing or no namespace file. */
  netnsIdentity(path: string): Promise<NetnsIdentity | null> {
    return netnsIdentity(path);
  }

  /** Proves and holds a pod's namespace for one operation (see `./pin.ts`). */
  pin(path: string): Promise<PinnedNetns> {
    return pinNetns(path);
  }

  /** A namespace argument: a pinned one as it is, a path checked first. */
  async #useNetns(step: string, netns: string | PinnedNetns): Promise<Ns> {
    if (typeof netns !== "string") return { ref: netns.ref, path: netns.path };
    await this.#requireNetns(step, netns);
    return { ref: netns, path: netns };
  }

  /** Like `#useNetns`, but null for a path that is no namespace (any more). */
  async #usableNetns(netns: string | PinnedNetns): Promise<Ns | null> {
    if (typeof netns !== "string") return { ref: netns.ref, path: netns.path };
    return (await this.netnsIdentity(netns)) ? { ref: netns, path: netns } : null;
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

  /** After a failed move: if the device went into the pod anyway, move it back. */
  async #recoverFailedMove(mac: string, netns: string, nodeName: string): Promise<void> {
    try {
      const links = await ipJson(z.array(LinkSchema), ["link", "show"], { netns });
      const stray = links.find((l) => l.address?.toLowerCase() === normalizeMac(mac));
      if (stray) await this.#bringBack(netns, stray.ifname, nodeName);
    } catch (err) {
      this.#log.error("Cannot bring back a device after a failed move", { mac, netns, err });
    }
  }

  /**
   * Down, flushed (its MAC restored when given), moved home and renamed, in one batch in
   * the pod, after the `before` lines (an ifb's removal).
   */
  async #bringBack(
    netns: string,
    ifName: string,
    nodeName: string,
    mac?: string,
    before: string[][] = [],
  ): Promise<void> {
    await this.#batch([
      ...before,
      ["link", "set", "dev", ifName, "down"],
      ...(mac ? [["link", "set", "dev", ifName, "address", mac]] : []),
      ["addr", "flush", "dev", ifName],
      ["link", "set", "dev", ifName, "netns", this.#home, "name", nodeName],
    ], netns);
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

/** The exit code of {@linkcode READ_FILE_SCRIPT} for a file that does not exist. */
const READ_FILE_MISSING = 66;
/** Prints the file `$1` (the shell's own reads: no other program), or exits 66 when it is missing. */
const READ_FILE_SCRIPT = `[ -e "$1" ] || exit ${READ_FILE_MISSING}\n` +
  `while IFS= read -r l || [ -n "$l" ]; do printf '%s\\n' "$l"; done < "$1"`;

/**
 * The node's addresses from a listing of its links (with addresses) and its default
 * routes: global scope only, node ends and `kube-ipvs0` (kube-proxy's IPVS mode binds
 * every ClusterIP there: Services, not the node; taken for the node's, each Service
 * change would render every pod's policy again) left out; the primary per family is the default
 * route's preferred source, else the first global address of its link, else the first
 * of any link.
 */
export function nodeAddressesOf(
  links: {
    ifname: string;
    group?: string;
    addr_info: { family: string; local: string; scope?: string }[];
  }[],
  defaults: { dst: string; gateway?: string; dev?: string; prefsrc?: string }[],
): NodeAddresses {
  const own = links.filter((l) => !isNodeEnd(l) && l.ifname !== KUBE_IPVS_LINK);
  const global = (l: (typeof own)[number], fam: "inet" | "inet6") =>
    l.addr_info.filter((a) => a.family === fam && a.scope === "global").map((a) => a.local);
  const addresses = own.flatMap((l) => [...global(l, "inet"), ...global(l, "inet6")]);
  const primary: NodeAddresses["primary"] = {};
  for (const [key, fam] of [["ipv4", "inet"], ["ipv6", "inet6"]] as const) {
    const v6 = fam === "inet6";
    const dflt = defaults.find((r) =>
      r.dst === "default" && (r.gateway ? r.gateway.includes(":") === v6 : !v6)
    );
    const viaDefault = dflt?.prefsrc ??
      (dflt?.dev ? own.find((l) => l.ifname === dflt.dev) : undefined)?.addr_info
        .find((a) => a.family === fam && a.scope === "global")?.local;
    const any = own.flatMap((l) => global(l, fam))[0];
    const chosen = viaDefault ?? any;
    if (chosen) primary[key] = chosen;
  }
  return { addresses, primary };
}

/** Whether a ruleset is `nft -j` JSON (nft's text never starts with `{`). */
function isNftJson(text: string): boolean {
  return text.trimStart().startsWith("{");
}
