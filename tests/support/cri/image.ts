/**
 * A pause image built locally (no registry is reachable): one uncompressed layer holding
 * Debian's static busybox; its entry point sleeps (as long as a 32-bit number of seconds
 * allows), which is all a sandbox's pause process does. Written as an OCI
 * image layout in a tar (oci-layout, index.json, blobs/sha256/{manifest, config, layer}),
 * which `ctr images import` reads.
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
export function buildPauseImage(dir: string, ref: string): Promise<PauseImage> {
  return buildBusyboxImage(dir, ref, {
    applets: ["sh", "sleep"],
    entrypoint: ["/bin/sleep"],
    cmd: ["2147483647"],
    createdBy: "enim tests/support/cri/image.ts: busybox-static as a pause image",
  });
}

/** What goes into a busybox image ({@linkcode buildBusyboxImage}). */
export interface BusyboxImageOptions {
  /** The applets linked in /bin (default: every applet busybox lists). */
  applets?: string[];
  entrypoint?: string[];
  cmd?: string[];
  /** The history line of its config. */
  createdBy?: string;
  /** Files and folders of this machine copied in at the same paths (symlinks followed). */
  copy?: string[];
  /** Files written in: path → text (mode 0755). */
  write?: Record<string, string>;
}

/** Copies `src` (a file or folder, symlinks followed) to `dst`. */
async function copyTree(src: string, dst: string): Promise<void> {
  const st = await Deno.stat(src);
  if (st.isDirectory) {
    await Deno.mkdir(dst, { recursive: true });
    for await (const e of Deno.readDir(src)) await copyTree(`${src}/${e.name}`, `${dst}/${e.name}`);
    return;
  }
  await Deno.mkdir(dst.slice(0, dst.lastIndexOf("/")) || "/", { recursive: true });
  await Deno.copyFile(src, dst);
  await Deno.chmod(dst, st.mode! & 0o777);
}

/** The applets of {@linkcode BUSYBOX} (`busybox --list`). */
async function allApplets(): Promise<string[]> {
  const out = await new Deno.Command(BUSYBOX, { args: ["--list"], stdout: "piped" }).output();
  if (!out.success) throw new Error(`${BUSYBOX} --list failed`);
  return new TextDecoder().decode(out.stdout).split("\n").filter((a) => /^[a-z0-9_.[-]+$/.test(a))
    .filter((a) => a !== "busybox");
}

/**
 * An image of one uncompressed layer holding Debian's static busybox and its applets in
 * /bin (the pause image, and the tests' workload image: a shell, sleep, nc, wget, ping,
 * httpd), written as an OCI layout tar under `dir` (which must exist). Reproducible: the
 * same busybox gives the same digest.
 */
export async function buildBusyboxImage(
  dir: string,
  ref: string,
  o: BusyboxImageOptions = {},
): Promise<PauseImage> {
  const rootfs = `${dir}/rootfs`;
  await Deno.mkdir(`${rootfs}/bin`, { recursive: true });
  await Deno.copyFile(BUSYBOX, `${rootfs}/bin/busybox`);
  await Deno.chmod(`${rootfs}/bin/busybox`, 0o755);
  for (const applet of o.applets ?? await allApplets()) {
    await Deno.symlink("busybox", `${rootfs}/bin/${applet}`);
  }
  for (const path of o.copy ?? []) await copyTree(path, `${rootfs}${path}`);
  for (const [path, text] of Object.entries(o.write ?? {})) {
    await Deno.mkdir(`${rootfs}${path.slice(0, path.lastIndexOf("/"))}`, { recursive: true });
    await Deno.writeTextFile(`${rootfs}${path}`, text, { mode: 0o755 });
    await Deno.chmod(`${rootfs}${path}`, 0o755);
  }

  // The layer: a plain tar, owned by root, with fixed times (the digest is reproducible).
  const entries = [...Deno.readDirSync(rootfs)].map((e) => e.name).sort();
  await reproducibleTar(rootfs, entries, `${dir}/layer.tar`);
  const image = await writeOciArchive({
    workDir: dir,
    out: `${dir}/image.oci.tar`,
    ref,
    layers: [{
      tar: `${dir}/layer.tar`,
      gzip: false,
      createdBy: o.createdBy ?? "enim tests/support/cri/image.ts: busybox-static",
    }],
    config: {
      Entrypoint: o.entrypoint ?? ["/bin/sh"],
      Cmd: o.cmd ?? [],
      WorkingDir: "/",
      Env: ["PATH=/bin"],
    },
  });
  return { ref, tar: image.archive, manifestDigest: image.digest };
}
