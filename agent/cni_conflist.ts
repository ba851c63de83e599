/**
 * The CNI network configuration on the node (`cniConfig` in the agent config): the agent
 * writes it once it answers on its socket, so a runtime that schedules pods by the
 * conflist's presence (containerd before 2.0.1, CRI-O: no CNI STATUS) never sends an ADD
 * to a node whose agent is not up yet.
 *
 * | phase | the conflist |
 * | --- | --- |
 * | start, lock, reconcile | untouched: absent on a new node, the last one on a restart |
 * | serving | written once the agent's own socket answers `GET /v1/status` ready: `source` checked as the plugin parses it, copied beside `destination` and renamed over it (mode 0644); left alone when already the same |
 * | stop | kept (see below) |
 *
 * Kept at stop: a restarting or upgrading agent must not turn the node NotReady. A runtime
 * that reads the conflist's absence as "no network" marks the node NotReady at once, the
 * scheduler stops placing pods there, and past the node controller's grace its pods are
 * evicted; it also could not run the DEL of a pod deleted meanwhile. The plugin already
 * answers 11 (try again) while its agent is down, and STATUS-aware runtimes learn of the
 * agent's absence from CNI STATUS (50). Removing enim from a node is removing this file.
 *
 * @module
 */
import { basename, dirname, join } from "node:path";
import { parseNetworkConfig } from "../cni/config.ts";
import { SocketAgentClient } from "../api/client.ts";
import type { AgentConfig } from "./config.ts";
import { type Logger, nullLogger } from "../lib/log.ts";
import { poll } from "../lib/async.ts";
import { userMessage } from "../lib/message.ts";

/** Where the conflist comes from and goes (`cniConfig`). */
export type ConflistConfig = NonNullable<AgentConfig["cniConfig"]>;

/** The mode of the written conflist: runtimes read it as any user may. */
export const CONFLIST_MODE = 0o644;

/** Is `v` a plain object. */
function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * The problems of a conflist's text (empty: it is one the runtime and the plugin accept):
 * JSON, `cniVersion`, `name` and `plugins`, and each plugin of type enim, or with an IPAM
 * of type enim, parsed as the plugin parses its config (with the list's version and name).
 */
export function conflistProblems(text: string): string[] {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    return [`not JSON: ${userMessage(err)}`];
  }
  if (!isObject(raw)) return ["not a JSON object"];
  const problems: string[] = [];
  if (typeof raw.cniVersion !== "string") problems.push('"cniVersion": expected a string');
  if (typeof raw.name !== "string" || raw.name === "") problems.push('"name": expected a name');
  if (!Array.isArray(raw.plugins) || raw.plugins.length === 0 || !raw.plugins.every(isObject)) {
    return [...problems, '"plugins": expected a list of plugin configs (a .conflist)'];
  }
  const enim = (raw.plugins as Record<string, unknown>[]).map((p, i) => ({ p, i })).filter((
    { p },
  ) => p.type === "enim" || (isObject(p.ipam) && p.ipam.type === "enim"));
  if (enim.length === 0) problems.push('"plugins": none is enim (type or ipam.type "enim")');
  for (const { p, i } of enim) {
    try {
      parseNetworkConfig({ cniVersion: raw.cniVersion, name: raw.name, ...p });
    } catch (err) {
      problems.push(`plugins[${i}]: ${userMessage(err)}`);
    }
  }
  return problems;
}

/**
 * What `enim agent --check-config` says of `cniConfig`: the permission set must let the
 * agent read `source` and write `destination`'s folder (a problem each); `source` is
 * checked as at start when it can be read here, and only named when it cannot (a
 * ConfigMap's file exists on the node, not where a config is checked).
 */
export async function checkConflistConfig(
  c: ConflistConfig,
): Promise<{ problems: string[]; note: string }> {
  const problems: string[] = [];
  const can = async (d: Deno.PermissionDescriptor) =>
    (await Deno.permissions.query(d)).state === "granted";
  if (!(await can({ name: "read", path: c.source }))) {
    problems.push(`cniConfig.source: the enim permission set may not read "${c.source}"`);
  }
  const dir = dirname(c.destination);
  if (!(await can({ name: "write", path: dir })) || !(await can({ name: "read", path: dir }))) {
    problems.push(
      `cniConfig.destination: the enim permission set may not write in "${dir}" ` +
        "(it allows /etc/cni/net.d)",
    );
  }
  if (problems.length > 0) return { problems, note: "" };
  let text: string;
  try {
    text = await Deno.readTextFile(c.source);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) {
      return { problems, note: `${c.source} is not here (the agent needs it at start)` };
    }
    return {
      problems: [`cniConfig.source: cannot read "${c.source}": ${userMessage(err)}`],
      note: "",
    };
  }
  const bad = conflistProblems(text).map((p) => `cniConfig.source "${c.source}": ${p}`);
  return { problems: bad, note: bad.length ? "" : `${c.source} is a valid conflist` };
}

/**
 * Writes `source` to `destination` (mode 0644) unless it already holds the same text:
 * written beside it and renamed over it, so a runtime never reads half of one. Throws,
 * naming the file, when `source` is missing or not a conflist enim accepts (nothing is
 * written then) or the write fails. Returns whether it wrote.
 */
export async function writeConflist(c: ConflistConfig, log: Logger = nullLogger): Promise<boolean> {
  let text: string;
  try {
    text = await Deno.readTextFile(c.source);
  } catch (err) {
    throw new Error(
      `Cannot read the CNI config "${c.source}" (cniConfig.source): ${userMessage(err)}`,
      {
        cause: err,
      },
    );
  }
  const problems = conflistProblems(text);
  if (problems.length > 0) {
    throw new Error(
      `The CNI config "${c.source}" (cniConfig.source) is not one enim can use: ${
        problems.join("; ")
      }`,
    );
  }
  try {
    const st = await Deno.stat(c.destination);
    if (
      (st.mode ?? 0) % 0o1000 === CONFLIST_MODE && await Deno.readTextFile(c.destination) === text
    ) {
      log.info("the CNI config on the node is already this one", { destination: c.destination });
      return false;
    }
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) {
      log.warn("cannot read the CNI config on the node; writing it again", {
        destination: c.destination,
        error: err,
      });
    }
  }
  const dir = dirname(c.destination);
  const tmp = join(dir, `.${basename(c.destination)}.enim-${Deno.pid}.tmp`);
  try {
    await Deno.mkdir(dir, { recursive: true, mode: 0o755 });
    await Deno.writeTextFile(tmp, text, { mode: CONFLIST_MODE });
    await Deno.chmod(tmp, CONFLIST_MODE); // whatever the umask
    await Deno.rename(tmp, c.destination);
  } catch (err) {
    await Deno.remove(tmp).catch(() => {});
    throw new Error(
      `Cannot write the CNI config "${c.destination}" (cniConfig.destination): ${userMessage(err)}`,
      { cause: err },
    );
  }
  log.info("wrote the CNI config on the node: the runtime may send pods now", {
    source: c.source,
    destination: c.destination,
  });
  return true;
}

/** Options of {@linkcode installConflistWhenServing}. */
export interface InstallOptions {
  /** The agent's socket: the conflist is written once it answers there. */
  socket: string;
  log?: Logger;
  /** Stops the wait (the agent stopping). */
  signal?: AbortSignal;
  /** How long the socket has to answer ready (default 30 s): it answers at once in practice. */
  timeoutMs?: number;
}

/**
 * Waits until the agent's own socket answers `GET /v1/status` with `ready` (what the plugin
 * and CNI STATUS see), then {@linkcode writeConflist}. Throws when it does not answer ready
 * in time (nothing written) or the write fails.
 */
export async function installConflistWhenServing(
  c: ConflistConfig,
  o: InstallOptions,
): Promise<boolean> {
  const client = new SocketAgentClient(o.socket, 5_000);
  const timeoutMs = o.timeoutMs ?? 30_000;
  let last = "";
  const ready = await poll(async () => {
    try {
      const s = await client.status();
      last = s.ready ? "" : "it answers not ready";
      return s.ready ? true : null;
    } catch (err) {
      last = userMessage(err);
      return null;
    }
  }, { timeoutMs, intervalMs: 20, maxIntervalMs: 500, signal: o.signal });
  if (o.signal?.aborted) return false;
  if (!ready) {
    throw new Error(
      `The agent's socket "${o.socket}" did not answer ready within ${timeoutMs / 1000} s ` +
        `(${last}): the CNI config "${c.destination}" is not written`,
    );
  }
  return await writeConflist(c, o.log);
}
