/**
 * Calls that are wrong whatever the agent says (issue 23 point 3): each must get
 * its own CNI code and the same message from the plugin process with the agent
 * down as from the agent (`specProblem` in `cni/spec.ts`). One table for the
 * in-process test (`cni/forward_test.ts`) and the real plugin's
 * (`tests/cni_edges_test.ts`).
 *
 * @module
 */

/** One wrong call: a verb, what is changed from a good call, and the code it must get. */
export interface SpecCase {
  /** What is wrong, for the test's name. */
  what: string;
  verb: string;
  /** Variables set over the good call's (`undefined` unsets one). */
  env?: Record<string, string | undefined>;
  /** Fields set over the good config's (`undefined` removes one); a string replaces stdin. */
  config?: Record<string, unknown> | string;
  /** The CNI code both sides answer. */
  code: number;
}

/** The wrong calls, one fault each. */
export const SPEC_CASES: readonly SpecCase[] = [
  { what: "an unsupported cniVersion", verb: "ADD", config: { cniVersion: "9.9.9" }, code: 1 },
  { what: "a cniVersion that is not a version", verb: "DEL", config: { cniVersion: "" }, code: 1 },
  { what: "a missing cniVersion", verb: "ADD", config: { cniVersion: undefined }, code: 7 },
  { what: "a missing name", verb: "ADD", config: { name: undefined }, code: 7 },
  { what: "a name of the wrong form", verb: "ADD", config: { name: "-bad name" }, code: 7 },
  {
    what: "a CNI_CONTAINERID of the wrong form",
    verb: "ADD",
    env: { CNI_CONTAINERID: "-a b" },
    code: 4,
  },
  {
    what: "a CNI_IFNAME of the wrong form",
    verb: "ADD",
    env: { CNI_IFNAME: "eth0/x:toolong" },
    code: 4,
  },
  { what: "a relative CNI_NETNS", verb: "ADD", env: { CNI_NETNS: "run/netns/p" }, code: 4 },
  { what: "a missing CNI_CONTAINERID", verb: "DEL", env: { CNI_CONTAINERID: undefined }, code: 4 },
  { what: "an unknown CNI_COMMAND", verb: "NOPE", code: 4 },
  { what: "a stdin that is no JSON object", verb: "ADD", config: "[]", code: 6 },
  { what: "CHECK below 0.4.0", verb: "CHECK", config: { cniVersion: "0.3.1" }, code: 1 },
  { what: "GC below 1.1.0", verb: "GC", config: { cniVersion: "1.0.0" }, code: 1 },
  { what: "STATUS below 1.1.0", verb: "STATUS", config: { cniVersion: "0.4.0" }, code: 1 },
  {
    what: "a config whose type and ipam.type are not enim",
    verb: "ADD",
    config: { type: "bridge", ipam: { type: "host-local" } },
    code: 7,
  },
  { what: "a config with no type at all", verb: "ADD", config: { type: undefined }, code: 7 },
  { what: "a DEL whose config is not enim's", verb: "DEL", config: { type: "ptp" }, code: 7 },
  {
    what: "an ipam of another type under enim as the interface plugin",
    verb: "ADD",
    config: { ipam: { type: "dhcp" } },
    code: 2,
  },
  // Issue 33 item 14: these reached the agent, or got 11 with the agent down.
  {
    what: "a GC without cni.dev/valid-attachments",
    verb: "GC",
    config: { cniVersion: "1.1.0" },
    code: 7,
  },
  {
    what: "an ADD whose CNI_ARGS is not KEY=VALUE pairs",
    verb: "ADD",
    env: { CNI_ARGS: "K8S_POD_NAMESPACE=a;K8S_POD_NAME" },
    code: 4,
  },
  {
    what: "a CHECK whose CNI_ARGS has an unknown key",
    verb: "CHECK",
    env: { CNI_ARGS: "K8S_POD_NAME=b;NOPE=1" },
    code: 4,
  },
  {
    what: "an ADD whose IgnoreUnknown is not a boolean",
    verb: "ADD",
    env: { CNI_ARGS: "IgnoreUnknown=yes" },
    code: 4,
  },
  {
    what: "a CNI_ARGS longer than the agent's API carries",
    verb: "ADD",
    env: { CNI_ARGS: `IgnoreUnknown=1;X=${"a".repeat(100_000)}` },
    code: 4,
  },
  {
    what: "a stdin longer than the agent's API carries",
    verb: "ADD",
    config: { pad: "x".repeat(4 * 1024 * 1024) },
    code: 7,
  },
];

/** What a good call carries: an attachment's variables and a config enim serves. */
export interface GoodCall {
  containerId: string;
  ifName: string;
  netns: string;
  args: string;
  config: Record<string, unknown>;
}

/** The environment (CNI_* only) and stdin of `c`, built over `good`. */
export function specCall(
  c: SpecCase,
  good: GoodCall,
): { env: Record<string, string>; stdin: string } {
  const attachment = ["ADD", "DEL", "CHECK", "NOPE"].includes(c.verb);
  const env: Record<string, string | undefined> = {
    CNI_COMMAND: c.verb,
    CNI_PATH: "/opt/cni/bin",
    ...(attachment
      ? {
        CNI_CONTAINERID: good.containerId,
        CNI_IFNAME: good.ifName,
        CNI_NETNS: good.netns,
        CNI_ARGS: good.args,
      }
      : {}),
    ...c.env,
  };
  const stdin = typeof c.config === "string"
    ? c.config
    : JSON.stringify({ ...good.config, ...c.config });
  const set: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined) set[k] = v;
  return { env: set, stdin };
}
