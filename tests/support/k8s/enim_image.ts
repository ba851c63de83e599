/**
 * A stand-in for enim's image, for the real node until `deno task image` (scripts/image.ts,
 * issue 50 point 2) builds the shipped one: an OCI archive of this machine's own files at
 * their own paths: busybox-static (the init container's `/bin/sh`, `cp`, `chmod`, `mv`),
 * the tools the agent runs (`ip`, `tc`, `nft`, `nsenter`, `stat`, `conntrack`) with the
 * shared libraries `ldd` names, this Deno, the built bundle (dist/bundle) and the launcher
 * (scripts/launcher.ts) as `/usr/local/bin/enim`: the same entrypoint and paths the
 * DaemonSet uses. The launcher the init container copies onto the node runs this
 * machine's Deno and bundle, which the node (this machine) has: what this stand-in cannot
 * show is a node with nothing installed. Deno's cache is `/var/lib/enim/deno`, on the node
 * a folder of the test (the machine's /var/cache is left alone).
 *
 * @module
 */
import { buildBusyboxImage, type PauseImage } from "../cri/image.ts";
import { launcherScript } from "../../../scripts/launcher.ts";
import { BUNDLE_DIR } from "../../../scripts/build.ts";

/** The executables the agent and the init container run, besides busybox's applets. */
export const AGENT_TOOLS = [
  "/usr/sbin/ip",
  "/usr/sbin/tc",
  "/usr/sbin/nft",
  "/usr/bin/nsenter",
  "/usr/bin/stat",
  "/usr/sbin/conntrack",
];

/** The shared libraries `ldd` says `exe` loads (absolute paths). */
async function libsOf(exe: string): Promise<string[]> {
  const out = await new Deno.Command("/usr/bin/ldd", {
    args: [exe],
    stdout: "piped",
    stderr: "null",
  })
    .output();
  const text = new TextDecoder().decode(out.stdout);
  return [...text.matchAll(/(\/[^\s]+) \(0x/g)].map((m) => m[1]);
}

/** Builds the stand-in image's OCI archive under `dir` (which must exist) as `ref`. */
export async function buildEnimStandInImage(dir: string, ref: string): Promise<PauseImage> {
  const exes = [...AGENT_TOOLS, Deno.execPath()];
  const libs = new Set<string>();
  for (const e of exes) for (const l of await libsOf(e)) libs.add(l);
  return await buildBusyboxImage(dir, ref, {
    copy: [...exes, ...libs, BUNDLE_DIR],
    write: { "/usr/local/bin/enim": launcherScript({ denoDir: "/var/lib/enim/deno" }) },
    entrypoint: ["/usr/local/bin/enim"],
    cmd: ["agent", "--config", "/etc/enim/agent.jsonc"],
    createdBy: "enim tests/support/k8s/enim_image.ts: a stand-in of enim's image",
  });
}
