/**
 * The plugin as a container runtime execs it, exactly as `SimulatedNode.cni`
 * runs it (the same command line in the node's sandbox, the same environment,
 * the config on stdin), but with the child's PID at hand so the stress run can
 * SIGKILL it mid-call. Every live plugin PID is tracked so an interrupted run
 * kills only its own children.
 *
 * @module
 */
import { z } from "zod";
import type { CniCall, SimulatedNode } from "../support/node.ts";

/** PIDs of plugin processes still running (killed by PID on an interrupted run). */
export const livePlugins: Set<number> = new Set();

/** A CNI error object as the plugin prints it. */
export const CniErrorSchema = z.object({
  cniVersion: z.string(),
  code: z.number().int(),
  msg: z.string(),
  details: z.string().optional(),
});

/** The outcome of one plugin run. */
export interface PluginOutcome {
  code: number;
  signal: Deno.Signal | null;
  stdout: string;
  stderr: string;
  /** Whether the harness killed it mid-call (`killAfterMs`). */
  killed: boolean;
  /** Whether it ran past `timeoutMs` and was killed for it (a hang). */
  timedOut: boolean;
  /** Milliseconds from spawn to exit. */
  ms: number;
}

/** The env `SimulatedNode.cni` gives the plugin for `command` and `call`. */
export function pluginEnv(
  node: SimulatedNode,
  command: string,
  call: CniCall,
): Record<string, string> {
  const env: Record<string, string> = {
    PATH: "/usr/sbin:/usr/bin:/sbin:/bin",
    NO_COLOR: "1",
    CNI_COMMAND: command,
    CNI_PATH: "/opt/cni/bin",
    ENIM_LOG_FILE: node.sandbox.inner("cni.log"),
    ...call.env,
  };
  if (call.containerId !== undefined) env.CNI_CONTAINERID = call.containerId;
  if (call.ifName !== undefined) env.CNI_IFNAME = call.ifName;
  if (call.netns !== undefined) env.CNI_NETNS = call.netns;
  if (call.args !== undefined) env.CNI_ARGS = call.args;
  return env;
}

/**
 * Runs the plugin once in the node's sandbox; with `killAfterMs`, SIGKILLs it (by
 * PID) that long after the spawn if it is still running. `rawEnv` replaces the
 * environment built from `call` (the fuzz sends malformed ones).
 */
export async function runPlugin(
  node: SimulatedNode,
  command: string,
  call: CniCall,
  opts: { killAfterMs?: number; rawEnv?: Record<string, string>; timeoutMs?: number } = {},
): Promise<PluginOutcome> {
  const [cmd, ...args] = node.sandbox.enim([]);
  const env = opts.rawEnv
    ? { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", NO_COLOR: "1", ...opts.rawEnv }
    : pluginEnv(node, command, call);
  const stdin = typeof call.config === "string" ? call.config : JSON.stringify(call.config);
  const t0 = performance.now();
  const child = new Deno.Command(cmd, {
    args,
    clearEnv: true,
    env,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  livePlugins.add(child.pid);
  let killed = false;
  let timedOut = false;
  const kill = (why: "kill" | "timeout") => {
    if (!livePlugins.has(child.pid)) return;
    try {
      child.kill("SIGKILL");
      if (why === "kill") killed = true;
      else timedOut = true;
    } catch { /* exited meanwhile */ }
  };
  const timers = [
    opts.killAfterMs !== undefined ? setTimeout(() => kill("kill"), opts.killAfterMs) : undefined,
    setTimeout(() => kill("timeout"), opts.timeoutMs ?? 60_000),
  ];
  try {
    const w = child.stdin.getWriter();
    try {
      await w.write(new TextEncoder().encode(stdin));
      await w.close();
    } catch { /* the child died before reading all of stdin */ }
    const out = await child.output();
    const dec = new TextDecoder();
    return {
      code: out.code,
      signal: out.signal,
      stdout: dec.decode(out.stdout),
      stderr: dec.decode(out.stderr),
      killed: killed && out.signal === "SIGKILL",
      timedOut: timedOut && out.signal === "SIGKILL",
      ms: performance.now() - t0,
    };
  } finally {
    for (const t of timers) clearTimeout(t);
    livePlugins.delete(child.pid);
  }
}

/** Kills every plugin process still running (by PID); for an interrupted run. */
export function killLivePlugins(): void {
  for (const pid of livePlugins) {
    try {
      Deno.kill(pid, "SIGKILL");
    } catch { /* gone */ }
  }
}
