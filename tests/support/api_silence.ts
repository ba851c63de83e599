/**
 * A silent watch, made by the kernel: the agent's open connections to the Kubernetes API
 * server (to the {@linkcode KubeBridge}'s relay at 127.0.0.1 of the node's namespace) lose
 * every packet, both ways, from now on, with no FIN and no RST: a half-open path, as a
 * load balancer's failover or a NAT's timeout leaves one. New connections pass. It is an
 * nftables table of the node's namespace (`inet chaos_silence`), matching the connections
 * open now by their ports (`ss`), so nothing of enim or of the test's relays changes;
 * lifting it lets a connection the agent still holds carry on where it stopped (TCP sends
 * what was lost again), as a network that heals does.
 *
 * @module
 */
import * as z from "zod/mini";
import { parse } from "yaml";
import type { SimulatedNode } from "./node.ts";
import { type AptNeed, aptNeeds } from "../../scripts/_deps.ts";

/** What silencing needs from Debian: `ss` (the connections open), `nft` (the drop). */
export const SILENCE_NEEDS: AptNeed[] = aptNeeds("iproute2", "nftables");

const TABLE = "inet chaos_silence";

const KubeconfigSchema = z.looseObject({
  clusters: z.array(z.looseObject({
    cluster: z.looseObject({ server: z.string().check(z.url()) }),
  })).check(z.minLength(1)),
});

/** The port the node's agent reaches the API server at (its kubeconfig's server). */
export async function apiPortOf(node: SimulatedNode): Promise<number> {
  const text = await Deno.readTextFile(node.sandbox.host("kubeconfig"));
  const cfg = KubeconfigSchema.parse(parse(text));
  const port = Number(new URL(cfg.clusters[0].cluster.server).port);
  if (!Number.isInteger(port) || port <= 0) {
    throw new Error(`The node's kubeconfig names no port: "${cfg.clusters[0].cluster.server}"`);
  }
  return port;
}

/** The local ports of the established TCP connections to 127.0.0.1:`port` in `netns`. */
async function clientPorts(node: SimulatedNode, port: number): Promise<number[]> {
  const out = await node.vpc.exec(node.vpc.node, [
    "/bin/ss",
    "-tnH",
    "state",
    "established",
    "dst",
    `127.0.0.1:${port}`,
  ]);
  if (out.code !== 0) throw new Error(`Cannot list the node's connections: ${out.stderr}`);
  const ports = new Set<number>();
  for (const line of out.stdout.split("\n")) {
    // Recv-Q Send-Q Local:Port Peer:Port (state given: no State column).
    const local = line.trim().split(/\s+/)[2];
    const m = local ? /:(\d+)$/.exec(local) : null;
    if (m) ports.add(Number(m[1]));
  }
  return [...ports].sort((a, b) => a - b);
}

async function nft(node: SimulatedNode, text: string): Promise<void> {
  const out = await node.vpc.exec(node.vpc.node, [
    "/bin/sh",
    "-c",
    'printf %s "$1" | /usr/sbin/nft -f -',
    "sh",
    text,
  ]);
  if (out.code !== 0) throw new Error(`nft failed in the node's namespace: ${out.stderr}\n${text}`);
}

/** The silence of one node's API connections; {@linkcode lift} ends it. */
export interface ApiSilence {
  /** The agent's connections that went silent (their local ports). */
  readonly ports: number[];
  /** Removes the table: the silenced connections carry packets again. */
  lift(): Promise<void>;
}

/**
 * Silences every connection the node's agent holds open to the API server now (none
 * open: nothing is silenced, `ports` is empty). One silence at a time per node.
 */
export async function silenceApi(node: SimulatedNode): Promise<ApiSilence> {
  const port = await apiPortOf(node);
  const ports = await clientPorts(node, port);
  const elements = ports.length ? `elements = { ${ports.join(", ")} }` : "";
  await nft(
    node,
    [
      `table ${TABLE} {}`,
      `delete table ${TABLE}`,
      `table ${TABLE} {`,
      `\tset agent { type inet_service; ${elements} }`,
      "\tchain out {",
      "\t\ttype filter hook output priority -300; policy accept;",
      `\t\ttcp dport ${port} tcp sport @agent drop`,
      `\t\ttcp sport ${port} tcp dport @agent drop`,
      "\t}",
      "}",
      "",
    ].join("\n"),
  );
  let lifted = false;
  return {
    ports,
    async lift() {
      if (lifted) return;
      lifted = true;
      await nft(node, `table ${TABLE} {}\ndelete table ${TABLE}\n`);
    },
  };
}
