/**
 * A simulated node with a running agent: the harness of the end-to-end tests,
 * the demo and the bench.
 *
 * It builds a {@linkcode SimulatedVpc}, writes an agent config under
 * /run/enim/<unique>/ (inside the permission set), starts `enim agent` inside the
 * node namespace exactly as the compiled binary would run (tests/_enim.ts), and
 * runs the plugin there as a container runtime does: CNI_* env, config on stdin.
 *
 * @module
 */
import { enimCommandLine, runEnim, type RunEnimResult } from "./_enim.ts";
import { SimulatedVpc, type SimulatedVpcOptions } from "./vpc.ts";
import { SocketAgentClient } from "../manager/client.ts";
import { uniqueName } from "../netns/sim.ts";

/** Options for {@linkcode SimulatedNode.start}. */
export interface SimulatedNodeOptions {
  subnets?: SimulatedVpcOptions["subnets"];
  /** Mock provider settings (merged over the defaults derived from the subnets). */
  mock?: Record<string, unknown>;
  /** Provider name and settings, replacing the mock. */
  provider?: { name: string; settings: Record<string, unknown> };
  gc?: { intervalSeconds?: number; graceSeconds?: number };
  logLevel?: "debug" | "info" | "warn" | "error";
  /** Extra agent config fields. */
  extra?: Record<string, unknown>;
  /** Start the agent right away (default true). */
  startAgent?: boolean;
}

/** What a CNI call needs besides the verb. */
export interface CniCall {
  containerId?: string;
  ifName?: string;
  netns?: string;
  args?: string;
  /** The network config (an object is serialised). */
  config: Record<string, unknown> | string;
  /** Extra env for the plugin. */
  env?: Record<string, string>;
}

/** A CNI call's outcome with stdout parsed. */
export interface CniOutcome extends RunEnimResult {
  json: Record<string, unknown> | null;
}

/** A simulated node (VPC + node namespace) with an agent on the mock provider. */
export class SimulatedNode implements AsyncDisposable {
  readonly vpc: SimulatedVpc;
  /** The node's private directory under /run/enim. */
  readonly dir: string;
  readonly socket: string;
  readonly configPath: string;
  readonly logPath: string;
  readonly client: SocketAgentClient;
  #agent: Deno.ChildProcess | null = null;
  #logFile: Deno.FsFile | null = null;
  #closed = false;

  private constructor(vpc: SimulatedVpc, dir: string) {
    this.vpc = vpc;
    this.dir = dir;
    this.socket = `${dir}/enim.sock`;
    this.configPath = `${dir}/agent.jsonc`;
    this.logPath = `${dir}/agent.log`;
    this.client = new SocketAgentClient(this.socket, 30_000);
  }

  /** Builds the VPC, writes the agent config and (by default) starts the agent. */
  static async start(opts: SimulatedNodeOptions = {}): Promise<SimulatedNode> {
    const vpc = await SimulatedVpc.create({ subnets: opts.subnets });
    const dir = `/run/enim/${uniqueName("t")}`;
    const node = new SimulatedNode(vpc, dir);
    try {
      await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
      const subnets: Record<string, unknown> = {};
      const v4 = vpc.gateways.ipv4, v6 = vpc.gateways.ipv6;
      const want = opts.subnets ?? { ipv4: "10.99.0.0/24", ipv6: "fd00:99::/64" };
      if (v4 && want.ipv4) subnets.ipv4 = { cidr: want.ipv4, gateway: v4 };
      if (v6 && want.ipv6) subnets.ipv6 = { cidr: want.ipv6, gateway: v6 };
      const provider = opts.provider ?? {
        name: "mock",
        settings: { enis: 8, subnets, ...opts.mock },
      };
      const config = {
        socket: node.socket,
        statePath: `${dir}/enim.db`,
        provider: { name: provider.name, [provider.name]: provider.settings },
        devices: "ip",
        deviceSimulator: { vpcNetns: vpc.vpc.name, bridge: vpc.bridge },
        gc: { intervalSeconds: 3600, graceSeconds: 30, ...opts.gc },
        log: { level: opts.logLevel ?? "info" },
        ...opts.extra,
      };
      await Deno.writeTextFile(node.configPath, JSON.stringify(config, null, 2));
      if (opts.startAgent !== false) await node.startAgent();
    } catch (err) {
      await node.close().catch(() => {});
      throw err;
    }
    return node;
  }

  /** The running agent's PID, or null. */
  get agentPid(): number | null {
    return this.#agent?.pid ?? null;
  }

  /** Starts the agent in the node namespace and waits until it answers. */
  async startAgent(extraArgs: string[] = []): Promise<void> {
    if (this.#agent) throw new Error("The agent is already running");
    this.#logFile = await Deno.open(this.logPath, { append: true, create: true });
    const [cmd, ...args] = enimCommandLine(
      ["agent", "--config", this.configPath, ...extraArgs],
      this.vpc.node.name,
    );
    this.#agent = new Deno.Command(cmd, {
      args,
      clearEnv: true,
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    this.#agent.stderr.pipeTo(this.#logFile.writable).catch(() => {});
    this.#logFile = null; // the pipe owns and closes it
    const deadline = Date.now() + 20_000;
    for (;;) {
      try {
        await this.client.status();
        return;
      } catch (err) {
        if (Date.now() > deadline) {
          await this.stopAgent("SIGKILL");
          throw new Error(
            `The agent did not answer within 20 s; its log:\n${await this.agentLog()}`,
            { cause: err },
          );
        }
        const exited = await Promise.race([
          this.#agent!.status.then(() => true),
          new Promise<false>((r) => setTimeout(() => r(false), 50)),
        ]);
        if (exited) {
          const log = await this.agentLog();
          this.#agent = null;
          throw new Error(`The agent exited at start-up; its log:\n${log}`);
        }
      }
    }
  }

  /** Stops the agent (SIGTERM by default, SIGKILL for crash tests) and waits for it. */
  async stopAgent(signal: Deno.Signal = "SIGTERM"): Promise<Deno.CommandStatus | null> {
    const agent = this.#agent;
    if (!agent) return null;
    this.#agent = null;
    try {
      agent.kill(signal);
    } catch { /* already gone */ }
    const timer = setTimeout(() => {
      try {
        agent.kill("SIGKILL");
      } catch { /* gone */ }
    }, 10_000);
    try {
      return await agent.status;
    } finally {
      clearTimeout(timer);
    }
  }

  /** The agent's log so far. */
  async agentLog(): Promise<string> {
    try {
      return await Deno.readTextFile(this.logPath);
    } catch {
      return "";
    }
  }

  /** Runs the plugin in the node namespace as a runtime would. */
  async cni(command: string, call: CniCall): Promise<CniOutcome> {
    const env: Record<string, string> = {
      CNI_COMMAND: command,
      CNI_PATH: "/opt/cni/bin",
      ENIM_LOG_FILE: `${this.dir}/cni.log`,
      ...call.env,
    };
    if (call.containerId !== undefined) env.CNI_CONTAINERID = call.containerId;
    if (call.ifName !== undefined) env.CNI_IFNAME = call.ifName;
    if (call.netns !== undefined) env.CNI_NETNS = call.netns;
    if (call.args !== undefined) env.CNI_ARGS = call.args;
    const stdin = typeof call.config === "string" ? call.config : JSON.stringify(call.config);
    const res = await runEnim([], { env, stdin, netns: this.vpc.node.name });
    let json: Record<string, unknown> | null = null;
    try {
      json = res.stdout.trim() ? JSON.parse(res.stdout) : null;
    } catch { /* left null: the test asserts on stdout */ }
    return { ...res, json };
  }

  /** A network config for this node: interface mode unless `ipam` is set. */
  netconf(
    cniVersion = "1.1.0",
    extra: Record<string, unknown> = {},
  ): Record<string, unknown> {
    return { cniVersion, name: "enim-test", type: "enim", agentSocket: this.socket, ...extra };
  }

  /** Runs an operator command (`status`, `gc`) in the node namespace. */
  enim(args: string[]): Promise<RunEnimResult> {
    return runEnim([...args, "--socket", this.socket], { netns: this.vpc.node.name });
  }

  /** Stops the agent and removes every namespace and file; idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const errors: unknown[] = [];
    try {
      await this.stopAgent();
    } catch (err) {
      errors.push(err);
    }
    try {
      await this.vpc.close();
    } catch (err) {
      errors.push(err);
    }
    try {
      await Deno.remove(this.dir, { recursive: true });
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) errors.push(err);
    }
    if (errors.length > 0) throw new AggregateError(errors, "Cannot tear the simulated node down");
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
