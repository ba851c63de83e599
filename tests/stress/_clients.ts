/**
 * The stress clients: each loops over random operations on random pods (one
 * operation per pod at a time, as a runtime serializes a sandbox's calls), half
 * of them through the real plugin process (some SIGKILLed mid-call), half
 * through the agent's API. Every answer updates the clients' {@linkcode Model};
 * an answer outside what the situation allows is a violation.
 *
 * @module
 */
import { z } from "zod";
import { type AddResponse, ApiError, GcReportSchema } from "../../api/schema.ts";
import { AgentUnreachableError } from "../../api/client.ts";
import { toCniError } from "../../cni/errors.ts";
import { prng } from "../support/agent_proc.ts";
import type { StressContext } from "./_context.ts";
import type { KeyRecord, PodRecord, StaleGcWindow } from "./_model.ts";
import { DEFAULT_OP_WEIGHTS, type OpName } from "./_options.ts";
import { CniErrorSchema, runPlugin } from "./_plugin.ts";

/** The network name every call uses. */
export const NETWORK = "enim-stress";
/** The Kubernetes namespace of every pod. */
export const K8S_NAMESPACE = "stress";

/** How a client reaches the agent. */
export type Via = "plugin" | "api";

/** A normalized answer: a CNI code (0 = success; 11 also for an unreachable or busy agent). */
export interface Answer {
  code: number | "killed" | "crash" | "hang";
  /** The result (ADD) when code is 0. */
  json?: unknown;
  msg?: string;
}

/** The parts of a plugin ADD result the checks use. */
const PluginAddResultSchema = z.looseObject({
  cniVersion: z.string(),
  interfaces: z.array(
    z.looseObject({ name: z.string(), mac: z.string(), sandbox: z.string().optional() }),
  )
    .min(1),
  ips: z.array(z.looseObject({
    address: z.string(),
    gateway: z.string().optional(),
    interface: z.number().int().optional(),
  })),
  routes: z.array(z.looseObject({ dst: z.string(), gw: z.string().optional() })).default([]),
});

/** One client. */
export interface Client {
  index: number;
  via: Via;
  rand: () => number;
}

/** The outcome label counted in the figures. */
function label(a: Answer): string {
  return typeof a.code === "number" ? (a.code === 0 ? "ok" : `code ${a.code}`) : a.code;
}

const pick = <T>(rand: () => number, xs: T[]): T => xs[Math.floor(rand() * xs.length)];

function podArgs(pod: PodRecord, containerId: string): string {
  return `K8S_POD_NAMESPACE=${K8S_NAMESPACE};K8S_POD_NAME=${pod.name};K8S_POD_INFRA_CONTAINER_ID=${containerId}`;
}

function netconf(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { cniVersion: "1.1.0", name: NETWORK, type: "enim", ...extra };
}

/**
 * Whether to kill this plugin call, and when: the remaining budget spread over the
 * remaining agent kills, corrected for the kills that land after the plugin exited,
 * at a moment inside the typical plugin call (before it connects, while the agent
 * works, as it answers).
 */
function pluginKillDelay(ctx: StressContext, rand: () => number): number | undefined {
  const f = ctx.figures;
  const left = ctx.opts.pluginKills - f.pluginKills;
  if (left <= 0) return undefined;
  const roundsLeft = Math.max(1, (ctx.opts.kills - f.killsTotal) / 1.3);
  const perRound = f.rounds > 0 ? f.pluginCalls / f.rounds : 6;
  const landed = f.pluginKillAttempts > 5
    ? Math.max(0.2, f.pluginKills / f.pluginKillAttempts)
    : 0.6;
  const p = Math.min(0.6, left / Math.max(1, roundsLeft * perRound * landed));
  if (rand() >= p) return undefined;
  f.pluginKillAttempts++;
  const ms = f.pluginMs.slice(-200).sort((a, b) => a - b);
  const typical = ms.length >= 10 ? ms[Math.floor(ms.length / 2)] : 80;
  return Math.floor(3 + rand() * typical);
}

/** Runs a plugin call and normalizes its answer. */
async function viaPlugin(
  ctx: StressContext,
  rand: () => number,
  verb: string,
  call: Parameters<typeof runPlugin>[2],
): Promise<Answer> {
  const killAfterMs = pluginKillDelay(ctx, rand);
  ctx.figures.pluginCalls++;
  const r = await runPlugin(ctx.node, verb, call, { killAfterMs });
  if (!r.killed && !r.timedOut) {
    ctx.figures.pluginMs.push(r.ms);
    if (ctx.figures.pluginMs.length > 1000) ctx.figures.pluginMs.splice(0, 500);
  }
  if (r.killed) {
    ctx.figures.pluginKills++;
    return { code: "killed" };
  }
  if (r.timedOut) {
    return { code: "hang", msg: `no answer in 60 s; stderr: ${r.stderr.slice(-300)}` };
  }
  if (r.signal) {
    return { code: "crash", msg: `signal ${r.signal}; stderr: ${r.stderr.slice(-300)}` };
  }
  if (r.code === 0) {
    try {
      return { code: 0, json: r.stdout.trim() ? JSON.parse(r.stdout) : null };
    } catch {
      return {
        code: "crash",
        msg: `exit 0 with stdout that is not JSON: ${r.stdout.slice(0, 300)}`,
      };
    }
  }
  if (r.code === 1) {
    try {
      const e = CniErrorSchema.parse(JSON.parse(r.stdout));
      return { code: e.code, msg: e.msg + (e.details ? ` (${e.details.slice(0, 300)})` : "") };
    } catch {
      return { code: "crash", msg: `exit 1 without a CNI error object: ${r.stdout.slice(0, 300)}` };
    }
  }
  return {
    code: "crash",
    msg: `exit ${r.code}; stdout ${r.stdout.slice(0, 200)}; stderr ${r.stderr.slice(-300)}`,
  };
}

/** Runs an API call and normalizes its answer. */
async function viaApi(fn: () => Promise<unknown>): Promise<Answer> {
  try {
    return { code: 0, json: await fn() };
  } catch (err) {
    // The code a plugin would answer for it (the mapping is cni/errors.ts's, tested there).
    if (err instanceof ApiError || err instanceof AgentUnreachableError) {
      const msg = err instanceof ApiError ? `${err.code}: ${err.message}` : err.message;
      return { code: toCniError(err, "1.1.0").code, msg };
    }
    return { code: "crash", msg: err instanceof Error ? err.message : String(err) };
  }
}

/** Turns an ADD answer into what the pod must now hold. */
export function addedFrom(a: Answer, via: Via, pod: PodRecord, ifName: string): KeyRecord["added"] {
  if (via === "plugin") {
    const r = PluginAddResultSchema.parse(a.json);
    // The host link's two ends follow the ENI's interface: the node end, then the pod end.
    const [nodeEnd, podEnd] = [r.interfaces[1], r.interfaces[2]];
    return {
      mac: r.interfaces[0].mac.toLowerCase(),
      ips: r.ips.map((i) => i.address),
      routes: r.ips.filter((i) => i.gateway).map((i) => `default via ${i.gateway}`),
      prevResult: r as Record<string, unknown>,
      ...(nodeEnd && podEnd
        ? {
          hostLink: {
            nodeIfName: nodeEnd.name,
            podIfName: podEnd.name,
            podMac: podEnd.mac.toLowerCase(),
          },
        }
        : {}),
    };
  }
  const r = a.json as AddResponse;
  return {
    mac: r.mac.toLowerCase(),
    ips: r.ips.map((i) => i.address),
    routes: r.ips.map((i) => `default via ${i.gateway}`),
    ...(r.hostLink
      ? {
        hostLink: {
          nodeIfName: r.hostLink.nodeIfName,
          podIfName: r.hostLink.podIfName,
          podMac: r.hostLink.podMac.toLowerCase(),
        },
      }
      : {}),
    prevResult: {
      cniVersion: "1.1.0",
      interfaces: [{ name: ifName, mac: r.mac, sandbox: pod.path }],
      ips: r.ips.map((i) => ({ address: i.address, gateway: i.gateway, interface: 0 })),
      routes: r.routes,
    },
  };
}

/** The operations of the stress run, over one {@linkcode StressContext}. */
export class Operations {
  readonly #gate = new GcGate();
  readonly ctx: StressContext;

  constructor(ctx: StressContext) {
    this.ctx = ctx;
  }

  /** Creates (or re-creates) the pod's namespace: a new generation and a new container. */
  async createPod(pod: PodRecord, freshPath = this.ctx.opts.freshPaths): Promise<void> {
    if (freshPath) {
      // A new sandbox, a new path (as containerd's cni-<uuid>): a stale path names nothing.
      pod.short = `p${pod.index}g${pod.gen + 1}`;
      pod.nsName = `${this.ctx.prefix}-${pod.short}`;
      pod.path = `/run/netns/${pod.nsName}`;
    }
    const h = await this.ctx.node.vpc.pod(pod.short);
    pod.gen++;
    pod.ctr++;
    pod.exists = true;
    pod.racedInto = false;
    pod.ino = (await Deno.stat(h.path)).ino;
  }

  /** Deletes the pod's namespace (whatever is in it dies with it, as a veth does). */
  async deletePod(pod: PodRecord, why: string): Promise<void> {
    if (!pod.exists) return;
    this.ctx.model.podNamespaceGone(pod, why);
    await this.ctx.node.vpc.deletePod({ name: pod.nsName, path: pod.path });
    pod.exists = false;
    pod.ino = null;
  }

  /**
   * A new sandbox for the pod while the old one's namespace stays (a kubelet recreating a
   * sandbox): a new namespace at a new path and the pod's next container ADDed there; the
   * old attachments enter recycling.
   */
  async newSandbox(c: Client, pod: PodRecord): Promise<void> {
    if (!pod.exists) {
      await this.add(c, pod);
      return;
    }
    pod.old.push({ nsName: pod.nsName, path: pod.path, gen: pod.gen });
    this.ctx.model.generationGone(pod, pod.gen, "a newer sandbox of its pod was started");
    await this.createPod(pod, true);
    await this.add(c, pod);
  }

  /** Deletes an older sandbox's namespace. */
  async deleteOldSandbox(pod: PodRecord, gen: number, why: string): Promise<void> {
    const i = pod.old.findIndex((o) => o.gen === gen);
    if (i < 0) return;
    const [o] = pod.old.splice(i, 1);
    this.ctx.model.generationGone(pod, o.gen, why);
    await this.ctx.node.vpc.deletePod({ name: o.nsName, path: o.path });
  }

  /** Replaces the pod's namespace: deleted and created again at the same path. */
  async replacePod(pod: PodRecord, why = "netns replaced"): Promise<void> {
    await this.deletePod(pod, why);
    await this.createPod(pod);
  }

  /** ADD of the pod's current container (a retry when it is ADDed already). */
  async add(c: Client, pod: PodRecord, race = false): Promise<void> {
    const { ctx } = this;
    const m = ctx.model;
    if (!pod.exists) await this.createPod(pod);
    let k = m.key(pod, m.containerId(pod));
    if (k.status === "deleted") {
      // Its DEL came: the pod's next container.
      pod.ctr++;
      k = m.key(pod, m.containerId(pod));
    }
    const prev = k.status;
    const wasIntact = m.mustBeIntact(k);
    if (prev !== "added") {
      k.netnsGen = pod.gen;
      k.netns = pod.path;
    }
    // The first ADD since the key held nothing: its attachment is made after this.
    k.addSince ??= Date.now();
    k.status = "pending";
    const verb = `ADD/${c.via}`;
    m.note(
      k,
      `${race ? "racing " : ""}ADD via ${c.via} into ${pod.path} (generation ${pod.gen})${
        prev === "added" ? " (retry)" : ""
      }`,
    );
    let racer: Promise<void> | undefined;
    if (race) {
      k.reclaimable = "its namespace was replaced while its ADD ran";
      const delay = Math.floor(c.rand() * 90);
      racer = new Promise<void>((r) => setTimeout(r, delay)).then(() =>
        this.replacePod(pod, "netns replaced during an ADD")
      );
    }
    const answer = c.via === "plugin"
      ? await viaPlugin(ctx, c.rand, "ADD", {
        containerId: k.containerId,
        ifName: k.ifName,
        netns: pod.path,
        args: podArgs(pod, k.containerId),
        config: netconf(),
      })
      : await viaApi(() =>
        ctx.node.client.add({
          containerId: k.containerId,
          ifName: k.ifName,
          netns: pod.path,
          network: NETWORK,
          pod: { namespace: K8S_NAMESPACE, name: pod.name },
          mode: "interface",
        })
      );
    await racer;
    ctx.count(verb, label(answer));
    m.note(k, `→ ${label(answer)}${answer.msg ? `: ${answer.msg.slice(0, 200)}` : ""}`);
    const keep = prev === "added" ? "added" : "unknown";
    if (answer.code === 0) {
      let added: KeyRecord["added"];
      try {
        added = addedFrom(answer, c.via, pod, k.ifName);
      } catch (err) {
        ctx.violation(
          "unexpected_answer",
          `${k.containerId}/${k.ifName}`,
          `ADD answered a result that does not parse: ${err}`,
          {
            answer: answer.json,
          },
        );
        k.status = keep;
        return;
      }
      if (prev === "added" && wasIntact && k.added && k.added.mac !== added!.mac) {
        ctx.violation(
          "retry_add_changed",
          `${k.containerId}/${k.ifName}`,
          `A retried ADD of "${k.containerId}/${k.ifName}" answered MAC ${
            added!.mac
          }, the first ADD ${k.added.mac}`,
          { history: k.history.map((e) => `r${e.round} +${e.t}ms ${e.what}`) },
        );
      }
      k.status = "added";
      k.added = added;
      // Left out of a CNI GC, then ADDed again: the new attachment must be intact.
      if (!race && k.reclaimable?.startsWith("left out of a CNI GC")) k.reclaimable = null;
      m.note(k, `ADD acknowledged: ${added!.mac} [${added!.ips.join(" ")}]`);
    } else if (answer.code === 100) {
      k.status = prev === "added" ? "added" : "refused";
      if (k.status === "refused") m.released(k);
    } else {
      k.status = keep;
      const allowed = race
        ? [11, 102, 103, 105, "killed"]
        : pod.racedInto
        ? [11, 102, "killed"]
        : [11, "killed"];
      if (!allowed.includes(answer.code)) {
        ctx.violation(
          "unexpected_answer",
          `${k.containerId}/${k.ifName}`,
          `${verb} answered ${label(answer)}: ${answer.msg ?? ""}`,
          {
            history: k.history.map((e) => `r${e.round} +${e.t}ms ${e.what}`),
          },
        );
      }
    }
    if (race) {
      pod.ctr++; // the namespace is new: the pod's next ADD is a new container
      // Answered, or cut off (the agent or the plugin killed): it may have completed.
      if (answer.code === 0 || answer.code === 11 || answer.code === "killed") {
        pod.racedInto = true;
      }
    }
  }

  /** DEL of the pod's current container, or of an older one still held. */
  async del(c: Client, pod: PodRecord): Promise<void> {
    const { ctx } = this;
    const m = ctx.model;
    const held = m.keysOfPod(pod).filter((k) => k.status === "added" || k.status === "unknown");
    const current = m.key(pod, m.containerId(pod));
    const k = held.length && c.rand() < 0.8 ? pick(c.rand, held) : current;
    const livePath = m.liveNetns(k);
    const live = livePath !== null;
    // A runtime passes the sandbox's path; for a gone sandbox, sometimes nothing.
    const netns = livePath ?? (c.rand() < 0.5 ? "" : k.netns);
    const prev = k.status;
    k.status = "pending";
    const epoch = ctx.agentEpoch;
    const verb = `DEL/${c.via}`;
    m.note(
      k,
      `DEL via ${c.via} with CNI_NETNS="${netns}"${live ? "" : " (its namespace is gone)"}`,
    );
    const answer = c.via === "plugin"
      ? await viaPlugin(ctx, c.rand, "DEL", {
        containerId: k.containerId,
        ifName: k.ifName,
        netns,
        args: podArgs(pod, k.containerId),
        config: netconf(),
      })
      : await viaApi(() =>
        ctx.node.client.del({
          containerId: k.containerId,
          ifName: k.ifName,
          netns,
          network: NETWORK,
        })
      );
    ctx.count(verb, label(answer));
    m.note(k, `→ ${label(answer)}${answer.msg ? `: ${answer.msg.slice(0, 200)}` : ""}`);
    if (answer.code === 0) {
      k.status = "deleted";
      m.released(k);
      // The plugin answers a DEL alone when the agent is down and the namespace gone
      // (docs/runtimes.md, "Errors"): nothing is undone then, and the agent's GC reclaims the ENI.
      k.delDeferred = c.via === "plugin" && !live && ctx.agentEpoch !== epoch;
      // Otherwise the agent may still be bringing the device home, as after any answer.
      k.finishing = !k.delDeferred && ctx.agentEpoch === epoch;
      if (k.delDeferred) {
        ctx.figures.delDeferred++;
        m.note(k, "DEL acknowledged by the plugin alone (the agent was killed meanwhile)");
      }
      if (k.containerId === m.containerId(pod)) pod.ctr++;
      // An older sandbox, stopped: its namespace goes after its DEL (mostly).
      const old = pod.old.find((o) => o.gen === k.netnsGen);
      if (old && c.rand() < 0.7) {
        await this.deleteOldSandbox(pod, old.gen, "its sandbox was removed after DEL");
      }
      return;
    }
    k.status = prev === "deleted" || prev === "refused" ? prev : "unknown";
    if (answer.code !== 11 && answer.code !== "killed") {
      ctx.violation(
        "unexpected_answer",
        `${k.containerId}/${k.ifName}`,
        `${verb} answered ${label(answer)}: ${answer.msg ?? ""}`,
        {
          history: k.history.map((e) => `r${e.round} +${e.t}ms ${e.what}`),
        },
      );
    }
  }

  /** CHECK of an intact attachment of the pod (nothing when it has none). */
  async check(c: Client, pod: PodRecord): Promise<boolean> {
    const { ctx } = this;
    const m = ctx.model;
    const k = m.keysOfPod(pod).find((x) => m.mustBeIntact(x));
    if (!k || !k.added) return false;
    const verb = `CHECK/${c.via}`;
    m.note(k, `CHECK via ${c.via}`);
    const answer = c.via === "plugin"
      ? await viaPlugin(ctx, c.rand, "CHECK", {
        containerId: k.containerId,
        ifName: k.ifName,
        netns: pod.path,
        args: podArgs(pod, k.containerId),
        config: netconf({ prevResult: k.added.prevResult }),
      })
      : await viaApi(() =>
        ctx.node.client.check({
          containerId: k.containerId,
          ifName: k.ifName,
          netns: pod.path,
          network: NETWORK,
          mode: "interface",
          expected: { mac: k.added!.mac, addresses: k.added!.ips, routes: [] },
        })
      );
    ctx.count(verb, label(answer));
    m.note(k, `→ ${label(answer)}${answer.msg ? `: ${answer.msg.slice(0, 200)}` : ""}`);
    if (answer.code === 0 || answer.code === 11 || answer.code === "killed") return true;
    const intact = m.mustBeIntact(k);
    const cls = answer.code === 106 && intact
      ? "check_failed_intact"
      : answer.code === 106
      ? null
      : "unexpected_answer";
    if (cls) {
      ctx.violation(
        cls,
        `${k.containerId}/${k.ifName}`,
        `${verb} answered ${label(answer)}: ${answer.msg ?? ""}`,
        {
          history: k.history.map((e) => `r${e.round} +${e.t}ms ${e.what}`),
        },
      );
    }
    return true;
  }

  /**
   * The CNI GC verb: every key the clients used is valid, except sometimes one left out.
   * `stale` (the `--stale-gc` schedule, sent beside ADDs and DELs): the list is taken,
   * then sent a while later with no look-ahead, so it misses what ADDs made meanwhile,
   * as a runtime that breaks the spec's exclusivity rule (or a second tool) would send.
   */
  async cniGc(c: Client, stale = false): Promise<void> {
    const { ctx } = this;
    const m = ctx.model;
    let dropped: KeyRecord | undefined;
    let droppedPod: PodRecord | undefined;
    if (c.rand() < 0.4) {
      const candidates = [...m.keys.values()].filter((k) =>
        m.mustBeIntact(k) && !m.pods[k.pod].busy
      );
      if (candidates.length) {
        dropped = pick(c.rand, candidates);
        droppedPod = m.pods[dropped.pod];
        droppedPod.busy = true;
        dropped.reclaimable = "left out of a CNI GC's valid attachments";
        m.note(dropped, `left out of a CNI GC via ${c.via}`);
      }
    }
    try {
      // Every key a runtime would still know (not DELeted, not refused), and the next
      // containers of every pod (an ADD may start while the GC runs).
      const ids = new Set(
        [...m.keys.values()].filter((k) =>
          k !== dropped && k.status !== "deleted" && k.status !== "refused"
        )
          .map((k) => k.containerId),
      );
      if (!stale) {
        for (const p of m.pods) {
          for (let i = 0; i <= 3; i++) ids.add(`${m.runId}-p${p.index}-c${p.ctr + i}`);
        }
      }
      if (dropped) ids.delete(dropped.containerId);
      const valid = [...ids].map((id) => ({ containerID: id, ifname: "eth0" }));
      // The acknowledged ADDs its list misses that must stay intact (young, or listed
      // nowhere else as reclaimable): looked for again right after it answered.
      const listed = new Set(valid.map((v) => `${v.containerID}/${v.ifname}`));
      const intactBefore = [...m.keys.values()].filter((k) =>
        !listed.has(`${k.containerId}/${k.ifName}`)
      );
      let window: StaleGcWindow | undefined;
      if (stale) {
        // Old by the time it is sent: ADDs go on meanwhile (up to about a plugin call or two).
        const ms = ctx.figures.pluginMs.slice(-100).sort((a, b) => a - b);
        const typical = ms.length >= 10 ? ms[Math.floor(ms.length / 2)] : 80;
        await new Promise((r) => setTimeout(r, Math.floor(c.rand() * 2 * typical)));
        window = m.staleGcSent(listed);
      }
      const epoch = ctx.agentEpoch;
      const verb = `CNI-GC${stale ? "-stale" : ""}/${c.via}`;
      const answer = c.via === "plugin"
        ? await viaPlugin(ctx, c.rand, "GC", {
          config: netconf({ "cni.dev/valid-attachments": valid }),
        })
        : await viaApi(() =>
          ctx.node.client.gc({
            network: NETWORK,
            validAttachments: valid.map((v) => ({ containerId: v.containerID, ifName: v.ifname })),
          }).then((r) => {
            const failed = r.items.filter((i) => i.outcome === "failed");
            if (failed.length) {
              throw new ApiError("internal", `GC_INCOMPLETE ${JSON.stringify(failed)}`);
            }
            return r;
          })
        );
      // Its pass is over when it answered; cut off with the agent alive, at the next kill.
      if (window && (answer.code !== "killed" || ctx.agentEpoch !== epoch)) {
        m.staleGcEnded(window);
      }
      if (dropped) m.note(dropped, `→ CNI GC ${label(answer)}`);
      if (answer.code === 0) await this.#afterGc(intactBefore);
      if (answer.code === 110 && answer.msg?.includes("GC_INCOMPLETE")) {
        ctx.count(verb, "code 107");
        ctx.anomaly("gc_reclaim_failed", answer.msg.slice(0, 400));
        return;
      }
      ctx.count(verb, label(answer));
      if (answer.code === 107) ctx.anomaly("gc_reclaim_failed", answer.msg ?? "");
      else if (answer.code !== 0 && answer.code !== 11 && answer.code !== "killed") {
        ctx.violation(
          "unexpected_answer",
          "CNI GC",
          `${verb} answered ${label(answer)}: ${answer.msg ?? ""}`,
          {},
        );
      }
    } finally {
      if (droppedPod) droppedPod.busy = false;
    }
  }

  /**
   * Right after a CNI GC answered: every acknowledged ADD its list did not name that must
   * still be intact, before and after reading the agent's attachments, is still recorded
   * (a runtime's CHECK would see it gone at once; the next invariant check may come only
   * after a DEL or a replacement made the loss invisible). Keys listed are skipped (no list
   * takes them), and keys whose status changed during the read.
   */
  async #afterGc(candidates: KeyRecord[]): Promise<void> {
    const { ctx } = this;
    const m = ctx.model;
    const before = candidates.filter((k) => m.mustBeIntact(k)).map((k) => ({
      k,
      added: k.added,
    }));
    if (before.length === 0) return;
    let recorded: Set<string>;
    try {
      recorded = new Set(
        (await ctx.node.client.attachments()).map((a) => `${a.containerId}/${a.ifName}`),
      );
    } catch {
      return; // the agent is down: the invariant check after its restart looks instead
    }
    for (const { k, added } of before) {
      const id = `${k.containerId}/${k.ifName}`;
      if (recorded.has(id) || !m.mustBeIntact(k) || k.added !== added) continue;
      m.note(k, "gone right after a CNI GC that did not list it");
      ctx.violation(
        "ack_add_lost",
        id,
        `ADD of "${id}" was acknowledged (ENI MAC ${k.added?.mac}) but a CNI GC that did not ` +
          `list it took its attachment (GC grace ${m.graceMs} ms, ${
            k.addSince === null ? "no ADD time" : `first ADD ${Date.now() - k.addSince} ms ago`
          })`,
        { history: k.history.map((e) => `r${e.round} +${e.t}ms ${e.what}`) },
      );
    }
  }

  /** A GC pass: `enim gc` (plugin-side clients, the operator command) or `POST /v1/gc`. */
  async gc(c: Client): Promise<void> {
    const { ctx } = this;
    const verb = c.via === "plugin" ? "GC/enim-gc" : "GC/api";
    let answer: Answer;
    if (c.via === "plugin") {
      const r = await ctx.node.enim(["gc", "--json"]);
      if (r.code === 0 || r.stdout.trim().startsWith("{")) {
        try {
          const report = GcReportSchema.parse(JSON.parse(r.stdout));
          const failed = report.items.filter((i) => i.outcome === "failed");
          answer = failed.length
            ? { code: 107, msg: JSON.stringify(failed).slice(0, 400) }
            : { code: 0 };
        } catch {
          answer = { code: "crash", msg: `enim gc printed: ${r.stdout.slice(0, 300)}` };
        }
      } else {
        answer = /reach|connect|refused|No such file/i.test(r.stderr)
          ? { code: 11, msg: r.stderr.trim().slice(0, 200) }
          : { code: "crash", msg: `exit ${r.code}: ${r.stderr.slice(-300)}` };
      }
    } else {
      answer = await viaApi(() => ctx.node.client.gc({ dryRun: false }));
      if (answer.code === 0) {
        const failed = GcReportSchema.parse(answer.json).items.filter((i) =>
          i.outcome === "failed"
        );
        if (failed.length) answer = { code: 107, msg: JSON.stringify(failed).slice(0, 400) };
      }
    }
    ctx.count(verb, label(answer));
    if (answer.code === 107) ctx.anomaly("gc_reclaim_failed", answer.msg ?? "");
    else if (answer.code !== 0 && answer.code !== 11) {
      ctx.violation(
        "unexpected_answer",
        "GC",
        `${verb} answered ${label(answer)}: ${answer.msg ?? ""}`,
        {},
      );
    }
  }

  /** One random operation (returns false when there was nothing to do). */
  async one(c: Client, op: OpName): Promise<boolean> {
    const { ctx } = this;
    if (op === "cni_gc") {
      // The stale schedule sends it beside ADDs and DELs (one GC at a time still).
      if (ctx.opts.staleGc) {
        await this.#gate.gcBeside(() => this.cniGc(c, true));
      } else await this.#gate.gc(() => this.cniGc(c));
      return true;
    }
    if (op === "gc") {
      await this.gc(c);
      return true;
    }
    const free = ctx.model.pods.filter((p) => !p.busy);
    const wanted = op === "replace" || op === "check"
      ? free.filter((p) => p.exists)
      : op === "delete_pod"
      ? free.filter((p) => p.exists || p.old.length)
      : free;
    if (wanted.length === 0) return false;
    const pod = pick(c.rand, wanted);
    pod.busy = true;
    try {
      if (op === "add" || op === "add_race" || op === "del" || op === "new_sandbox") {
        return await this.#gate.op(() => this.#podOp(c, op, pod));
      }
      return await this.#podOp(c, op, pod);
    } finally {
      pod.busy = false;
    }
  }

  /** One operation on `pod` (held busy by the caller). */
  async #podOp(c: Client, op: OpName, pod: PodRecord): Promise<boolean> {
    const { ctx } = this;
    switch (op) {
      case "add":
        await this.add(c, pod);
        return true;
      case "add_race":
        if (pod.exists) await this.replacePod(pod, "netns replaced before a racing ADD");
        else await this.createPod(pod);
        await this.add(c, pod, true);
        return true;
      case "del":
        await this.del(c, pod);
        return true;
      case "check":
        return await this.check(c, pod);
      case "replace":
        await this.replacePod(pod);
        ctx.count("REPLACE-POD", "ok");
        return true;
      case "delete_pod":
        if (pod.old.length && c.rand() < 0.5) {
          await this.deleteOldSandbox(
            pod,
            pick(c.rand, pod.old).gen,
            "an older sandbox's netns deleted without DEL",
          );
          ctx.count("DELETE-OLD-SANDBOX", "ok");
        } else {
          await this.deletePod(pod, "netns deleted without DEL");
          ctx.count("DELETE-POD", "ok");
        }
        return true;
      case "new_sandbox":
        await this.newSandbox(c, pod);
        return true;
    }
    return false;
  }
}

/**
 * The spec's rule for runtimes (SPEC.md, "GC"): GC runs exclusively of ADD and DEL;
 * none in progress when it starts, none issued until it ends. A GC whose plugin
 * process is killed ends for the runtime then, while the agent may still be at it.
 */
class GcGate {
  #ops = 0;
  #gc: Promise<void> | null = null;
  #beside: Promise<void> = Promise.resolve();
  #idle: (() => void)[] = [];

  async op<T>(fn: () => Promise<T>): Promise<T> {
    while (this.#gc) await this.#gc;
    this.#ops++;
    try {
      return await fn();
    } finally {
      if (--this.#ops === 0) { for (const wake of this.#idle.splice(0)) wake(); }
    }
  }

  /** A GC that breaks the rule: after the GC before it, but beside ADDs and DELs. */
  gcBeside<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.#beside.then(fn);
    this.#beside = run.then(() => {}, () => {});
    return run;
  }

  async gc<T>(fn: () => Promise<T>): Promise<T> {
    while (this.#gc) await this.#gc;
    let done!: () => void;
    this.#gc = new Promise<void>((r) => (done = r));
    try {
      while (this.#ops > 0) await new Promise<void>((r) => this.#idle.push(r));
      return await fn();
    } finally {
      this.#gc = null;
      done();
    }
  }
}

/** Picks an operation by weight. */
export function pickOp(rand: () => number, weights: Record<OpName, number>): OpName {
  const entries = (Object.keys(DEFAULT_OP_WEIGHTS) as OpName[]).map((k) =>
    [k, weights[k] ?? 0] as const
  );
  const total = entries.reduce((s, [, w]) => s + w, 0);
  let x = rand() * total;
  for (const [k, w] of entries) {
    if ((x -= w) < 0) return k;
  }
  return "add";
}

/** One client's loop: operations while resumed, until stopped. */
export async function clientLoop(ops: Operations, c: Client): Promise<void> {
  const { ctx } = ops;
  while (!ctx.stopped) {
    if (ctx.paused) {
      await ctx.whenResumed();
      continue;
    }
    const op = pickOp(c.rand, ctx.opts.ops);
    const done = ctx.begin();
    let did = false;
    try {
      did = await ops.one(c, op);
    } catch (err) {
      ctx.anomaly(
        "harness_error",
        `${op} via ${c.via}: ${err instanceof Error ? err.stack ?? err.message : err}`,
      );
    } finally {
      done();
    }
    await new Promise((r) => setTimeout(r, Math.floor(c.rand() * (did ? 8 : 20))));
  }
}

/** The clients: even-numbered ones through the plugin, odd ones through the API. */
export function makeClients(n: number, seed: number): Client[] {
  return Array.from({ length: n }, (_, i) => ({
    index: i,
    via: i % 2 === 0 ? "plugin" : "api",
    rand: prng((seed ^ Math.imul(i + 1, 0x9e3779b1)) >>> 0),
  }));
}
