/**
 * Runs the real agent (`enim agent`, main.ts with the enim permission set) as a
 * child process on a test socket, for integration and crash tests.
 *
 * The permission set allows unix sockets only at the production path, so the
 * child runs in an {@linkcode EnimSandbox} (a private /run/enim) with exactly the
 * production permission set; config paths are as the agent sees them.
 *
 * @module
 */
import type { EnimSandbox } from "./sandbox.ts";
import { unixRequest } from "../../api/client.ts";
import type { AddRequest } from "../../api/schema.ts";

/**
 * The config the process tests start the agent with, `dir` being the sandbox's run
 * directory as the agent sees it: the socket there, the state in `state/enim.db`, the
 * mock provider with `mock`'s settings, GC out of the way (hourly, an hour's grace), info
 * logs to stderr, and the fake device layer (no root, no kernel devices). `over` replaces
 * whole top-level keys.
 */
export function fakeDevicesConfig(
  dir: string,
  mock: Record<string, unknown>,
  over: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    socket: `${dir}/enim.sock`,
    statePath: `${dir}/state/enim.db`,
    provider: { name: "mock", mock },
    gc: { intervalSeconds: 3600, graceSeconds: 3600 },
    log: { level: "info" },
    devices: "fake",
    ...over,
  };
}

/**
 * The agent API's ADD of pod `i` in the process tests: container `ctr-<i>` in
 * `/run/netns/pod-<i>`, pod `default/pod-<i>`, on network `enim-net`, with a default route.
 */
export function podAddRequest(i: number): AddRequest {
  return {
    containerId: `ctr-${i}`,
    ifName: "eth0",
    netns: `/run/netns/pod-${i}`,
    network: "enim-net",
    pod: { namespace: "default", name: `pod-${i}` },
    mode: "interface",
    routes: [{ dst: "0.0.0.0/0" }],
  };
}

/** The agent command line inside the sandbox. */
export function agentCommandLine(
  sb: EnimSandbox,
  configPath: string,
  prefix?: string[],
): string[] {
  return sb.enim(["agent", "--config", configPath], prefix);
}

/** A running agent child. */
export interface AgentProcess {
  readonly pid: number;
  /** The API socket, as the test process sees it. */
  readonly socket: string;
  /** Everything the child wrote to stderr so far. */
  stderr(): string;
  /** Sends `signal` to the child (by its PID) and waits for it to exit. */
  stop(signal?: Deno.Signal): Promise<Deno.CommandStatus>;
}

/** Writes `config` to the sandbox's agent.jsonc, starts the agent and waits until it answers. */
export async function startAgent(
  sb: EnimSandbox,
  config: Record<string, unknown>,
  timeoutMs = 20_000,
): Promise<AgentProcess> {
  const inner = String(config.socket ?? sb.inner("enim.sock"));
  if (!inner.startsWith(sb.inner() + "/")) {
    throw new Error(`Socket "${inner}" is outside the sandbox`);
  }
  await Deno.writeTextFile(sb.host("agent.jsonc"), JSON.stringify(config, null, 2));
  return await spawnAgent(sb, {
    socket: sb.host(inner.slice(sb.inner().length + 1)),
    timeoutMs,
  });
}

/** Options for {@linkcode spawnAgent}. */
export interface SpawnAgentOptions {
  /** The API socket as the test process sees it. */
  socket: string;
  /** Extra arguments after `agent --config /run/enim/agent.jsonc`. */
  args?: string[];
  /** Also append the agent's stderr to this file (host path). */
  stderrFile?: string;
  timeoutMs?: number;
  /** The argv prefix of another build (an earlier release); default this tree's bundle. */
  enim?: string[];
}

/**
 * Starts the agent on the sandbox's existing agent.jsonc and waits until its
 * socket answers; throws with its stderr if it exits or stays silent first.
 */
export async function spawnAgent(sb: EnimSandbox, o: SpawnAgentOptions): Promise<AgentProcess> {
  const timeoutMs = o.timeoutMs ?? 20_000;
  const [cmd, ...args] = [
    ...agentCommandLine(sb, sb.inner("agent.jsonc"), o.enim),
    ...(o.args ?? []),
  ];
  const file = o.stderrFile
    ? await Deno.open(o.stderrFile, { write: true, append: true, create: true })
    : null;
  const child = new Deno.Command(cmd, {
    args,
    clearEnv: true,
    // The agent's environment as deploy/enim-agent.service and the DaemonSet set it.
    env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", NO_COLOR: "1", MALLOC_ARENA_MAX: "2" },
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let err = "";
  const dec = new TextDecoder();
  const drained = (async () => {
    try {
      for await (const chunk of child.stderr) {
        err = (err + dec.decode(chunk)).slice(-65536);
        await file?.write(chunk);
      }
    } finally {
      file?.close();
    }
  })();
  let exited: Deno.CommandStatus | undefined;
  const status = child.status.then((s) => (exited = s));
  let stopped: Promise<Deno.CommandStatus> | undefined;
  const proc: AgentProcess = {
    pid: child.pid,
    socket: o.socket,
    stderr: () => err,
    stop(signal: Deno.Signal = "SIGTERM") {
      stopped ??= (async () => {
        if (!exited) {
          try {
            Deno.kill(child.pid, signal);
          } catch { /* already gone */ }
        }
        // An agent that ignores the signal is killed after 10 s.
        const timer = setTimeout(() => {
          try {
            Deno.kill(child.pid, "SIGKILL");
          } catch { /* gone */ }
        }, 10_000);
        try {
          const s = await status;
          await drained;
          return s;
        } finally {
          clearTimeout(timer);
        }
      })();
      return stopped;
    },
  };
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (exited) {
      await drained;
      throw new Error(`The agent exited with ${exited.code} before answering:\n${err}`);
    }
    try {
      const res = await unixRequest(o.socket, "GET", "/v1/healthz", undefined, 2000);
      if (res.status === 200) return proc;
    } catch { /* not up yet */ }
    if (Date.now() > until) {
      await proc.stop("SIGKILL");
      throw new Error(`The agent did not answer within ${timeoutMs} ms:\n${err}`);
    }
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A seeded PRNG: the same seed gives the same run. */
export { mulberry32 as prng } from "../../lib/rng.ts";
