/**
 * Host links' node ends as the tests look for them on the node (the links of the
 * host-link group) and plant them (one no agent recorded).
 *
 * @module
 */
import { HOST_LINK_GROUP } from "../../netns/host_link.ts";
import type { SimulatedVpc } from "./vpc.ts";

const IP = "/usr/sbin/ip";

/** The names of the host links' node ends in `vpc`'s node namespace. */
export async function nodeEnds(vpc: SimulatedVpc): Promise<string[]> {
  const out = await vpc.exec(vpc.node, [
    IP,
    "-o",
    "link",
    "show",
    "group",
    String(HOST_LINK_GROUP),
  ]);
  return out.stdout.split("\n").filter((l) => l.trim()).map((l) =>
    l.split(":")[1].trim().split("@")[0]
  );
}

/**
 * The `ip` arguments that add a node end no agent recorded: a veth `name` in the
 * host-link group, its peer `peer` beside it.
 */
export function strayNodeEndArgs(name: string, peer: string): string[] {
  return [
    "link",
    "add",
    name,
    "group",
    String(HOST_LINK_GROUP),
    "type",
    "veth",
    "peer",
    "name",
    peer,
  ];
}
