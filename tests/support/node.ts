/**
 * A simulated node with a running agent: the harness of the end-to-end tests,
 * the demo and the bench.
 *
 * It builds a {@linkcode SimulatedVpc} and an {@linkcode EnimSandbox} joined to
 * the node namespace (a private /run/enim, so enim runs with the production
 * permission set and default paths: socket /run/enim/enim.sock), starts
 * `enim agent` there exactly as the compiled binary would run (tests/support/enim.ts),
 * and runs the plugin there as a container runtime does: CNI_* env, config on stdin.
 *
 * @module
 */
import { runEnim, type RunEnimResult } from "./enim.ts";
import { type AgentProcess, spawnAgent } from "./agent_proc.ts";
import { EnimSandbox } from "./sandbox.ts";
import {
  gatewayOf,
  type NetnsHandle,
  SimulatedVpc,
  type SimulatedVpcOptions,
  type VpcHost,
  type VpcHostOptions,
} from "./vpc.ts";
import * as z from "zod/mini";
import { SocketAgentClient } from "../../api/client.ts";

/** Options for {@linkcode SimulatedNode.start}. */
export interface SimulatedNodeOptions {
  /**
   * The default profile's subnets (and the VPC's, unless the node joins another's VPC:
   * then they get their gateways on the shared bridge). Default 10.99.0.0/24, fd00:99::/64.
   */
  subnets?: SimulatedVpcOptions["subnets"];
  /** Mock provider settings (merged over the defaults derived from the subnets). */
  mock?: Record<string, unknown>;
  /** Provider name and settings, replacing the mock. */
  provider?: { name: string; settings: Record<string, unknown> };
  gc?: { intervalSeconds?: number; graceSeconds?: number };
  logLevel?: "debug" | "info" | "warn" | "error";
  /** Extra agent config fields. */
  extra?: Record<string, unknown>;
  /**
   * Give the agent the veth device simulator (default true). Turn it off when
   * something else plugs the ENI devices, as the fake BCE server does.
   */
  deviceSimulator?: boolean;
  /** Start the agent right away (default true). */
  startAgent?: boolean;
  /**
   * Another node of this node's VPC (two agents, one simulated cloud): its own
   * node namespace and sandbox, the same VPC namespace, bridge and subnets.
   */
  joinVpc?: SimulatedVpc;
  /**
   * Named profiles of the mock provider: each profile's subnets become subnets of the
   * VPC (gateway on the bridge) and the rest is the profile's mock settings.
   */
  profiles?: Record<
    string,
    { subnets: { ipv4?: string; ipv6?: string } } & Record<string, unknown>
  >;
  /** More subnets of the VPC, outside every profile (gateways on the bridge): other machines'. */
  extraSubnets?: string[];
  /**
   * Give the node its own NIC on the VPC (the 250th address of each subnet; 249th, … on
   * nodes that joined) and turn forwarding on, as on a Kubernetes node
   * (`SimulatedVpc.nodeNic`); before the agent starts. An object gives the NIC's port
   * security groups.
   */
  nodeNic?: boolean | VpcHostOptions;
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

/** A successful ADD's result as the plugin printed it, in any spec version. */
export const AddResultSchema = z.looseObject({
  cniVersion: z.string(),
  interfaces: z.array(z.object({
    name: z.string(),
    mac: z.string(),
    sandbox: z.optional(z.string()),
  })),
  ips: z.array(z.object({
    address: z.string(),
    gateway: z.optional(z.string()),
    interface: z.optional(z.number()),
    /** 0.x results only. */
    version: z.optional(z.enum(["4", "6"])),
  })),
  routes: z._default(z.array(z.object({ dst: z.string(), gw: z.optional(z.string()) })), []),
});
/** A successful ADD's result. */
export type AddResult = z.infer<typeof AddResultSchema>;

/** What {@linkcode SimulatedNode.add} and `del` take besides the pod. */
export interface PodCall {
  /** Default `c-<pod name>`. */
  containerId?: string;
  /** Default `eth0`. */
  ifName?: string;
  /** CNI_ARGS; default the pod as `default/<pod name>`. */
  args?: string;
  /** The network config; default {@linkcode SimulatedNode.netconf} of `version`. */
  config?: Record<string, unknown>;
  /** The spec version of the default config (default 1.1.0). */
  version?: string;
}

/** A simulated node (VPC + node namespace) with an agent on the mock provider. */
export class SimulatedNode implements AsyncDisposable {
  readonly vpc: SimulatedVpc;
  /** The node's private /run/enim. */
  readonly sandbox: EnimSandbox;
  /** The API socket as the test process sees it. */
  readonly socket: string;
  /** The agent's log file as the test process sees it. */
  readonly logPath: string;
  readonly client: SocketAgentClient;
  /** The node's own NIC, when started with `nodeNic`. */
  nic: VpcHost | null = null;
  #agent: AgentProcess | null = null;
  #closed = false;

  private constructor(vpc: SimulatedVpc, sandbox: EnimSandbox) {
    this.vpc = vpc;
    this.sandbox = sandbox;
    this.socket = sandbox.host("enim.sock");
    this.logPath = sandbox.host("agent.log");
    this.client = new SocketAgentClient(this.socket, 30_000);
  }

  /** Builds the VPC, writes the agent config and (by default) starts the agent. */
  static async start(opts: SimulatedNodeOptions = {}): Promise<SimulatedNode> {
    const profileSubnets = Object.values(opts.profiles ?? {}).flatMap((p) =>
      [p.subnets.ipv4, p.subnets.ipv6].filter((s): s is string => s !== undefined)
    );
    // A node that joins gives its own subnets their gateways on the shared bridge.
    const ownSubnets = opts.joinVpc
      ? [opts.subnets?.ipv4, opts.subnets?.ipv6].filter((c): c is string => c !== undefined)
      : [];
    const vpc = opts.joinVpc
      ? await SimulatedVpc.join(opts.joinVpc, {
        extraSubnets: [...ownSubnets, ...profileSubnets, ...(opts.extraSubnets ?? [])],
      })
      : await SimulatedVpc.create({
        subnets: opts.subnets,
        extraSubnets: [...profileSubnets, ...(opts.extraSubnets ?? [])],
      });
    let sandbox: EnimSandbox;
    try {
      sandbox = await EnimSandbox.create(vpc.node.path);
    } catch (err) {
      await vpc.close().catch(() => {});
      throw err;
    }
    const node = new SimulatedNode(vpc, sandbox);
    try {
      if (opts.nodeNic) {
        node.nic = await vpc.nodeNic(opts.nodeNic === true ? {} : opts.nodeNic);
      }
      const subnets: Record<string, unknown> = {};
      const v4 = vpc.gateways.ipv4, v6 = vpc.gateways.ipv6;
      const want = opts.subnets ?? { ipv4: "10.99.0.0/24", ipv6: "fd00:99::/64" };
      // The VPC's own subnets, or (a node that joined) the subnets of its own it was given.
      if (want.ipv4 && (v4 || opts.subnets?.ipv4 && opts.joinVpc)) {
        subnets.ipv4 = { cidr: want.ipv4, gateway: gatewayOf(want.ipv4) };
      }
      if (want.ipv6 && (v6 || opts.subnets?.ipv6 && opts.joinVpc)) {
        subnets.ipv6 = { cidr: want.ipv6, gateway: gatewayOf(want.ipv6) };
      }
      const profiles = Object.fromEntries(
        Object.entries(opts.profiles ?? {}).map(([name, p]) => [name, {
          ...p,
          subnets: Object.fromEntries(
            Object.entries(p.subnets).filter(([, c]) => c !== undefined).map((
              [fam, cidr],
            ) => [fam, { cidr, gateway: gatewayOf(cidr!) }]),
          ),
        }]),
      );
      const provider = opts.provider ?? {
        name: "mock",
        settings: { enis: 8, subnets, ...(opts.profiles ? { profiles } : {}), ...opts.mock },
      };
      const config = {
        statePath: sandbox.inner("enim.db"),
        provider: { name: provider.name, [provider.name]: provider.settings },
        devices: "ip",
        ...(opts.deviceSimulator === false
          ? {}
          : { deviceSimulator: { vpcNetns: vpc.vpc.name, bridge: vpc.bridge } }),
        gc: { intervalSeconds: 3600, graceSeconds: 30, ...opts.gc },
        log: { level: opts.logLevel ?? "info", file: sandbox.inner("agent.log") },
        ...opts.extra,
      };
      await Deno.writeTextFile(sandbox.host("agent.jsonc"), JSON.stringify(config, null, 2));
      if (opts.startAgent !== false) await node.startAgent();
    } catch (err) {
      await node.close().catch(() => {});
      throw err;
    }
    return node;
  }

  /** Edits the agent's config file (before {@linkcode startAgent}: settings known only later). */
  async editConfig(edit: (config: Record<string, unknown>) => void): Promise<void> {
    const path = this.sandbox.host("agent.jsonc");
    const config = JSON.parse(await Deno.readTextFile(path));
    edit(config);
    await Deno.writeTextFile(path, JSON.stringify(config, null, 2));
  }

  /** The running agent's PID, or null. */
  get agentPid(): number | null {
    return this.#agent?.pid ?? null;
  }

  /**
   * The argv prefix of the build this node runs (agent, plugin, commands): another
   * release's (`tests/support/releases.ts`) for the upgrade tests; default this tree's.
   * The plugin may be set apart ({@linkcode pluginArgv}), as the init container replaces
   * it before the agent restarts.
   */
  agentArgv: string[] | undefined = undefined;
  /** The argv prefix of the plugin the runtime execs (default {@linkcode agentArgv}'s). */
  pluginArgv: string[] | undefined = undefined;

  /** Starts the agent in the node namespace and waits until it answers. */
  async startAgent(extraArgs: string[] = []): Promise<void> {
    if (this.#agent) throw new Error("The agent is already running");
    // The agent logs to agent.log (config); anything else on its stderr goes beside it.
    this.#agent = await spawnAgent(this.sandbox, {
      socket: this.socket,
      args: extraArgs,
      stderrFile: this.sandbox.host("agent.stderr"),
      enim: this.agentArgv,
    }).catch(async (err) => {
      throw new Error(`${err.message}\nits log:\n${await this.agentLog()}`, { cause: err });
    });
  }

  /** Stops the agent (SIGTERM by default, SIGKILL for crash tests) and waits for it. */
  async stopAgent(signal: Deno.Signal = "SIGTERM"): Promise<Deno.CommandStatus | null> {
    const agent = this.#agent;
    if (!agent) return null;
    this.#agent = null;
    return await agent.stop(signal);
  }

  /** The agent's log so far. */
  async agentLog(): Promise<string> {
    const read = (p: string) => Deno.readTextFile(p).catch(() => "");
    return (await read(this.logPath)) + (await read(this.sandbox.host("agent.stderr")));
  }

  /** Runs the plugin in the node namespace as a runtime would. */
  async cni(command: string, call: CniCall): Promise<CniOutcome> {
    const env: Record<string, string> = {
      CNI_COMMAND: command,
      CNI_PATH: "/opt/cni/bin",
      ENIM_LOG_FILE: this.sandbox.inner("cni.log"),
      ...call.env,
    };
    if (call.containerId !== undefined) env.CNI_CONTAINERID = call.containerId;
    if (call.ifName !== undefined) env.CNI_IFNAME = call.ifName;
    if (call.netns !== undefined) env.CNI_NETNS = call.netns;
    if (call.args !== undefined) env.CNI_ARGS = call.args;
    const stdin = typeof call.config === "string" ? call.config : JSON.stringify(call.config);
    const res = await runEnim([], {
      env,
      stdin,
      sandbox: this.sandbox,
      argv: this.pluginArgv ?? this.agentArgv,
    });
    let json: Record<string, unknown> | null = null;
    try {
      json = res.stdout.trim() ? JSON.parse(res.stdout) : null;
    } catch { /* left null: the test asserts on stdout */ }
    return { ...res, json };
  }

  /** The CNI call for `pod` with the defaults of {@linkcode PodCall}. */
  podCall(pod: NetnsHandle, o: PodCall = {}): CniCall {
    const short = pod.name.split("-").at(-1)!;
    return {
      containerId: o.containerId ?? `c-${short}`,
      ifName: o.ifName ?? "eth0",
      netns: pod.path,
      args: o.args ?? `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${short};IgnoreUnknown=1`,
      config: o.config ?? this.netconf(o.version),
    };
  }

  /** ADD through the plugin; fails the test unless it succeeded; the result parsed. */
  async add(pod: NetnsHandle, o: PodCall = {}): Promise<AddResult> {
    const r = await this.cni("ADD", this.podCall(pod, o));
    if (r.code !== 0 || !r.json) {
      throw new Error(`ADD for ${pod.name} failed (exit ${r.code}): ${r.stdout}${r.stderr}`);
    }
    return AddResultSchema.parse(r.json);
  }

  /** DEL through the plugin; fails the test unless it succeeded. */
  async del(pod: NetnsHandle, o: PodCall = {}): Promise<void> {
    const r = await this.cni("DEL", this.podCall(pod, o));
    if (r.code !== 0) {
      throw new Error(`DEL for ${pod.name} failed (exit ${r.code}): ${r.stdout}${r.stderr}`);
    }
  }

  /** A network config for this node: interface mode unless `ipam` is set. */
  netconf(
    cniVersion = "1.1.0",
    extra: Record<string, unknown> = {},
  ): Record<string, unknown> {
    return { cniVersion, name: "enim-test", type: "enim", ...extra };
  }

  /** Runs an operator command (`status`, `gc`) in the node namespace. */
  enim(args: string[]): Promise<RunEnimResult> {
    return runEnim(args, { sandbox: this.sandbox, argv: this.agentArgv });
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
      await this.sandbox.close();
    } catch (err) {
      errors.push(err);
    }
    if (errors.length > 0) throw new AggregateError(errors, "Cannot tear the simulated node down");
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
