/**
 * The tests' kubelet runs in a process of its own (issue 41 item 4): a test process that
 * held kubelet's gRPC servers beside the plugin's clients of them was now and then aborted
 * inside nghttp2, taking the whole `deno test` run with it.
 */
import { assert, assertEquals } from "../../../lib/assert.ts";
import { withRunDir } from "../run_dir.ts";
import { FakeKubelet } from "./fake_kubelet.ts";

/** The inodes of the unix sockets bound to `path` (from /proc/net/unix). */
function boundInodes(path: string): string[] {
  return Deno.readTextFileSync("/proc/net/unix").split("\n").slice(1)
    .map((l) => l.trim().split(/\s+/))
    .filter((f) => f[7] === path)
    .map((f) => f[6]);
}

/** The inodes of the sockets this process holds. */
function ownSockets(): Set<string> {
  const out = new Set<string>();
  for (const e of Deno.readDirSync("/proc/self/fd")) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(Deno.readLinkSync(`/proc/self/fd/${e.name}`));
      if (m) out.add(m[1]);
    } catch { /* closed meanwhile */ }
  }
  return out;
}

Deno.test("the tests' kubelet serves its sockets from another process than the test's", async () => {
  await withRunDir(async (root) => {
    const dir = `${root}/device-plugins`;
    await Deno.mkdir(dir);
    const kubelet = await FakeKubelet.start(dir, { podResources: true });
    try {
      for (const socket of [kubelet.socket, kubelet.podResourcesSocket]) {
        const inodes = boundInodes(socket);
        assert(inodes.length > 0, `"${socket}" is served`);
        const own = ownSockets();
        assertEquals(inodes.filter((i) => own.has(i)), [], `"${socket}" is served from here`);
      }
    } finally {
      await kubelet[Symbol.asyncDispose]();
    }
    assertEquals(boundInodes(kubelet.socket), [], "gone once disposed");
  });
});
