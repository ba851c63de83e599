/**
 * OCI image archives: a tar of an OCI image layout (`oci-layout`, `index.json`,
 * `blobs/sha256/…`), which `ctr images import`, `podman load` and `skopeo copy oci-archive:`
 * read. Shared by `deno task image` (scripts/image.ts) and the tests' pause image
 * (tests/support/cri/image.ts).
 *
 * Everything it writes is a function of its inputs: layers are tars with sorted names,
 * fixed owners and times (see {@linkcode reproducibleTar}), gzip'd with `gzip -n` (no name,
 * no time in the header), and the JSON documents have a fixed key order. The same inputs
 * give the same digest.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { join } from "./_paths.ts";

/** GNU tar (Debian's `tar`, essential). */
export const TAR = "/usr/bin/tar";
/** gzip (Debian's `gzip`, essential). */
export const GZIP = "/usr/bin/gzip";

/** The OCI architecture name of this machine. */
export function ociArch(): string {
  const arch = ({ x86_64: "amd64", aarch64: "arm64" } as Record<string, string>)[Deno.build.arch];
  if (!arch) throw new Error(`No OCI architecture name for "${Deno.build.arch}"`);
  return arch;
}

/** The SHA-256 of a file, hex, read in chunks (layers are large). */
export async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  const file = await Deno.open(path);
  // The stream closes the file when it ends.
  for await (const chunk of file.readable) hash.update(chunk);
  return hash.digest("hex");
}

/** The SHA-256 of bytes, hex. */
export function sha256Bytes(data: Uint8Array): string {
  return createHash("sha256").update(data).digest("hex");
}

async function run(bin: string, args: string[], opts: { stdout?: string } = {}): Promise<void> {
  const cmd = new Deno.Command(bin, {
    args,
    stdin: "null",
    stdout: opts.stdout ? "piped" : "null",
    stderr: "piped",
  });
  if (!opts.stdout) {
    const out = await cmd.output();
    if (!out.success) {
      throw new Error(`${bin} ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr)}`);
    }
    return;
  }
  const child = cmd.spawn();
  const file = await Deno.open(opts.stdout, { write: true, create: true, truncate: true });
  const [status, stderr] = await Promise.all([
    child.status,
    new Response(child.stderr).text(),
    child.stdout.pipeTo(file.writable),
  ]);
  if (!status.success) throw new Error(`${bin} ${args.join(" ")} failed: ${stderr}`);
}

/**
 * Writes `out`, a tar of `entries` (paths relative to `dir`) as a reproducible layer:
 * names sorted, owner and group 0, every time `mtime` (seconds since the epoch), no
 * atime/ctime in pax headers. Modes are kept as they are in `dir`.
 */
export async function reproducibleTar(
  dir: string,
  entries: string[],
  out: string,
  mtime = 0,
  opts: { recursion?: boolean } = {},
): Promise<void> {
  await run(TAR, [
    ...(opts.recursion === false ? ["--no-recursion"] : []),
    "--create",
    "--file",
    out,
    "--directory",
    dir,
    "--format=posix",
    "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
    "--owner=0",
    "--group=0",
    "--numeric-owner",
    `--mtime=@${mtime}`,
    "--sort=name",
    "--",
    ...entries,
  ]);
}

/** gzip of `src` into `dst`, without a name or a time in the header (`gzip -n`). */
export async function gzipFile(src: string, dst: string, level = 6): Promise<void> {
  await run(GZIP, ["-n", `-${level}`, "-c", "--", src], { stdout: dst });
}

/** A layer to put in an image: an uncompressed tar, stored gzip'd or as it is. */
export interface LayerInput {
  /** The layer's tar (uncompressed). */
  tar: string;
  /** Store it gzip'd (the default) or as a plain tar. */
  gzip?: boolean;
  /** What made it (the config's history entry). */
  createdBy: string;
  /**
   * A folder where the gzip'd blob is kept by the tar's digest, so an unchanged layer is
   * not compressed again.
   */
  cacheDir?: string;
}

/** The image's runtime configuration (the OCI config's `config`). */
export interface ImageConfig {
  Entrypoint: string[];
  Cmd?: string[];
  Env?: string[];
  WorkingDir?: string;
  Labels?: Record<string, string>;
}

/** What {@linkcode writeOciArchive} is asked to write. */
export interface OciArchiveInput {
  /** A scratch folder (created; the layout is built in it). */
  workDir: string;
  /** The archive to write. */
  out: string;
  /** The image's name (the index entry's `io.containerd.image.name`). */
  ref: string;
  layers: LayerInput[];
  config: ImageConfig;
  /** The config's `created`, seconds since the epoch (omitted when undefined). */
  created?: number;
  /** The manifest's annotations. */
  annotations?: Record<string, string>;
}

/** A blob of an image: its digest and size. */
export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
}

/** What {@linkcode writeOciArchive} wrote. */
export interface OciArchive {
  /** The archive's path. */
  archive: string;
  /** The manifest's digest (`sha256:…`): what a registry and containerd call the image. */
  digest: string;
  /** The archive's size in bytes. */
  size: number;
  ref: string;
  manifest: Descriptor;
  config: Descriptor;
  layers: Descriptor[];
  /** The uncompressed layers' digests, in order (the config's `rootfs.diff_ids`). */
  diffIds: string[];
}

const MEDIA = {
  index: "application/vnd.oci.image.index.v1+json",
  manifest: "application/vnd.oci.image.manifest.v1+json",
  config: "application/vnd.oci.image.config.v1+json",
  tar: "application/vnd.oci.image.layer.v1.tar",
  tarGzip: "application/vnd.oci.image.layer.v1.tar+gzip",
} as const;

/** The media types this module writes. */
export const OCI_MEDIA_TYPES = MEDIA;

/** Writes an OCI image layout of `input` and tars it into `input.out`. */
export async function writeOciArchive(input: OciArchiveInput): Promise<OciArchive> {
  const layout = join(input.workDir, "layout");
  const blobs = join(layout, "blobs", "sha256");
  await Deno.remove(layout, { recursive: true }).catch(() => {});
  await Deno.mkdir(blobs, { recursive: true });

  const putFile = async (path: string, hex?: string): Promise<{ digest: string; size: number }> => {
    hex ??= await sha256File(path);
    const target = join(blobs, hex);
    await Deno.remove(target).catch(() => {});
    try {
      await Deno.link(path, target);
    } catch {
      await Deno.copyFile(path, target);
    }
    return { digest: `sha256:${hex}`, size: (await Deno.stat(target)).size };
  };
  const putJson = async (value: unknown): Promise<{ digest: string; size: number }> => {
    const data = new TextEncoder().encode(JSON.stringify(value));
    const hex = sha256Bytes(data);
    await Deno.writeFile(join(blobs, hex), data);
    return { digest: `sha256:${hex}`, size: data.length };
  };

  const layers: Descriptor[] = [];
  const diffIds: string[] = [];
  for (const [i, layer] of input.layers.entries()) {
    const diff = await sha256File(layer.tar);
    diffIds.push(`sha256:${diff}`);
    if (layer.gzip === false) {
      layers.push({ mediaType: MEDIA.tar, ...await putFile(layer.tar, diff) });
      continue;
    }
    let gz: string;
    if (layer.cacheDir) {
      await Deno.mkdir(layer.cacheDir, { recursive: true });
      gz = join(layer.cacheDir, `${diff}.tar.gz`);
      try {
        // Used now: the cache's pruning (scripts/image.ts) keeps it.
        const now = new Date();
        await Deno.utime(gz, now, now);
      } catch {
        const tmp = `${gz}.tmp-${Deno.pid}`;
        await gzipFile(layer.tar, tmp);
        await Deno.rename(tmp, gz);
      }
    } else {
      gz = join(input.workDir, `layer-${i}.tar.gz`);
      await gzipFile(layer.tar, gz);
    }
    layers.push({ mediaType: MEDIA.tarGzip, ...await putFile(gz) });
  }

  const arch = ociArch();
  const config = {
    mediaType: MEDIA.config,
    ...await putJson({
      ...(input.created === undefined
        ? {}
        : { created: new Date(input.created * 1000).toISOString() }),
      architecture: arch,
      os: "linux",
      config: input.config,
      rootfs: { type: "layers", diff_ids: diffIds },
      history: input.layers.map((l) => ({
        ...(input.created === undefined
          ? {}
          : { created: new Date(input.created * 1000).toISOString() }),
        created_by: l.createdBy,
      })),
    }),
  };
  const manifest = {
    mediaType: MEDIA.manifest,
    ...await putJson({
      schemaVersion: 2,
      mediaType: MEDIA.manifest,
      config,
      layers,
      ...(input.annotations ? { annotations: input.annotations } : {}),
    }),
  };
  await Deno.writeTextFile(
    join(layout, "index.json"),
    JSON.stringify({
      schemaVersion: 2,
      mediaType: MEDIA.index,
      manifests: [{
        ...manifest,
        platform: { architecture: arch, os: "linux" },
        annotations: {
          "io.containerd.image.name": input.ref,
          "org.opencontainers.image.ref.name": input.ref.slice(input.ref.lastIndexOf(":") + 1),
        },
      }],
    }),
  );
  await Deno.writeTextFile(
    join(layout, "oci-layout"),
    JSON.stringify({ imageLayoutVersion: "1.0.0" }),
  );
  const blobNames = [...Deno.readDirSync(blobs)].map((e) => `blobs/sha256/${e.name}`).sort();
  const tmp = `${input.out}.tmp-${Deno.pid}`;
  const entries = ["oci-layout", "index.json", "blobs", "blobs/sha256", ...blobNames];
  await reproducibleTar(layout, entries, tmp, 0, { recursion: false });
  await Deno.rename(tmp, input.out);
  await Deno.remove(layout, { recursive: true });
  return {
    archive: input.out,
    digest: manifest.digest,
    size: (await Deno.stat(input.out)).size,
    ref: input.ref,
    manifest,
    config,
    layers,
    diffIds,
  };
}
