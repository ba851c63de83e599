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
 * namespace is gone). Variables a verb does not use are not validated.
 *
 * @module
 */
import type { CniEnvName } from "../api/wire.ts";
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { IfNameSchema, NetnsPathSchema } from "../api/schema.ts";
import { CNI_CODES, CniError } from "./errors.ts";
import { listOf, quote } from "../lib/clip.ts";
import { CNI_VERBS, type CniVerb, REQUIRED_ENV, verbProblem } from "./spec.ts";

/** Which variables each verb reads (and so validates when they are set). */
const USED_ENV: Record<CniVerb, readonly CniEnvName[]> = {
  ADD: ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"],
  DEL: ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"],
  CHECK: ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"],
  GC: ["CNI_PATH"],
  STATUS: ["CNI_PATH"],
  VERSION: [],
};

/** The spec's container id charset. */
export const CONTAINER_ID_RE = /^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$/;

/** The schema of each variable's value (when set and non-empty). */
const VALUE_SCHEMAS: Record<Exclude<CniEnvName, "CNI_COMMAND">, z.ZodMiniType<string>> = {
  CNI_CONTAINERID: z.string().check(
    z.maxLength(256, "Expected at most 256 characters"),
    z.regex(CONTAINER_ID_RE, "Expected an alphanumeric followed by alphanumerics, '_', '.' or '-'"),
  ),
  CNI_NETNS: NetnsPathSchema,
  CNI_IFNAME: IfNameSchema,
  CNI_ARGS: z.string().check(z.maxLength(64 * 1024)),
  CNI_PATH: z.string(),
};

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
  const problems: string[] = [];
  const values: Partial<Record<CniEnvName, string>> = {};
  for (const name of USED_ENV[command]) {
    const raw = get(env, name);
    if (raw === undefined) {
      if (REQUIRED_ENV[command].includes(name)) problems.push(`${name} is not set`);
      continue;
    }
    const parsed = VALUE_SCHEMAS[name as Exclude<CniEnvName, "CNI_COMMAND">].safeParse(raw);
    if (parsed.success) {
      values[name] = parsed.data;
    } else {
      const why = listOf([...new Set(parsed.error.issues.map((i) => i.message))], 3);
      problems.push(`${name} is invalid: ${why}; got ${quote(raw, 300)}`);
    }
  }
  if (problems.length > 0) {
    throw new CniError(
      CNI_CODES.INVALID_ENV,
      `Invalid CNI environment for ${command}: ${problems.join("; ")}`,
    );
  }
  return {
    command,
    containerId: values.CNI_CONTAINERID,
    netns: values.CNI_NETNS,
    ifName: values.CNI_IFNAME,
    args: values.CNI_ARGS ?? "",
    path: values.CNI_PATH,
  };
}
