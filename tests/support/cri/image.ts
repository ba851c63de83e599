/**
 * A pause image built locally (no registry is reachable): one uncompressed layer holding
 * Debian's static busybox; its entry point sleeps (as long as a 32-bit number of seconds
 * allows), which is all a sandbox's pause process does. Written as an OCI
 * image layout in a tar (oci-layout, index.json, blobs/sha256/{manifest, config, layer}),
 * which `ctr images import` reads.
 *
 * @module
 */

/** The busybox-static binary (Debian package busybox-static). */
export const BUSYBOX = "/bin/busybox";

/** The OCI architecture name of this machine. */
export function ociArch(): string {
  const arch = ({ x86_64: "amd64", aarch64: "arm64" } as Record<string, string>)[Deno.build.arch];
  if (!arch) throw new Error(`No OCI architecture name for "${Deno.build.arch}"`);
  return arch;
}

async function sha256(data: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", data as BufferSource));
  return [...digest].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function tar(args: string[]): Promise<void> {
  const out = await new Deno.Command("/usr/bin/tar", { args, stdout: "null", stderr: "piped" })
    .output();
  if (!out.success) {
    throw new Error(`tar ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
}

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
  const layout = `${dir}/layout`;
  await Deno.mkdir(`${rootfs}/bin`, { recursive: true });
  await Deno.mkdir(`${layout}/blobs/sha256`, { recursive: true });
  await Deno.copyFile(BUSYBOX, `${rootfs}/bin/busybox`);
  await Deno.chmod(`${rootfs}/bin/busybox`, 0o755);
  for (const applet of ["sh", "sleep"]) await Deno.symlink("busybox", `${rootfs}/bin/${applet}`);

  // The layer: a plain tar, owned by root, with fixed times (the digest is reproducible).
  await tar([
    "--create",
    "--file",
    `${dir}/layer.tar`,
    "--directory",
    rootfs,
    "--owner=0",
    "--group=0",
    "--numeric-owner",
    "--mtime=@0",
    "--sort=name",
    "bin",
  ]);
  const blob = async (data: Uint8Array) => {
    const hex = await sha256(data);
    await Deno.writeFile(`${layout}/blobs/sha256/${hex}`, data);
    return { digest: `sha256:${hex}`, size: data.length };
  };
  const layer = await blob(await Deno.readFile(`${dir}/layer.tar`));
  const enc = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
  const config = await blob(enc({
    architecture: ociArch(),
    os: "linux",
    config: {
      Entrypoint: ["/bin/sleep"],
      Cmd: ["2147483647"],
      WorkingDir: "/",
      Env: ["PATH=/bin"],
    },
    rootfs: { type: "layers", diff_ids: [layer.digest] },
    history: [{ created_by: "enim tests/support/cri/image.ts: busybox-static as a pause image" }],
  }));
  const manifest = await blob(enc({
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.oci.image.config.v1+json", ...config },
    layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar", ...layer }],
  }));
  await Deno.writeTextFile(
    `${layout}/index.json`,
    JSON.stringify({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [{
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        ...manifest,
        platform: { architecture: ociArch(), os: "linux" },
        annotations: {
          "io.containerd.image.name": ref,
          "org.opencontainers.image.ref.name": ref.split(":").pop(),
        },
      }],
    }),
  );
  await Deno.writeTextFile(`${layout}/oci-layout`, JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  const out = `${dir}/pause.oci.tar`;
  await tar([
    "--create",
    "--file",
    out,
    "--directory",
    layout,
    "--owner=0",
    "--group=0",
    "--numeric-owner",
    "oci-layout",
    "index.json",
    "blobs",
  ]);
  return { ref, tar: out, manifestDigest: manifest.digest };
}
