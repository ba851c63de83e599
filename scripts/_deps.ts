/**
 * Installs what the tests, the demo and the bench need from Debian's packages,
 * so a fresh machine (CI) needs nothing set up by hand. Only as root; only what
 * is missing; `apt-get update` at most once per run.
 *
 * @module
 */
import { existsSync as exists } from "../lib/fs.ts";

/** A package and the file that shows it is installed. */
export interface AptNeed {
  pkg: string;
  file: string;
}

/** What every real-kernel test needs. */
export const BASE_NEEDS: AptNeed[] = [
  { pkg: "iproute2", file: "/usr/sbin/ip" },
  { pkg: "iproute2", file: "/usr/sbin/tc" },
  { pkg: "iputils-ping", file: "/usr/bin/ping" },
  { pkg: "util-linux", file: "/usr/bin/nsenter" },
  // The simulated VPC's source check, and the agent's tables for pods' host links.
  { pkg: "nftables", file: "/usr/sbin/nft" },
];

/**
 * A program found on first use, not when a module loads: the demo, the tests and the bench
 * import their fixtures before they run {@linkcode ensureApt}, so a path resolved at module
 * load would miss a package that step installs (issue 12: the demo failed once on a machine
 * without ping). The returned function looks the candidates up on each call until one
 * exists and then keeps that path; it throws, naming the candidates and the package, while
 * none does.
 *
 * @example
 * ```ts
 * const ping = lazyTool("ping", ["/usr/bin/ping", "/bin/ping"], "iputils-ping");
 * // nothing is looked up yet; after ensureApt(...):
 * const argv = [ping(), "-c1", "10.0.0.1"];
 * ```
 */
export function lazyTool(name: string, candidates: string[], pkg: string): () => string {
  let found: string | null = null;
  return () => {
    if (found !== null) return found;
    found = candidates.find(isFile) ?? null;
    if (found === null) {
      throw new Error(
        `Cannot find ${name}: none of ${candidates.map((c) => `"${c}"`).join(", ")} exists ` +
          `(Debian package "${pkg}")`,
      );
    }
    return found;
  };
}

function isFile(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

/** apt-get options that wait up to 5 minutes for dpkg's lock. */
const LOCK_WAIT = ["-o", "DPkg::Lock::Timeout=300"];

/** Whether this process runs as root. */
export function isRoot(): boolean {
  return Deno.uid() === 0;
}

/**
 * Installs the missing packages through apt. Returns the packages it could not
 * provide (not root, or apt failed) so callers can skip with a clear message.
 */
export async function ensureApt(
  needs: AptNeed[],
  log = (m: string) => console.error(m),
): Promise<string[]> {
  const missing = needs.filter((n) => !exists(n.file));
  if (missing.length === 0) return [];
  if (!isRoot()) return missing.map((m) => m.pkg);
  const pkgs = [...new Set(missing.map((m) => m.pkg))];
  const t0 = performance.now();
  log(`installing through apt: ${pkgs.join(" ")}`);
  const env = { DEBIAN_FRONTEND: "noninteractive" };
  const run = (args: string[]) =>
    new Deno.Command("apt-get", { args, env, stdout: "null", stderr: "piped" }).output();
  // Wait for dpkg's lock rather than fail when another install (another test module, the
  // machine's own apt) holds it.
  const install = ["install", "-y", "-qq", "--no-install-recommends", ...LOCK_WAIT, ...pkgs];
  let res = await run(install);
  if (!res.success) {
    await run(["update", "-qq"]);
    res = await run(install);
  }
  log(`apt install took ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  if (!res.success) log(new TextDecoder().decode(res.stderr).slice(-2000));
  return missing.filter((n) => !exists(n.file)).map((m) => m.pkg);
}
