/**
 * The shipped agent (the built bundle, the production permission set, in an
 * {@linkcode EnimSandbox}: its private /run/enim) against a real control plane, as a
 * DaemonSet pod would run it: authenticated as the ServiceAccount of
 * deploy/kubernetes/rbac.yaml with a TokenRequest token the test rotates in a projected
 * volume's folder (`/run/enim/serviceaccount/token`), through a YAML kubeconfig with
 * `tokenFile`, NetworkPolicy on, the fake device layer and the mock provider (nothing on
 * the machine is touched). The API server is reached through a {@linkcode TcpRelay} the
 * test controls.
 *
 * @module
 */
import { EnimSandbox } from "../sandbox.ts";
import { type AgentProcess, fakeDevicesConfig, startAgent } from "../agent_proc.ts";
import { SocketAgentClient } from "../../../api/client.ts";
import type { PolicyStatus, Status } from "../../../api/schema.ts";
import type { KubeCluster } from "./cluster.ts";
import { TcpRelay } from "../tcp_relay.ts";
import { ProjectedToken } from "./token.ts";
import { AGENT_SERVICE_ACCOUNT } from "./policy_api.ts";

/** Options of {@linkcode ClusterAgent.start}. */
export interface ClusterAgentOptions {
  /** The node the agent runs on (its Node should be registered). */
  nodeName: string;
  /** `kubernetes.watchTimeoutSeconds` (default 10: watches end every 10–20 s). */
  watchTimeoutSeconds?: number;
  /** More top-level agent config keys. */
  extra?: Record<string, unknown>;
}

/** A running agent of the cluster. */
export class ClusterAgent implements AsyncDisposable {
  readonly sandbox: EnimSandbox;
  readonly relay: TcpRelay;
  readonly token: ProjectedToken;
  readonly client: SocketAgentClient;
  readonly nodeName: string;
  #proc: AgentProcess | null;

  private constructor(
    sandbox: EnimSandbox,
    relay: TcpRelay,
    token: ProjectedToken,
    proc: AgentProcess,
    nodeName: string,
  ) {
    this.sandbox = sandbox;
    this.relay = relay;
    this.token = token;
    this.#proc = proc;
    this.nodeName = nodeName;
    this.client = new SocketAgentClient(proc.socket, 30_000);
  }

  /** Writes its token and kubeconfig, starts the agent and waits until its API answers. */
  static async start(cluster: KubeCluster, o: ClusterAgentOptions): Promise<ClusterAgent> {
    const sb = await EnimSandbox.create(null);
    const relay = TcpRelay.start(cluster.apiPort);
    try {
      const token = await ProjectedToken.create(
        cluster,
        sb.host("serviceaccount"),
        AGENT_SERVICE_ACCOUNT.namespace,
        AGENT_SERVICE_ACCOUNT.name,
      );
      await Deno.writeTextFile(
        sb.host("kubeconfig"),
        cluster.kubeconfig(
          { tokenFile: sb.inner("serviceaccount/token") },
          `https://127.0.0.1:${relay.port}`,
        ),
      );
      const config = fakeDevicesConfig(sb.inner(), { enis: 4 }, {
        kubernetes: {
          kubeconfig: sb.inner("kubeconfig"),
          nodeName: o.nodeName,
          watchTimeoutSeconds: o.watchTimeoutSeconds ?? 10,
        },
        networkPolicy: { enabled: true, syncWaitSeconds: 5 },
        log: { level: "info", file: sb.inner("agent.log") },
        ...o.extra,
      });
      const proc = await startAgent(sb, config, 60_000);
      return new ClusterAgent(sb, relay, token, proc, o.nodeName);
    } catch (err) {
      const log = await Deno.readTextFile(sb.host("agent.log")).catch(() => "");
      await relay.close();
      await sb.close();
      throw new Error(`${err instanceof Error ? err.message : err}\nagent.log:\n${log}`, {
        cause: err,
      });
    }
  }

  /** The agent's status. */
  status(): Promise<Status> {
    return this.client.status();
  }

  /** The NetworkPolicy part of the status (the agent runs with it on). */
  async policy(): Promise<PolicyStatus> {
    const s = await this.status();
    if (!s.policy) throw new Error("The agent's status has no policy section");
    return s.policy;
  }

  /** The agent's log so far (its log file, then its stderr). */
  async log(): Promise<string> {
    const log = await Deno.readTextFile(this.sandbox.host("agent.log")).catch(() => "");
    return log + (this.#proc?.stderr() ?? "");
  }

  /** Stops the agent, the relay and the sandbox. */
  async close(): Promise<void> {
    const p = this.#proc;
    this.#proc = null;
    await p?.stop().catch(() => {});
    await this.relay.close().catch(() => {});
    await this.sandbox.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
