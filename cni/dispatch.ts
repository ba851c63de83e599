/**
 * The agent-side CNI dispatcher: it runs inside the agent for every call the
 * plugin process forwards (`POST /v1/cni`, `agent/cni_call.ts`). Environment,
 * stdin and stdout are parameters, the agent's operations are the injected
 * {@linkcode AgentClient} (the agent's own, in process), and the exit code is
 * the return value.
 *
 * Whatever happens, stdout receives exactly one JSON document: the result
 * (ADD, VERSION), nothing (DEL, CHECK, GC, STATUS on success), or one CNI
 * error object (any failure, exit 1). One log line per invocation goes to the
 * logger, never to stdout.
 *
 * What the plugin process answers without the agent (VERSION, 11 when the agent
 * cannot be reached, DEL when the pod's namespace is gone) is `cni/forward.ts`'s;
 * what a call gets wrong whatever the agent says (`specProblem` in `cni/spec.ts`)
 * is checked here first and answered there when the agent is down, from the same
 * table, so the code and message are the same either way.
 *
 * Why one file: the dispatcher and its verb handlers share the invocation record
 * and the negotiated version; each handler is short, and the file reads top to
 * bottom as the CNI protocol does (decode, negotiate, parse, dispatch, answer).
 *
 * @module
 */
import { type AddRequest, ApiError, type CheckRequest } from "../api/schema.ts";
import type { AgentClient } from "../api/client.ts";
import { type Logger, nullLogger } from "../lib/log.ts";
import { type CniArgs, parseCniArgs, podOf } from "./args.ts";
import { annotationsOf, podChoice } from "./selection.ts";
import { limitsAny, podBandwidth } from "./bandwidth.ts";
import { DEFAULT_PROFILE, podKeyOf } from "../providers/schema.ts";
import { DEFAULT_LOG_FILE, type ParsedConfig, parseNetworkConfig } from "./config.ts";
import { type CniEnv, parseCniEnv } from "./env.ts";
import { CNI_CODES, CniError, toCniError } from "./errors.ts";
import {
  answer,
  answerVersion,
  type CniVerb,
  type Decoded,
  decodeStdin,
  enimSection,
  GC_LIST_MISSING,
  type InvocationRecord,
  isPlainObject,
  specProblem,
} from "./spec.ts";

export type { InvocationRecord };
import { buildAddResult } from "./result.ts";
import { hostLinkRequest } from "./host_link.ts";
import {
  convertResult,
  LATEST_VERSION,
  type NegotiatedVersion,
  negotiateVersion,
  parsePrevResult,
} from "./negotiate.ts";

/** What {@linkcode dispatchCall} needs from its caller. */
export interface DispatchIo {
  /** The environment (only the CNI_* names are read). */
  env: Record<string, string | undefined>;
  /** Everything read from stdin. */
  stdin: string;
  /** Receives the one JSON document for stdout. */
  stdout: (s: string) => void;
  /** The agent's operations (in the agent: its own, in process). */
  agent: AgentClient;
  /** Where the invocation line goes; when absent, {@linkcode DispatchIo.openLog} is used. */
  log?: Logger;
  /** Opens the logger for the config's `logFile`; when absent too, nothing is logged. */
  openLog?: (logFile: string) => Logger;
}

/** The per-invocation state the verbs fill in for the log line. */
interface Invocation {
  io: DispatchIo;
  env: CniEnv;
  record: InvocationRecord;
  warnings: string[];
}

/**
 * Serves one CNI invocation.
 *
 * @example
 * ```ts
 * let out = "";
 * const code = await dispatchCall({
 *   env: { CNI_COMMAND: "VERSION" },
 *   stdin: '{"cniVersion":"1.1.0"}',
 *   stdout: (s) => (out += s),
 *   agent: agentClient, // the agent's own operations
 * });
 * // code === 0, out is the VERSION result
 * ```
 */
export async function dispatchCall(io: DispatchIo): Promise<number> {
  const started = performance.now();
  const record: InvocationRecord = { verb: io.env.CNI_COMMAND ?? null, code: 0, durationMs: 0 };
  const warnings: string[] = [];
  const decoded = decodeStdin(io.stdin);
  let cniVersion: string = LATEST_VERSION;
  let logFile = DEFAULT_LOG_FILE;
  if (decoded.ok && isPlainObject(decoded.value)) {
    if (typeof decoded.value.cniVersion === "string") cniVersion = decoded.value.cniVersion;
    logFile = peekLogFile(decoded.value) ?? logFile;
  }
  record.cniVersion = cniVersion;

  let output: string | undefined;
  let exit = 0;
  try {
    const env = parseCniEnv(io.env);
    record.verb = env.command;
    record.containerId = env.containerId;
    record.ifName = env.ifName;
    record.netns = env.netns;
    const result = await dispatch({ io, env, record, warnings }, decoded);
    output = result === undefined ? undefined : JSON.stringify(result);
  } catch (err) {
    const obj = toCniError(err, cniVersion, { verb: record.verb ?? undefined });
    record.code = obj.code;
    record.msg = obj.msg;
    output = JSON.stringify(obj);
    exit = 1;
  }
  exit = answer(io.stdout, output, exit, record, started);
  if (warnings.length > 0) record.warnings = warnings;
  try {
    const log = io.log ?? io.openLog?.(logFile) ?? nullLogger;
    const level = exit !== 0 ? "error" : warnings.length > 0 ? "warn" : "info";
    log[level]("cni invocation", { ...record });
  } catch {
    // Logging never affects the result.
  }
  return exit;
}

/** The configured `logFile`, read before validation so a bad config is still logged where asked. */
function peekLogFile(raw: Record<string, unknown>): string | undefined {
  const f = enimSection(raw)?.logFile;
  return typeof f === "string" && f.startsWith("/") ? f : undefined;
}

/** Decodes, negotiates and validates, then runs the verb. Returns what goes to stdout. */
async function dispatch(inv: Invocation, decoded: Decoded): Promise<unknown> {
  const { env } = inv;
  if (env.command === "VERSION") return versionVerb(decoded);
  // What is wrong whatever the agent says, first, from the one table the plugin
  // process answers from when the agent is down (spec.ts), so both say the same.
  const problem = specProblem(inv.io.env, decoded);
  if (problem) throw new CniError(problem.code, problem.msg);
  // specProblem refuses a stdin that is no JSON object, so `decoded` holds one here.
  const parsed = parseNetworkConfig(decoded.ok ? decoded.value : undefined);
  const version = negotiateVersion(parsed.config.cniVersion);
  inv.record.network = parsed.config.name;
  inv.record.mode = parsed.mode;
  return await VERBS[env.command]({ inv, parsed, version, agent: inv.io.agent });
}

/** What a verb's handler gets once the config is parsed and the version negotiated. */
interface VerbCall {
  inv: Invocation;
  parsed: ParsedConfig;
  version: NegotiatedVersion;
  agent: AgentClient;
}

/**
 * The verbs that take a network config, one handler each. The compiler checks
 * that every verb but VERSION (answered before the config is read) has one; a
 * new verb is a new `CNI_VERBS` entry (`spec.ts`) and a line here.
 */
const VERBS: Record<Exclude<CniVerb, "VERSION">, (c: VerbCall) => Promise<unknown>> = {
  ADD: ({ inv, parsed, version, agent }) => addVerb(inv, parsed, version, agent),
  DEL: ({ inv, parsed, agent }) => delVerb(inv, parsed, agent),
  CHECK: ({ inv, parsed, agent }) => checkVerb(inv, parsed, agent),
  GC: ({ parsed, agent }) => gcVerb(parsed, agent),
  STATUS: ({ agent }) => statusVerb(agent),
};

/** VERSION: see `answerVersion` in spec.ts. */
function versionVerb(decoded: Decoded): unknown {
  const v = answerVersion(decoded);
  if (!v.ok) throw new CniError(CNI_CODES.DECODE_FAILED, v.msg);
  return v.result;
}

/** Parses CNI_ARGS and the pod, recording the pod for the log line. */
function podFor(inv: Invocation): { args: CniArgs; pod: ReturnType<typeof podOf> } {
  const args = parseCniArgs(inv.env.args);
  const pod = podOf(args, inv.env.containerId!);
  inv.record.pod = podKeyOf(pod);
  return { args, pod };
}

async function addVerb(
  inv: Invocation,
  { config, mode, enim }: ParsedConfig,
  version: NegotiatedVersion,
  client: AgentClient,
): Promise<unknown> {
  const { env } = inv;
  const { args, pod } = podFor(inv);
  const choice = podChoice(config, args);
  for (const o of choice.overridden) inv.warnings.push(`Two sources disagree; ${o}`);
  if (choice.profile !== DEFAULT_PROFILE) inv.record.profile = choice.profile;
  const prevResult = mode === "interface" && config.prevResult !== undefined
    ? parsePrevResult(config.prevResult)
    : undefined;
  const req: AddRequest = {
    containerId: env.containerId!,
    ifName: env.ifName!,
    netns: env.netns!,
    network: config.name,
    pod,
    mode,
    ips: choice.ips,
    ranges: config.runtimeConfig?.ipRanges ?? [],
    ...(choice.profile !== DEFAULT_PROFILE ? { profile: choice.profile } : {}),
    ...(choice.securityGroupIds ? { securityGroupIds: choice.securityGroupIds } : {}),
    ...(choice.sticky ? { sticky: true } : {}),
    routes: enim.routes.map((
      r,
    ) => (r.gw === undefined ? { dst: r.dst } : { dst: r.dst, gw: r.gw })),
    defaultRoutes: enim.defaultRoutes,
    ...(enim.mtu !== undefined ? { mtu: enim.mtu } : {}),
    ...bandwidthFor(inv, config, mode),
    ...hostLinkOf(inv, enim, mode, args),
  };
  const res = await client.add(req);
  inv.record.eniId = res.eniId;
  const result = buildAddResult(res, {
    mode,
    ifName: env.ifName!,
    netns: env.netns!,
    mtu: enim.mtu,
    prevResult,
  });
  return convertResult(result, version);
}

/**
 * The pod's bandwidth limits for the ADD request (cni/bandwidth.ts): shaped on the ENI
 * in interface mode; in IPAM mode the device is the calling plugin's, so the limits
 * are checked (a bad value is still a 7) and not enforced, which the call's log line says.
 */
function bandwidthFor(
  inv: Invocation,
  config: ParsedConfig["config"],
  mode: ParsedConfig["mode"],
): Pick<AddRequest, "bandwidth"> {
  const { shaping, overridden } = podBandwidth(config, annotationsOf(config));
  for (const o of overridden) inv.warnings.push(`Two sources disagree; ${o}`);
  if (!limitsAny(shaping)) return {};
  if (mode === "ipam") {
    inv.warnings.push(
      "Bandwidth limits are not enforced in IPAM mode: the device is the calling plugin's",
    );
    return {};
  }
  return { bandwidth: shaping };
}

/** The request's `hostLink` (cni/host_link.ts), and the log line's warning when no Service routes. */
function hostLinkOf(
  inv: Invocation,
  enim: ParsedConfig["enim"],
  mode: ParsedConfig["mode"],
  args: CniArgs,
): Pick<AddRequest, "hostLink"> {
  const hostLink = hostLinkRequest(enim, mode, args, inv.env.ifName!);
  if (!hostLink) return {};
  inv.record.hostLink = hostLink.podIfName;
  if (hostLink.serviceCidrs.length === 0) {
    inv.warnings.push(
      'The pod gets a host link but the config lists no "serviceCidrs": Services will not route from it',
    );
  }
  return { hostLink };
}

async function delVerb(
  inv: Invocation,
  { config }: ParsedConfig,
  client: AgentClient,
): Promise<undefined> {
  const { env } = inv;
  try {
    podFor(inv);
  } catch (err) {
    // DEL must not fail on what ADD would have refused: the owner is only for the log.
    inv.warnings.push(`Ignoring CNI_ARGS on DEL: ${err instanceof Error ? err.message : err}`);
  }
  try {
    await client.del({
      containerId: env.containerId!,
      ifName: env.ifName!,
      netns: env.netns ?? "",
      network: config.name,
    });
  } catch (err) {
    if (err instanceof ApiError && err.code === "not_found") {
      inv.warnings.push("The agent has no record of this attachment; nothing to delete");
      return undefined;
    }
    throw err;
  }
  return undefined;
}

async function checkVerb(
  inv: Invocation,
  { config, mode }: ParsedConfig,
  client: AgentClient,
): Promise<undefined> {
  const { env } = inv;
  podFor(inv);
  if (config.prevResult === undefined) {
    throw new CniError(
      CNI_CODES.INVALID_CONFIG,
      "Invalid network config: CHECK requires prevResult",
    );
  }
  const prev = parsePrevResult(config.prevResult);
  let mac: string | undefined;
  let addresses = prev.ips.map((ip) => ip.address);
  if (mode === "interface") {
    const index = prev.interfaces.findIndex((i) =>
      i.name === env.ifName && (i.sandbox === undefined || i.sandbox === env.netns)
    );
    if (index < 0) {
      throw new CniError(
        CNI_CODES.CHECK_FAILED,
        `CHECK failed: prevResult has no interface "${env.ifName}" in "${env.netns}"`,
      );
    }
    mac = prev.interfaces[index].mac;
    addresses = prev.ips.filter((ip) => ip.interface === index).map((ip) => ip.address);
  }
  const req: CheckRequest = {
    containerId: env.containerId!,
    ifName: env.ifName!,
    netns: env.netns!,
    network: config.name,
    mode,
    expected: {
      ...(mac !== undefined ? { mac } : {}),
      addresses,
      routes: prev.routes.map((
        r,
      ) => (r.gw === undefined ? { dst: r.dst } : { dst: r.dst, gw: r.gw })),
    },
  };
  await client.check(req);
  return undefined;
}

async function gcVerb({ config }: ParsedConfig, client: AgentClient): Promise<undefined> {
  // The spec's key, and the one some texts of 1.1.0 name: a runtime sends one of them.
  const lists = [config["cni.dev/valid-attachments"], config["cni.dev/attachments"]];
  // specProblem (spec.ts) refused a config with neither; kept for a caller that skips it.
  if (lists.every((l) => l === undefined)) {
    throw new CniError(CNI_CODES.INVALID_CONFIG, GC_LIST_MISSING);
  }
  const valid = lists.flatMap((l) => l ?? []);
  const report = await client.gc({
    network: config.name,
    validAttachments: valid.map((a) => ({ containerId: a.containerID, ifName: a.ifname })),
  });
  const failed = report.items.filter((i) => i.outcome === "failed");
  if (failed.length > 0) {
    throw new CniError(
      CNI_CODES.GC_INCOMPLETE,
      `GC could not reclaim ${failed.length} of ${report.items.length} ENIs of network "${config.name}" (the agent retries them)`,
      failed.map((i) => `${i.eniId} (${i.containerId}/${i.ifName}): ${i.error ?? "failed"}`).join(
        "; ",
      ),
    );
  }
  return undefined;
}

/**
 * STATUS: 0 while the agent answers, has reconciled and is not shutting down; 50
 * otherwise (and when it cannot be reached, `forward.ts`/`errors.ts`).
 *
 * A full pool (every ENI owned, sticky holds included, none attachable) is not a
 * failure: containerd ≥ 2.0.1 runs STATUS on every CRI Status call and reports
 * NetworkReady=false on a failure, kubelet then marks the node NotReady, the node
 * controller taints it `not-ready:NoExecute` and every pod on it is evicted, while
 * filling a node to its ENI limit is what the device plugin has the scheduler do. The
 * full pool is reported in `enim status` (`pool.exhausted`) and by
 * `enim_pool_exhausted`; the ADD that finds no ENI fails with 100.
 */
async function statusVerb(client: AgentClient): Promise<undefined> {
  const status = await client.status();
  if (!status.ready) {
    throw new CniError(
      CNI_CODES.NOT_AVAILABLE,
      "The enim agent is not ready (it has not reconciled its ENIs, or it is shutting down)",
    );
  }
  return undefined;
}
