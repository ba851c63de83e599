/**
 * Scratch space for tests.
 *
 * - {@linkcode withRunDir}: a temporary directory for in-process tests.
 * - {@linkcode withSandbox}: an {@linkcode EnimSandbox} for tests that run enim as
 *   a subprocess with the production permission set: enim sees its files under
 *   `dir` (/run/enim), the test process under `sb.host(...)`.
 *
 * @module
 */
import { EnimSandbox } from "./sandbox.ts";

/** Runs `fn` with a fresh temporary directory, removed afterwards. */
export async function withRunDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "enim-test-" });
  try {
    return await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

/**
 * Runs `fn` with a fresh sandbox; `dir` is /run/enim as enim processes see it.
 * `kubelet`: the sandbox has kubelet's device-plugin folder too (`sb.kubeletDir`);
 * `cniNetD`: a private `/etc/cni/net.d` (`sb.netdDir`).
 */
export async function withSandbox<T>(
  fn: (dir: string, sb: EnimSandbox) => Promise<T>,
  opts: { kubelet?: boolean; cniNetD?: boolean } = {},
): Promise<T> {
  const sb = await EnimSandbox.create(null, opts);
  try {
    return await fn(sb.inner(), sb);
  } finally {
    await sb.close();
  }
}
