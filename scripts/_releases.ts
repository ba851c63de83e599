/**
 * enim's earlier releases, as `releases.json` records them: the version, the commit it is,
 * and the schema version of each component of the state database it opens
 * (`lib/sqlite.ts`). Read by the tests that build a release from history
 * (`tests/support/releases.ts`), by the check that keeps `releases.json`, `CHANGELOG.md`,
 * `deno.json` and `lib/version.ts` in step (`scripts/releases_test.ts`) and by the state
 * round trip's check that this code writes nothing the previous release refuses.
 *
 * @module
 */
import { z } from "zod";
import { join, ROOT } from "./_paths.ts";

/** A version as enim spells one: `MAJOR.MINOR.PATCH`. */
export const SemverSchema = z.string().regex(/^\d+\.\d+\.\d+$/, "Expected MAJOR.MINOR.PATCH");

/** One released version. */
export const ReleaseSchema = z.strictObject({
  version: SemverSchema,
  /** The full commit hash of the release. */
  commit: z.string().regex(/^[0-9a-f]{40}$/, "Expected a full commit hash"),
  date: z.string().regex(/^\d{4}-\d{2}-\d{2}$/),
  /** The highest schema version it opens, per component of the state database. */
  schemas: z.record(z.string(), z.number().int().positive()),
});
/** One released version. */
export type Release = z.infer<typeof ReleaseSchema>;

const ReleasesFileSchema = z.looseObject({ releases: z.array(ReleaseSchema).min(1) });

/** The releases of `releases.json` under `root`, oldest first. */
export function readReleases(root: string = ROOT): Release[] {
  const parsed = ReleasesFileSchema.parse(
    JSON.parse(Deno.readTextFileSync(join(root, "releases.json"))),
  );
  return parsed.releases;
}

/** The release `version` (throws naming the versions known when there is none). */
export function releaseOf(version: string, root: string = ROOT): Release {
  const all = readReleases(root);
  const r = all.find((x) => x.version === version);
  if (!r) {
    throw new Error(
      `No release "${version}" in releases.json (known: ${all.map((x) => x.version).join(", ")})`,
    );
  }
  return r;
}

/** The newest release before the version being worked on (the N−1 of the skew tests). */
export function previousRelease(root: string = ROOT): Release {
  return readReleases(root).at(-1)!;
}

/** [major, minor, patch] of a version. */
export function semverParts(v: string): [number, number, number] {
  const [a, b, c] = SemverSchema.parse(v).split(".").map(Number);
  return [a, b, c];
}
