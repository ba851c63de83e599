import { assert, assertEquals } from "../lib/assert.ts";
import { VERSION } from "../lib/version.ts";
import { readReleases, semverParts } from "./_releases.ts";
import { git } from "./_worktree.ts";
import { join, ROOT } from "./_paths.ts";

const cmp = (a: string, b: string) => {
  const [x, y] = [semverParts(a), semverParts(b)];
  return x[0] - y[0] || x[1] - y[1] || x[2] - y[2];
};

Deno.test("deno.json's version is lib/version.ts's", async () => {
  const denoJson = JSON.parse(await Deno.readTextFile(join(ROOT, "deno.json")));
  assertEquals(denoJson.version, VERSION);
});

Deno.test("releases.json lists releases oldest first, each older than the version worked on", () => {
  const releases = readReleases();
  for (let i = 1; i < releases.length; i++) {
    assert(cmp(releases[i - 1].version, releases[i].version) < 0, "releases out of order");
  }
  assert(cmp(releases.at(-1)!.version, VERSION) < 0, `${VERSION} is not newer than every release`);
});

Deno.test("CHANGELOG.md has an entry for the version worked on and for each release, naming its commit", async () => {
  const log = await Deno.readTextFile(join(ROOT, "CHANGELOG.md"));
  assert(log.includes(`\n## ${VERSION} `), `CHANGELOG.md has no entry "## ${VERSION}"`);
  for (const r of readReleases()) {
    const at = log.indexOf(`\n## ${r.version} (${r.date})`);
    assert(at >= 0, `CHANGELOG.md has no entry "## ${r.version} (${r.date})"`);
    const entry = log.slice(at + 1).split("\n## ")[0];
    assert(entry.includes(r.commit.slice(0, 7)), `${r.version}'s entry does not name its commit`);
  }
});

Deno.test("every release's commit is in this repository's history", async (t) => {
  for (const r of readReleases()) {
    await t.step(r.version, async () => {
      await git(["cat-file", "-e", `${r.commit}^{commit}`]);
      // An ancestor of what is worked on: a release is history, never a branch beside it.
      await git(["merge-base", "--is-ancestor", r.commit, "HEAD"]);
    });
  }
});
