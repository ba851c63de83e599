/**
 * The `enim` permission set of deno.json, the one place enim's permissions are
 * defined, as `deno run`/`deno compile` flags: the launcher, the tests, the
 * demo and the bench run the bundle with exactly these, and `deno compile`
 * bakes the same into the binary.
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

/** The `permissions.enim` object of deno.json (the kinds enim uses). */
export const PermissionSetSchema = z.strictObject({
  env: Granted.optional(),
  read: List.optional(),
  write: List.optional(),
  run: List.optional(),
  net: List.optional(),
  sys: List.optional(),
});
/** The `enim` permission set. */
export type PermissionSet = z.infer<typeof PermissionSetSchema>;

const DenoJsonSchema = z.looseObject({
  permissions: z.looseObject({ enim: PermissionSetSchema }),
});

/** Reads the `enim` permission set from `root`/deno.json. */
export function readPermissionSet(root: string = ROOT): PermissionSet {
  const text = Deno.readTextFileSync(join(root, "deno.json"));
  return DenoJsonSchema.parse(JSON.parse(text)).permissions.enim;
}

/**
 * The set as `--allow-<kind>=a,b` flags (and `--ignore-<kind>=c,d` for the names a kind
 * ignores), in a fixed order.
 */
export function permissionFlags(set: PermissionSet = readPermissionSet()): string[] {
  const flags: string[] = [];
  for (const kind of ["env", "read", "write", "run", "net", "sys"] as const) {
    const granted = set[kind];
    if (!granted) continue;
    const { allow, ignore } = Array.isArray(granted) ? { allow: granted, ignore: [] } : granted;
    if (allow.length > 0) flags.push(`--allow-${kind}=${allow.join(",")}`);
    if (ignore && ignore.length > 0) flags.push(`--ignore-${kind}=${ignore.join(",")}`);
  }
  return flags;
}
