/**
 * The permission sets of deno.json, the one place enim's permissions are defined, as
 * `deno run`/`deno compile` flags: `enim` (the agent and the operator commands: what the
 * launcher, the tests, the demo and the bench run `main.js` with, and what `deno compile`
 * bakes into the binary) and `enim-plugin` (the CNI plugin process's own entry,
 * `cni/main.js`, as the launcher runs it: its agent's socket, its log and nothing else).
 * docs/permissions.md says why the agent's network is not narrowed.
 *
 * The bundle runs with `--no-config` (it needs no import map or lockfile, and
 * reading deno.json costs every plugin call about a millisecond), so the set is
 * spelled out as flags rather than named with `--permission-set`.
 *
 * @module
 */
import { z } from "zod";
import { join, ROOT } from "./_paths.ts";

const List = z.array(z.string().min(1));

/**
 * A kind that is granted for some names and ignored for others: reading an ignored name
 * answers as if it were unset (`--ignore-env`), where one neither granted nor ignored throws.
 */
const Granted = z.union([
  List,
  z.strictObject({ allow: List, ignore: List.optional() }),
]);

/** The `permissions.<set>` objects of deno.json (the kinds enim uses); `true`: every name. */
export const PermissionSetSchema = z.strictObject({
  env: Granted.optional(),
  read: List.optional(),
  write: List.optional(),
  run: List.optional(),
  net: z.union([z.literal(true), List]).optional(),
  sys: List.optional(),
});
/** One permission set. */
export type PermissionSet = z.infer<typeof PermissionSetSchema>;

/** The permission sets deno.json defines: the agent's and the commands', and the plugin's. */
export const PERMISSION_SETS = ["enim", "enim-plugin"] as const;
/** The name of one of {@linkcode PERMISSION_SETS}. */
export type PermissionSetName = typeof PERMISSION_SETS[number];

const DenoJsonSchema = z.looseObject({
  // Releases before 0.2.0 (read from history by tests/support/releases.ts) had one set.
  permissions: z.looseObject({
    enim: PermissionSetSchema,
    "enim-plugin": PermissionSetSchema.optional(),
  }),
});

/**
 * Reads the permission set `name` (default `enim`) from `root`/deno.json. A release without
 * a plugin set (before 0.2.0) ran its plugin with `enim`, which is then what `enim-plugin`
 * reads as.
 */
export function readPermissionSet(
  root: string = ROOT,
  name: PermissionSetName = "enim",
): PermissionSet {
  const text = Deno.readTextFileSync(join(root, "deno.json"));
  const sets = DenoJsonSchema.parse(JSON.parse(text)).permissions;
  return sets[name] ?? sets.enim;
}

/**
 * The set as `--allow-<kind>=a,b` flags (`--allow-<kind>` for a kind granted whole, and
 * `--ignore-<kind>=c,d` for the names a kind ignores), in a fixed order.
 */
export function permissionFlags(set: PermissionSet = readPermissionSet()): string[] {
  const flags: string[] = [];
  for (const kind of ["env", "read", "write", "run", "net", "sys"] as const) {
    const granted = set[kind];
    if (!granted) continue;
    if (granted === true) {
      flags.push(`--allow-${kind}`);
      continue;
    }
    const { allow, ignore } = Array.isArray(granted) ? { allow: granted, ignore: [] } : granted;
    if (allow.length > 0) flags.push(`--allow-${kind}=${allow.join(",")}`);
    if (ignore && ignore.length > 0) flags.push(`--ignore-${kind}=${ignore.join(",")}`);
  }
  return flags;
}
