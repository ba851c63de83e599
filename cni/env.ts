/**
 * The CNI_* environment: which variables each verb needs (SPEC.md, section 2)
 * and their validation. Every bad variable is named in one code-4 error.
 *
 * | verb    | required                                     | optional                |
 * | ------- | -------------------------------------------- | ----------------------- |
 * | ADD     | CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME       | CNI_ARGS, CNI_PATH      |
 * | DEL     | CNI_CONTAINERID, CNI_IFNAME                  | CNI_NETNS, CNI_ARGS, CNI_PATH |
 * | CHECK   | CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME       | CNI_ARGS, CNI_PATH      |
 * | GC      | CNI_PATH                                     |                         |
 * | STATUS  |                                              | CNI_PATH                |
 * | VERSION |                                              |                         |
 *
 * An empty variable counts as unset (runtimes pass `CNI_NETNS=` on a DEL whose
 * namespace is gone). Variables a verb does not use are not validated. The rules
 * and messages are `cni/spec.ts`'s ({@linkcode envProblem}), which the plugin
 * process applies too when the agent is down.
 *
 * @module
 */
import type { CniEnvName } from "../api/wire.ts";
import { CNI_CODES, CniError } from "./errors.ts";
import { CNI_VERBS, type CniVerb, envProblem, USED_ENV, verbProblem } from "./spec.ts";

/** The validated CNI environment. Absent values are `undefined`. */
export interface CniEnv {
  command: CniVerb;
  containerId?: string;
  netns?: string;
  ifName?: string;
  /** Raw `CNI_ARGS` (parsed by `args.ts`); `""` when unset. */
  args: string;
  path?: string;
}

/** Reads a variable, treating an empty string as unset. */
function get(env: Record<string, string | undefined>, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v === "" ? undefined : v;
}

/**
 * Validates the CNI environment for its verb.
 *
 * @throws {CniError} code 4 naming every missing or invalid variable
 */
export function parseCniEnv(env: Record<string, string | undefined>): CniEnv {
  const rawCommand = get(env, "CNI_COMMAND");
  const command = CNI_VERBS.find((v) => v === rawCommand);
  if (command === undefined) {
    throw new CniError(CNI_CODES.INVALID_ENV, verbProblem(rawCommand)!);
  }
  const problem = envProblem(command, env);
  if (problem) throw new CniError(CNI_CODES.INVALID_ENV, problem);
  const read = (name: CniEnvName) => USED_ENV[command].includes(name) ? get(env, name) : undefined;
  return {
    command,
    containerId: read("CNI_CONTAINERID"),
    netns: read("CNI_NETNS"),
    ifName: read("CNI_IFNAME"),
    args: read("CNI_ARGS") ?? "",
    path: read("CNI_PATH"),
  };
}
