/**
 * A pause image built locally (no registry is reachable): one uncompressed layer holding
 * Debian's static busybox; its entry point sleeps (as long as a 32-bit number of seconds
 * allows), which is all a sandbox's pause process does. Written as an OCI
 * image layout in a tar (oci-layout, index.json, blobs/sha256/{manifest, config, layer}),
 * which `ctr images import` reads, by scripts/_oci.ts (which `deno task image` uses too).
 *
 * @module
 */
import { ociArch, reproducibleTar, writeOciArchive } from "../../../scripts/_oci.ts";

/** The busybox-static binary (Debian package busybox-static). */
export const BUSYBOX = "/bin/busybox";

export { ociArch };

/** What {@linkcode buildPauseImage} wrote. */
export interface PauseImage {
  /** The image's name, as `ctr` and the CRI see it after the import. */
  ref: string;
  /** The OCI layout tar. */
  tar: string;
  /** The manifest's digest (`sha256:…`). */
  manifestDigest: string;
}

/**
 * Builds the pause image's OCI layout tar under `dir` (which must exist) and returns its
 * path. `ref` is stored as the `io.containerd.image.name` annotation of the index entry.
 */
export async function buildPauseImage(dir: string, ref: string): Promise<PauseImage> {
  const rootfs = `${dir}/rootfs`;
  await Deno.mkdir(`${rootfs}/bin`, { recursive: true });
  await Deno.copyFile(BUSYBOX, `${rootfs}/bin/busybox`);
  await Deno.chmod(`${rootfs}/bin/busybox`, 0o755);
  for (const applet of ["sh", "sleep"]) await Deno.symlink("busybox", `${rootfs}/bin/${applet}`);

  // The layer: a plain tar, owned by root, with fixed times (the digest is reproducible).
  await reproducibleTar(rootfs, ["bin"], `${dir}/layer.tar`);
  const image = await writeOciArchive({
    workDir: dir,
    out: `${dir}/pause.oci.tar`,
    ref,
    layers: [{
      tar: `${dir}/layer.tar`,
      gzip: false,
      createdBy: "enim tests/support/cri/image.ts: busybox-static as a pause image",
    }],
    config: {
      Entrypoint: ["/bin/sleep"],
      Cmd: ["2147483647"],
      WorkingDir: "/",
      Env: ["PATH=/bin"],
    },
  });
  return { ref, tar: image.archive, manifestDigest: image.digest };
}
