/**
 * `deno task image` (issue 50 item 2): the image is built here (mmdebstrap, deno from npm,
 * the bundle), its OCI layout is what containerd reads, its root filesystem holds what the
 * agent runs and little else, and what its init container installs runs on a node that has
 * nothing installed: no deno, no HOME, only the reference CNI plugins in /opt/cni/bin.
 *
 * The image is built once per run of this file and its Debian layer comes from
 * ~/.cache/enim/image (scripts/image.ts), so only a fresh machine pays mmdebstrap's ~3
 * minutes. Skipped, with the reason, when not root or when apt cannot give mmdebstrap or
 * the packages.
 */
import { parseAllDocuments } from "yaml";
import { z } from "zod";
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { aptNeeds, ensureApt, isRoot } from "./_deps.ts";
import { join, ROOT } from "./_paths.ts";
import { sha256File } from "./_oci.ts";
import {
  AGENT_PROGRAMS,
  buildImage,
  type BuiltImage,
  IMAGE_DIR,
  IMAGE_ENTRYPOINT,
  IMAGE_PACKAGES,
} from "./image.ts";
import { runCommand } from "../tests/support/command.ts";
import { SimulatedNode } from "../tests/support/node.ts";
import { Containerd } from "../tests/support/cri/containerd.ts";

const UNSHARE = "/usr/bin/unshare";
const CTR = "/usr/bin/ctr";
const TAR = "/usr/bin/tar";
const GZIP = "/usr/bin/gzip";
/** Debian's reference plugins (containernetworking-plugins): a bare node's /opt/cni/bin. */
const REFERENCE_PLUGINS = "/usr/lib/cni";

/** Why the tests cannot run here, or null. */
async function skipReason(): Promise<string | null> {
  if (!isRoot()) return "needs root (mmdebstrap --mode=root, chroot, mount namespaces)";
  const unmet = await ensureApt(
    aptNeeds(
      "mmdebstrap",
      "gzip",
      "tar",
      "util-linux",
      "containernetworking-plugins",
      "containerd",
      "runc",
    ),
    (m) => console.error(`image_test: ${m}`),
  );
  if (unmet.length > 0) return `cannot install through apt: ${unmet.join(", ")}`;
  return null;
}

const SKIP = await skipReason();
if (SKIP) console.error(`image_test: skipped, ${SKIP}`);

let built: Promise<BuiltImage> | undefined;
const work = SKIP ? "" : await Deno.makeTempDir({ prefix: "enim-image-test-" });
// Removed however the file's tests end (a filtered run too).
if (work) globalThis.addEventListener("unload", () => Deno.removeSync(work, { recursive: true }));

/** The image, built once for this file (its Debian layer cached across runs). */
function image(): Promise<BuiltImage> {
  built ??= (async () => {
    const t0 = performance.now();
    const img = await buildImage({ outDir: join(work, "out") });
    console.error(
      `image_test: image ${img.digest}, ${img.size} bytes, built in ${
        ((performance.now() - t0) / 1000).toFixed(1)
      } s (Debian layer ${img.rootfsCached ? "cached" : "built"})`,
    );
    return img;
  })();
  return built;
}

async function run(argv: string[], env: Record<string, string> = {}): Promise<string> {
  const out = await runCommand(argv, { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", ...env });
  assertEquals(out.code, 0, `${argv.join(" ")}: ${out.stderr}${out.stdout}`);
  return out.stdout;
}

// deno-lint-ignore no-explicit-any
type Obj = any;

/** The archive unpacked: its layout's documents and blobs. */
async function layout(
  img: BuiltImage,
): Promise<{ dir: string; index: Obj; manifest: Obj; config: Obj }> {
  const dir = join(work, "layout");
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  await Deno.mkdir(dir);
  await run([TAR, "-xf", img.archive, "-C", dir]);
  const json = async (digest: string) =>
    JSON.parse(await Deno.readTextFile(join(dir, "blobs", "sha256", digest.slice(7))));
  const index = JSON.parse(await Deno.readTextFile(join(dir, "index.json")));
  const manifest = await json(index.manifests[0].digest);
  return { dir, index, manifest, config: await json(manifest.config.digest) };
}

/** The image's root filesystem: every layer unpacked in order. */
async function rootfs(img: BuiltImage): Promise<string> {
  const { dir, manifest } = await layout(img);
  const root = join(work, `rootfs-${crypto.randomUUID().slice(0, 8)}`);
  await Deno.mkdir(root);
  for (const l of manifest.layers) {
    await run([TAR, "-xzf", join(dir, "blobs", "sha256", l.digest.slice(7)), "-C", root]);
  }
  return root;
}

Deno.test({
  name: "deno task image: an OCI archive containerd imports, every blob what its digest says",
  ignore: SKIP !== null,
  sanitizeResources: false,
  async fn() {
    const img = await image();
    const { dir, index, manifest, config } = await layout(img);
    assertEquals(JSON.parse(await Deno.readTextFile(join(dir, "oci-layout"))), {
      imageLayoutVersion: "1.0.0",
    });
    assertEquals(index.manifests.length, 1);
    assertEquals(index.manifests[0].digest, img.digest);
    assertEquals(index.manifests[0].annotations["io.containerd.image.name"], img.ref);
    assertEquals(manifest.mediaType, "application/vnd.oci.image.manifest.v1+json");
    assertEquals(manifest.layers.length, 3, "Debian, deno, enim");
    const blob = (d: string) => join(dir, "blobs", "sha256", d.slice(7));
    for (const d of [index.manifests[0], manifest.config, ...manifest.layers]) {
      assertEquals(`sha256:${await sha256File(blob(d.digest))}`, d.digest);
      assertEquals((await Deno.stat(blob(d.digest))).size, d.size);
    }
    // Each layer's diff_id is the digest of its uncompressed tar.
    for (const [i, l] of manifest.layers.entries()) {
      assertEquals(l.mediaType, "application/vnd.oci.image.layer.v1.tar+gzip");
      const tar = join(work, `layer-${i}.tar`);
      await Deno.writeTextFile(tar, "");
      const out = await new Deno.Command(GZIP, { args: ["-dc", blob(l.digest)], stdout: "piped" })
        .spawn();
      await out.stdout.pipeTo((await Deno.open(tar, { write: true })).writable);
      assert((await out.status).success);
      assertEquals(`sha256:${await sha256File(tar)}`, config.rootfs.diff_ids[i]);
      await Deno.remove(tar);
    }
    // The entry point the DaemonSet's containers run, and the one deploy/Containerfile had.
    assertEquals(config.config.Entrypoint, [IMAGE_ENTRYPOINT]);
    assertEquals(config.config.Cmd, ["agent", "--config", "/etc/enim/agent.jsonc"]);
    assertEquals(config.os, "linux");
    const [ds] = parseAllDocuments(
      await Deno.readTextFile(join(ROOT, "deploy/kubernetes/daemonset.yaml")),
    ).map((d) => d.toJS());
    const agent = ds.spec.template.spec.containers.find((c: Obj) => c.name === "agent");
    assertEquals(agent.command[0], IMAGE_ENTRYPOINT);
    console.error(
      `image_test: layers ${manifest.layers.map((l: Obj) => l.size).join(" + ")} bytes gzip'd`,
    );

    // containerd (Debian's) imports it under its name, and its CRI sees it.
    await using node = await SimulatedNode.start({ startAgent: false });
    const confDir = join(work, "cd-net.d");
    await Deno.mkdir(confDir, { recursive: true });
    await Deno.copyFile(join(ROOT, "deploy/10-enim.conflist"), join(confDir, "10-enim.conflist"));
    const cd = await Containerd.start(node, { binDir: REFERENCE_PLUGINS, confDir, label: "image" });
    try {
      const imported = await runCommand(
        node.sandbox.wrap([
          CTR,
          "--address",
          cd.socket,
          "--namespace",
          "k8s.io",
          "images",
          "import",
          img.archive,
        ]),
        { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
      );
      assertEquals(imported.code, 0, `${imported.stdout}${imported.stderr}`);
      // The CRI plugin learns of the image from containerd's events.
      let status = await cd.cri.imageStatus(img.ref);
      for (let i = 0; status === null && i < 300; i++) {
        await new Promise((r) => setTimeout(r, 100));
        status = await cd.cri.imageStatus(img.ref);
      }
      assert(status !== null, `the CRI sees ${img.ref}`);
      console.error(
        `image_test: containerd imported ${img.ref}: ${JSON.stringify(status)}`.slice(0, 400),
      );
    } finally {
      await cd.close();
    }
  },
});

Deno.test({
  name: "deno task image: the same inputs give the same digest",
  ignore: SKIP !== null,
  sanitizeResources: false,
  async fn() {
    const first = await image();
    const again = await buildImage({ outDir: join(work, "again") });
    assert(again.rootfsCached, "the Debian layer comes from the cache");
    assertEquals(again.digest, first.digest);
    assertEquals(again.size, first.size);
  },
});

Deno.test({
  name:
    "deno task image: the root filesystem holds what the agent runs, and no apt, manuals or translations",
  ignore: SKIP !== null,
  sanitizeResources: false,
  async fn() {
    const img = await image();
    const root = await rootfs(img);
    for (const p of AGENT_PROGRAMS) {
      const st = await Deno.stat(join(root, p));
      assert(st.isFile && (st.mode! & 0o111) !== 0, `${p} is an executable in the image`);
    }
    // The permission set's run list is inside AGENT_PROGRAMS.
    const deno = JSON.parse(await Deno.readTextFile(join(ROOT, "deno.json")));
    for (const p of deno.permissions.enim.run) {
      assert((AGENT_PROGRAMS as readonly string[]).includes(p), `${p} is checked`);
    }
    for (const p of ["/usr/bin/apt", "/usr/bin/apt-get", "/usr/bin/python3"]) {
      assert(!await exists(join(root, p)), `${p} is not in the image`);
    }
    for (const d of ["usr/share/man", "usr/share/locale", "usr/share/info"]) {
      assertEquals(await count(join(root, d), () => true), 0, `${d} is empty`);
    }
    assertEquals(
      await count(join(root, "usr/share/doc"), (n) => n !== "copyright"),
      0,
      "/usr/share/doc holds the copyrights only",
    );
    const names = img.packages.map((p) => p.name);
    for (const p of IMAGE_PACKAGES) assert(names.includes(p), `${p} is installed`);
    const rootfsBytes = (await Deno.stat(await rootfsTar(img))).size;
    console.error(
      `image_test: Debian layer ${
        (rootfsBytes / 1048576).toFixed(1)
      } MiB uncompressed, ${names.length} packages: ${names.join(" ")}`,
    );
    // Debian's Essential set (85 packages with iproute2, nftables and conntrack in bookworm)
    // and nothing more: a package that sneaks in (a Recommends, a new include) shows here.
    assert(names.length <= 90, `${names.length} packages`);
    assert(rootfsBytes <= 80 * 1048576, `the Debian layer is ${rootfsBytes} bytes`);
    // deno runs against the image's glibc and answers as enim.
    const version = await inRoot(root, [IMAGE_ENTRYPOINT, "version"]);
    assertStringIncludes(version, "enim ");
  },
});

Deno.test({
  name:
    "the init container's command installs a plugin that runs on a node with only the reference plugins, no deno and no HOME",
  ignore: SKIP !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const img = await image();
    const root = await rootfs(img);
    // The node: /opt/cni/bin with Debian's reference plugins only, an empty /etc/cni/net.d.
    const nodeDir = join(work, "node");
    const bin = join(nodeDir, "opt/cni/bin");
    await Deno.mkdir(bin, { recursive: true });
    await Deno.mkdir(join(nodeDir, "etc/cni/net.d"), { recursive: true });
    await Deno.mkdir(join(nodeDir, "run/enim"), { recursive: true });
    const reference = [...Deno.readDirSync(REFERENCE_PLUGINS)].map((e) => e.name).sort();
    for (const name of reference) {
      await Deno.copyFile(join(REFERENCE_PLUGINS, name), join(bin, name));
      await Deno.chmod(join(bin, name), 0o755);
    }
    const config = join(work, "config-cni");
    await Deno.mkdir(config, { recursive: true });
    await Deno.copyFile(join(ROOT, "deploy/10-enim.conflist"), join(config, "10-enim.conflist"));

    // The init container's command, from the DaemonSet, in the image's root filesystem
    // with the node's folders mounted where the DaemonSet mounts them.
    const [ds] = parseAllDocuments(
      await Deno.readTextFile(join(ROOT, "deploy/kubernetes/daemonset.yaml")),
    ).map((d) => d.toJS());
    const init = ds.spec.template.spec.initContainers.find((c: Obj) => c.name === "install-cni");
    const installOnce = async () => {
      const mounts = [
        ["/host/opt/cni/bin", bin],
        ["/host/etc/cni/net.d", join(nodeDir, "etc/cni/net.d")],
        ["/config/cni", config],
        ["/host/run/enim", join(nodeDir, "run/enim")],
      ];
      const script = [
        "set -e",
        // What a runtime gives a container: /proc and /dev.
        `mount -t proc proc ${root}/proc`,
        `mount --rbind /dev ${root}/dev`,
        ...mounts.flatMap(([inside, outside]) => [
          `mkdir -p ${root}${inside}`,
          `mount --bind ${outside} ${root}${inside}`,
        ]),
        `exec /usr/sbin/chroot ${root} "$@"`,
      ].join("\n");
      return await run([
        UNSHARE,
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--",
        "/bin/sh",
        "-c",
        script,
        "sh",
        ...init.command,
      ], { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" });
    };
    const before = Date.now();
    const first = await installOnce();
    console.error(`image_test: the init container said: ${first.trim()}`);
    // The replacement marker beside the agent's socket: a new agent is on its way.
    const marker = z.object({ since: z.number() }).parse(
      JSON.parse(await Deno.readTextFile(join(nodeDir, "run/enim/replacing.json"))),
    );
    assert(
      marker.since >= before - 1000 && marker.since <= Date.now(),
      `the marker's since ${marker.since}, the install began at ${before}`,
    );
    const id = (await Deno.readTextFile(join(root, IMAGE_DIR, "ID"))).trim();
    const listing = () => [...Deno.readDirSync(join(bin, "enim.d"))].map((e) => e.name).sort();
    assertEquals(listing(), [id]);
    const launcher = await Deno.readTextFile(join(bin, "enim"));
    assertStringIncludes(launcher, `/opt/cni/bin/enim.d/${id}/deno run`);
    assertEquals((await Deno.stat(join(bin, "enim"))).mode! & 0o777, 0o755);
    // The reference plugins are untouched and nothing else was left in the folder.
    assertEquals(
      [...Deno.readDirSync(bin)].map((e) => e.name).sort(),
      [...reference, "enim", "enim.d"].sort(),
    );

    // A restarted init container copies nothing; an upgrade keeps the previous version
    // until the next one.
    await installOnce();
    assertEquals(listing(), [id]);
    await Deno.writeTextFile(join(root, IMAGE_DIR, "ID"), "0.1.0-next\n");
    await installOnce();
    assertEquals(listing(), ["0.1.0-next", id].sort());
    await Deno.writeTextFile(join(root, IMAGE_DIR, "ID"), "0.1.0-after\n");
    await installOnce();
    assertEquals(listing(), ["0.1.0-after", "0.1.0-next"]);
    await Deno.writeTextFile(join(root, IMAGE_DIR, "ID"), `${id}\n`);
    await installOnce();
    assertEquals(listing(), ["0.1.0-after", id].sort());

    // Run /opt/cni/bin/enim as a runtime does, in a mount namespace where /opt is the node's
    // and neither /usr/local nor /root (this machine's deno, its caches) exist: no deno on
    // PATH, no HOME, nothing but CNI_* in the environment.
    const asRuntime = (env: Record<string, string>, stdin = "", wrap = (a: string[]) => a) => {
      const script = [
        "set -e",
        `mount --bind ${join(nodeDir, "opt")} /opt`,
        "mount -t tmpfs none /usr/local",
        "mount -t tmpfs none /root",
        "if command -v deno >/dev/null 2>&1; then echo 'deno is on PATH' >&2; exit 99; fi",
        'exec /usr/bin/env -i "$@"',
      ].join("\n");
      return runCommand(
        wrap([
          UNSHARE,
          "--mount",
          "--propagation",
          "private",
          "--",
          "/bin/sh",
          "-c",
          script,
          "sh",
          ...Object.entries({ PATH: "/usr/sbin:/usr/bin:/sbin:/bin", ...env }).map(([k, v]) =>
            `${k}=${v}`
          ),
          "/opt/cni/bin/enim",
        ]),
        { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
        stdin,
      );
    };
    // A node with an agent (simulated VPC, mock cloud); its sandbox's /run/enim holds the
    // agent's socket and the plugin's log.
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const inNode = (a: string[]) => node.sandbox.wrap(a);
    const log = { ENIM_LOG_FILE: node.sandbox.inner("cni.log") };
    const version = await asRuntime({ CNI_COMMAND: "VERSION", ...log }, "", inNode);
    assertEquals(version.code, 0, version.stderr);
    assertEquals(JSON.parse(version.stdout).supportedVersions.includes("1.0.0"), true);

    // ADD and DEL through the installed plugin.
    const pod = await node.vpc.pod("img");
    const call = node.podCall(pod);
    const env = {
      CNI_COMMAND: "ADD",
      CNI_PATH: "/opt/cni/bin",
      CNI_CONTAINERID: call.containerId!,
      CNI_IFNAME: call.ifName!,
      CNI_NETNS: call.netns!,
      CNI_ARGS: call.args!,
      ...log,
    };
    const add = await asRuntime(env, JSON.stringify(call.config), inNode);
    assertEquals(add.code, 0, `${add.stdout}${add.stderr}`);
    assert(JSON.parse(add.stdout).ips.length > 0, add.stdout);
    assertEquals((await node.client.attachments()).map((a) => a.containerId), [call.containerId]);
    const del = await asRuntime(
      { ...env, CNI_COMMAND: "DEL" },
      JSON.stringify(call.config),
      inNode,
    );
    assertEquals(del.code, 0, `${del.stdout}${del.stderr}`);
    assertEquals(await node.client.attachments(), []);
  },
});

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

/** How many regular files under `dir` (recursively) have a name `want` accepts. */
async function count(dir: string, want: (name: string) => boolean): Promise<number> {
  let n = 0;
  const walk = async (d: string) => {
    let entries: Deno.DirEntry[];
    try {
      entries = [...Deno.readDirSync(d)];
    } catch {
      return;
    }
    for (const e of entries) {
      if (e.isDirectory) await walk(join(d, e.name));
      else if (e.isFile && want(e.name)) n++;
    }
  };
  await walk(dir);
  return n;
}

/** The Debian layer's tar in the cache (the first layer's diff). */
async function rootfsTar(img: BuiltImage): Promise<string> {
  const { dir, manifest } = await layout(img);
  const tar = join(work, "rootfs-layer.tar");
  const out = await new Deno.Command(GZIP, {
    args: ["-dc", join(dir, "blobs", "sha256", manifest.layers[0].digest.slice(7))],
    stdout: "piped",
  }).spawn();
  await out.stdout.pipeTo((await Deno.open(tar, { write: true, create: true })).writable);
  assert((await out.status).success);
  return tar;
}

/** Runs `argv` in `root` (chroot, with /proc: deno reads /proc/self/exe). */
async function inRoot(root: string, argv: string[]): Promise<string> {
  return await run([
    UNSHARE,
    "--mount",
    "--propagation",
    "private",
    "--pid",
    "--fork",
    "--",
    "/bin/sh",
    "-c",
    `mount -t proc proc ${root}/proc && mount --rbind /dev ${root}/dev && exec /usr/sbin/chroot ${root} "$@"`,
    "sh",
    ...argv,
  ]);
}
