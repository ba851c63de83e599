/**
 * `deno task test`: installs every Debian package a test uses (scripts/_deps.ts, users
 * "test"), builds the artifact (`deno task build`), builds (or finds in the machine's cache)
 * the Kubernetes components the tests run when Go is here (tests/support/k8s/build.ts;
 * `ENIM_K8S_VERSION`'s release; the real node's kubelet, containerd 2.x and runc), runs every test with `deno test` and ends with the plain
 * line `N passed, M failed` that CI reads.
 *
 * Extra arguments are passed to `deno test` (e.g. a file or `--filter`).
 *
 * @module
 */
import { dirname, fromFileUrl, join } from "./_paths.ts";
import { aptNeedsOf, ensureApt } from "./_deps.ts";
import { build } from "./build.ts";
import {
  ensureK8sBinaries,
  ensureNodeBinaries,
  goMissing,
  nodeBuildMissing,
} from "../tests/support/k8s/build.ts";

const root = dirname(dirname(fromFileUrl(import.meta.url)));

// All of them before the first test: a test that runs a tool must not depend on an earlier
// test's helper having installed it (issue 41).
const unmet = await ensureApt(aptNeedsOf("test"));
if (unmet.length > 0) {
  console.error(`not installed (tests that need them skip): ${unmet.join(", ")}`);
}

// The artifact every subprocess test runs (tests/support/enim.ts), built once, fresh.
const built = performance.now();
console.error(`built ${await build()} in ${((performance.now() - built) / 1000).toFixed(1)} s`);

// The Kubernetes components, before the first test too: built inside the first test that
// needs them, the minutes of a cold build fell within that test and outlived its fixtures
// (a server that lives 300 s). Warm, this reads one stamp file.
if (goMissing() === null) {
  const t0 = performance.now();
  try {
    const bins = await ensureK8sBinaries();
    console.error(
      `Kubernetes v${bins.version} components ready in ${
        ((performance.now() - t0) / 1000).toFixed(1)
      } s`,
    );
  } catch (err) {
    console.error(`cannot build the Kubernetes components (the tests that run them fail): ${err}`);
  }
}
// The real node's kubelet, containerd 2.x and runc (tests/support/k8s/real_node.ts), after
// the control plane (whose Go build cache they share), for the same reason.
if (nodeBuildMissing() === null) {
  const t0 = performance.now();
  try {
    const bins = await ensureNodeBinaries();
    console.error(
      `kubelet v${bins.version}, containerd v${bins.containerdVersion} and runc ` +
        `v${bins.runcVersion} ready in ${((performance.now() - t0) / 1000).toFixed(1)} s`,
    );
  } catch (err) {
    console.error(`cannot build the real node's components (its tests fail): ${err}`);
  }
}

const cmd = new Deno.Command(Deno.execPath(), {
  args: ["test", "-A", "--no-prompt", "--config", join(root, "tests", "deno.json"), ...Deno.args],
  cwd: root,
  env: { NO_COLOR: "1" },
  stdout: "piped",
  stderr: "inherit",
});
const child = cmd.spawn();
let tail = "";
const decoder = new TextDecoder();
for await (const chunk of child.stdout) {
  await Deno.stdout.write(chunk);
  tail = (tail + decoder.decode(chunk, { stream: true })).slice(-4096);
}
const { code } = await child.status;
const summary = tail.split("\n").reverse().find((l) => /\d+ passed.*\d+ failed/.test(l));
const passed = Number(summary?.match(/(\d+) passed/)?.[1] ?? 0);
const failed = Number(summary?.match(/(\d+) failed/)?.[1] ?? (code === 0 ? 0 : 1));
console.log(`${passed} passed, ${failed} failed`);
Deno.exit(code);
