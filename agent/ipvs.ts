/**
 * kube-proxy's IPVS mode, found and refused (issue 42 point 4). enim judges a Service's
 * traffic on the node in the `forward` hook, after kube-proxy's DNAT (`policy/nft.ts`);
 * IPVS takes a Service's packets in the node's input path and sends them out through its
 * output path, so they never cross `forward`: same-node Service and NodePort traffic
 * would skip the backend's ingress and the client's egress. So with NetworkPolicy on, the
 * agent looks for IPVS mode — the `kube-ipvs0` link kube-proxy binds every ClusterIP to,
 * and virtual services in `/proc/net/ip_vs` (the node's namespace: the file is per
 * network namespace; read through the device layer, as Deno reads nothing under /proc/net
 * without every permission) — at start, before any ADD, and every
 * `networkPolicy.ipvsCheckSeconds` (kube-proxy may switch modes when it restarts). While
 * it is found, or cannot be ruled out, every ADD under policy is refused with
 * `policy_unenforceable` (CNI code 111): never a pod with half its policy enforced. The
 * agent says why in its log at start and at each change, `enim status` shows it
 * (`ipvs`), and so does `enim_policy_ipvs_refusing`.
 *
 * @module
 */
import { ApiError, type IpvsStatus } from "../api/schema.ts";
import { type DeviceLayer, KUBE_IPVS_LINK } from "../netns/types.ts";
import type { PolicyHook } from "../manager/types.ts";
import type { Logger } from "../lib/log.ts";
import type { Metrics } from "../lib/metrics.ts";
import type { AgentConfig } from "./config.ts";
import { userMessage } from "../lib/message.ts";

/** Where the kernel lists IPVS's virtual services (present only with `ip_vs` loaded). */
export const IPVS_PROC_FILE = "/proc/net/ip_vs";

/**
 * How many virtual services `/proc/net/ip_vs` lists: its lines that start with a
 * protocol (`TCP`, `UDP`, `SCTP`) or a firewall mark (`FWM`); the header lines and the
 * real servers (`  -> …`) are not counted.
 *
 * @example
 * ```ts
 * ipvsServices("IP Virtual Server version 1.2.1 (size=4096)\n" +
 *   "Prot LocalAddress:Port Scheduler Flags\n" +
 *   "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n" +
 *   "TCP  0A600001:01BB rr\n  -> 0A630002:192B      Masq    1      0          0\n"); // 1
 * ```
 */
export function ipvsServices(text: string): number {
  return text.split("\n").filter((l) => /^(TCP|UDP|SCTP|FWM)\s+\S/.test(l)).length;
}

/** Options of {@linkcode IpvsWatch.start}. */
export interface IpvsWatchOptions {
  /** The node's links (`kube-ipvs0`), and the file as the node's namespace shows it. */
  devices: Pick<DeviceLayer, "nodeLinks" | "readNodeFile">;
  log: Logger;
  /** The file IPVS lists its services in (`networkPolicy.ipvsProcFile`). */
  procFile?: string;
  /** How often the node's links and the file are looked at again (`networkPolicy.ipvsCheckSeconds`). */
  intervalMs?: number;
}

/** What one look found. */
interface Reading {
  /** Whether `kube-ipvs0` is there; null: the links could not be listed (yet). */
  link: boolean | null;
  /** IPVS's virtual services; null: the file could not be read. */
  services: number | null;
  /** Why either is null. */
  error: string | null;
  /** When (ms since the epoch). */
  at: number;
}

/**
 * The watch for kube-proxy's IPVS mode: {@linkcode refusing} is true while it is found
 * or cannot be ruled out (fail closed).
 */
export class IpvsWatch {
  readonly #devices: Pick<DeviceLayer, "nodeLinks" | "readNodeFile">;
  readonly #log: Logger;
  readonly #procFile: string;
  readonly #intervalMs: number;
  #reading: Reading = { link: null, services: null, error: "not looked at yet", at: 0 };
  #timer: ReturnType<typeof setTimeout> | undefined;
  #running: Promise<void> | null = null;
  #closed = false;
  /** The last state logged (null: none yet). */
  #logged: boolean | null = null;
  #refused = 0;

  private constructor(o: IpvsWatchOptions) {
    this.#devices = o.devices;
    this.#log = o.log;
    this.#procFile = o.procFile ?? IPVS_PROC_FILE;
    this.#intervalMs = o.intervalMs ?? 5_000;
  }

  /** Looks once (the agent says what it found), then every `intervalMs` until {@linkcode close}. */
  static async start(o: IpvsWatchOptions): Promise<IpvsWatch> {
    const w = new IpvsWatch(o);
    await w.check();
    w.#schedule();
    return w;
  }

  /** Whether ADDs under policy are refused: IPVS found, or not ruled out. */
  get refusing(): boolean {
    const r = this.#reading;
    return r.link !== false || r.services !== 0;
  }

  /** What was found, in words (`link "kube-ipvs0", 12 IPVS services`). */
  reason(): string {
    const r = this.#reading;
    const found = [
      ...(r.link ? [`link "${KUBE_IPVS_LINK}"`] : []),
      ...(r.services
        ? [`${r.services} IPVS service${r.services === 1 ? "" : "s"} in ${this.#procFile}`]
        : []),
    ];
    if (found.length > 0) return found.join(", ");
    if (r.error) return `IPVS mode cannot be ruled out: ${r.error}`;
    return "none found";
  }

  /** Looks at the node's links and IPVS's services now (one look at a time). */
  check(): Promise<void> {
    this.#running ??= (async () => {
      try {
        let link: boolean | null = this.#reading.link;
        let error: string | null = null;
        try {
          link = (await this.#devices.nodeLinks()).some((l) => l.ifname === KUBE_IPVS_LINK);
        } catch (err) {
          // The last answer stands (none at the first look: not ruled out).
          error = `cannot list the node's links: ${userMessage(err)}`;
        }
        const services = await this.#services();
        this.#reading = {
          link,
          services: services.count,
          error: error ?? services.error,
          at: Date.now(),
        };
        if (error && link !== null) {
          this.#log.warn("Cannot look for kube-proxy's IPVS mode; the last look stands", { error });
        }
        this.#report();
      } finally {
        this.#running = null;
      }
    })();
    return this.#running;
  }

  /** The ADD's error while {@linkcode refusing}. */
  refusal(pod: string): ApiError {
    this.#refused++;
    return new ApiError(
      "policy_unenforceable",
      `NetworkPolicy cannot be enforced on this node: kube-proxy runs in IPVS mode (${this.reason()}), whose Service traffic bypasses enim's node-side rules; the pod "${pod}" is not started rather than started with half its policy (run kube-proxy in iptables or nftables mode, or set networkPolicy.enabled to false)`,
    );
  }

  /** What `enim status` shows (bound: it can be handed on as it is). */
  readonly status = (): IpvsStatus => {
    const r = this.#reading;
    return {
      refusing: this.refusing,
      link: r.link,
      services: r.services,
      reason: this.reason(),
      checkedAt: r.at === 0 ? null : new Date(r.at).toISOString(),
      refusedAdds: this.#refused,
    };
  };

  /** Stops looking. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    await this.#running?.catch(() => {});
  }

  #schedule(): void {
    if (this.#closed) return;
    this.#timer = setTimeout(() => {
      this.check().catch(() => {}).finally(() => this.#schedule());
    }, this.#intervalMs);
    // The look never keeps the process alive by itself.
    Deno.unrefTimer(this.#timer);
  }

  async #services(): Promise<{ count: number | null; error: string | null }> {
    try {
      const text = this.#devices.readNodeFile
        ? await this.#devices.readNodeFile(this.#procFile)
        : await Deno.readTextFile(this.#procFile).catch((err) => {
          if (err instanceof Deno.errors.NotFound) return null;
          throw err;
        });
      // No file: the kernel has no IPVS here (the module is not loaded).
      return { count: text === null ? 0 : ipvsServices(text), error: null };
    } catch (err) {
      return { count: null, error: `cannot read ${this.#procFile}: ${userMessage(err)}` };
    }
  }

  /** Logs the state when it is new: at the first look, then at each change. */
  #report(): void {
    const now = this.refusing;
    if (this.#logged === now) return;
    const first = this.#logged === null;
    this.#logged = now;
    if (now) {
      this.#log.error(
        "NetworkPolicy cannot be enforced on this node: kube-proxy's IPVS mode takes a Service's traffic in the node's input and output paths, where enim's node-side rules do not look; new pods' ADDs are refused with CNI code 111 until it is gone (kube-proxy in iptables or nftables mode, or networkPolicy.enabled false). Pods already running keep their rules on the ENI path; their Service traffic is not judged",
        { found: this.reason(), link: KUBE_IPVS_LINK, procFile: this.#procFile },
      );
    } else if (!first) {
      this.#log.info("kube-proxy's IPVS mode is gone from this node; ADDs are served again", {
        procFile: this.#procFile,
      });
    } else {
      this.#log.info("kube-proxy's IPVS mode not found (NetworkPolicy is enforceable here)", {
        link: KUBE_IPVS_LINK,
        procFile: this.#procFile,
      });
    }
  }
}

/**
 * The enforcer as the manager sees it, refusing every ADD while `ipvs` is
 * {@linkcode IpvsWatch.refusing}; everything else goes to the enforcer as it is.
 */
export function refusingUnderIpvs(hook: PolicyHook, ipvs: IpvsWatch): PolicyHook {
  return {
    prepare(p) {
      if (ipvs.refusing) return Promise.reject(ipvs.refusal(p.pod));
      return hook.prepare(p);
    },
    whenSynced: () => hook.whenSynced(),
    committed: (key, netns) => hook.committed(key, netns),
    removed: (key) => hook.removed(key),
    restore: (pods) => hook.restore(pods),
    reuseWait: (addresses, signal) => hook.reuseWait(addresses, signal),
  };
}

/**
 * The agent's watch while NetworkPolicy is on (`networkPolicy.ipvsProcFile`,
 * `networkPolicy.ipvsCheckSeconds`), its first look done and `enim_policy_ipvs_refusing`
 * reading it, its close among the agent's `closers`: where the node-side rules cannot see a
 * Service's traffic, no pod is started under policy.
 */
export async function startIpvsWatch(
  cfg: Pick<AgentConfig, "networkPolicy">,
  o: {
    devices: Pick<DeviceLayer, "nodeLinks" | "readNodeFile">;
    metrics: Pick<Metrics, "setIpvsSource">;
    log: Logger;
    closers: (() => Promise<void> | void)[];
  },
): Promise<IpvsWatch> {
  const w = await IpvsWatch.start({
    devices: o.devices,
    log: o.log.child({ component: "policy" }),
    procFile: cfg.networkPolicy.ipvsProcFile,
    intervalMs: cfg.networkPolicy.ipvsCheckSeconds * 1000,
  });
  o.closers.push(() => w.close());
  o.metrics.setIpvsSource(() => w.refusing);
  return w;
}
