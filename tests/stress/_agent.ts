/**
 * The agent under stress: started in the simulated node's sandbox exactly as
 * `SimulatedNode.startAgent` starts it (`enim agent --config /run/enim/agent.jsonc`
 * with the production permission set), but without waiting, so it can be
 * SIGKILLed during start-up and reconcile, and with the phase each kill hit
 * read back from the agent's own log.
 *
 * Only the process this module spawned is ever signalled, by its PID.
 *
 * @module
 */
import { z } from "zod";
import { agentCommandLine } from "../support/agent_proc.ts";
import type { SimulatedNode } from "../support/node.ts";
import { unixRequest } from "../../api/client.ts";

/** Where in its life the agent was when it was killed. */
export type KillPhase =
  /** Deno loading, config: not a line logged yet. */
  | "boot"
  /** State opened, provider and devices set up, reconcile running. */
  | "reconcile"
  /** Reconciled, the API socket not served yet. */
  | "post_reconcile"
  /** Serving, with client operations in flight. */
  | "serving_in_flight"
  /** Serving, no client operation in flight. */
  | "serving_idle";

const LogLineSchema = z.looseObject({ msg: z.string(), ts: z.string().optional() });

/** Milestones of one start, in ms after the spawn (from the agent's log). */
export interface StartTimes {
  started?: number;
  reconciled?: number;
  serving?: number;
  /** When the harness first got an answer from `GET /v1/healthz`. */
  healthy?: number;
}

/** One agent process. */
export class AgentRun {
  readonly pid: number;
  readonly spawnedAt: number;
  readonly #logPath: string;
  readonly #logOffset: number;
  readonly #drained: Promise<void>;
  #stderr = "";
  exited: Deno.CommandStatus | null = null;
  readonly status: Promise<Deno.CommandStatus>;
  readonly times: StartTimes = {};

  constructor(node: SimulatedNode, logOffset: number) {
    const [cmd, ...args] = agentCommandLine(node.sandbox, node.sandbox.inner("agent.jsonc"));
    this.#logPath = node.logPath;
    this.#logOffset = logOffset;
    this.spawnedAt = Date.now();
    const child = new Deno.Command(cmd, {
      args,
      clearEnv: true,
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    this.pid = child.pid;
    const dec = new TextDecoder();
    this.#drained = (async () => {
      for await (const chunk of child.stderr) {
        this.#stderr = (this.#stderr + dec.decode(chunk)).slice(-16384);
      }
    })().catch(() => {});
    this.status = child.status.then((s) => (this.exited = s));
  }

  /** The agent's stderr so far (last 16 KiB). */
  get stderr(): string {
    return this.#stderr;
  }

  /** The agent's log lines of this run (parsed), with their time after the spawn. */
  async logLines(): Promise<{ msg: string; at: number | null; raw: Record<string, unknown> }[]> {
    let text = "";
    try {
      const f = await Deno.open(this.#logPath, { read: true });
      try {
        await f.seek(this.#logOffset, Deno.SeekMode.Start);
        text = new TextDecoder().decode(await new Response(f.readable).arrayBuffer());
      } catch {
        f.close();
      }
    } catch { /* no log yet */ }
    const out: { msg: string; at: number | null; raw: Record<string, unknown> }[] = [];
    for (const line of text.split("\n")) {
      if (!line.trim()) continue;
      let json: unknown;
      try {
        json = JSON.parse(line);
      } catch {
        continue; // a line cut by the kill
      }
      const p = LogLineSchema.safeParse(json);
      if (!p.success) continue;
      const at = p.data.ts ? Date.parse(p.data.ts) - this.spawnedAt : null;
      out.push({ msg: p.data.msg, at: Number.isFinite(at) ? at : null, raw: p.data });
    }
    return out;
  }

  /** Reads the start milestones from the log. */
  async readTimes(): Promise<StartTimes> {
    for (const l of await this.logLines()) {
      if (l.at === null) continue;
      if (l.msg === "starting the enim agent") this.times.started ??= l.at;
      else if (l.msg === "reconciled the state with the provider and the devices") {
        this.times.reconciled ??= l.at;
      } else if (l.msg === "serving the API") this.times.serving ??= l.at;
    }
    return this.times;
  }

  /** Waits until `GET /v1/healthz` answers 200; throws when the agent exits or stays silent. */
  async waitHealthy(socket: string, timeoutMs = 30_000): Promise<number> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      if (this.exited) {
        await this.#drained;
        throw new Error(
          `The agent (pid ${this.pid}) exited with ${this.exited.code} before answering:\n${this.#stderr}`,
        );
      }
      try {
        const res = await unixRequest(socket, "GET", "/v1/healthz", undefined, 2000);
        if (res.status === 200) {
          this.times.healthy = Date.now() - this.spawnedAt;
          return this.times.healthy;
        }
      } catch { /* not up yet */ }
      if (Date.now() > until) {
        throw new Error(
          `The agent (pid ${this.pid}) did not answer within ${timeoutMs} ms:\n${this.#stderr}`,
        );
      }
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  /** SIGKILLs this process (by its PID) and waits for it; returns the phase it hit. */
  async kill(inFlight: number): Promise<KillPhase> {
    if (!this.exited) {
      try {
        Deno.kill(this.pid, "SIGKILL");
      } catch { /* already gone */ }
    }
    await this.status;
    await this.#drained;
    const t = await this.readTimes();
    if (t.serving === undefined) {
      return t.reconciled !== undefined
        ? "post_reconcile"
        : t.started !== undefined
        ? "reconcile"
        : "boot";
    }
    return inFlight > 0 ? "serving_in_flight" : "serving_idle";
  }

  /** SIGTERMs this process (by its PID), SIGKILL after 15 s; returns its status. */
  async stop(): Promise<Deno.CommandStatus> {
    if (!this.exited) {
      try {
        Deno.kill(this.pid, "SIGTERM");
      } catch { /* gone */ }
    }
    const timer = setTimeout(() => {
      try {
        if (!this.exited) Deno.kill(this.pid, "SIGKILL");
      } catch { /* gone */ }
    }, 15_000);
    try {
      const s = await this.status;
      await this.#drained;
      return s;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** The size of the agent log, where the next agent's lines will start. */
export async function logSize(path: string): Promise<number> {
  try {
    return (await Deno.stat(path)).size;
  } catch {
    return 0;
  }
}
