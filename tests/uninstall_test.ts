/**
 * `enim uninstall` on a simulated node with pods (issue 51 item 5), with the built bundle
 * and the production permission set: refused while the agent runs; `--dry-run` changes
 * nothing; then it undoes every pod's attachment, releases (or keeps) the ENIs, removes
 * enim's tables, rules and host links, the state, the plugin and the conflist, and the
 * node's network (links, addresses, routes, rules, nftables ruleset) is what it was before
 * enim — compared as snapshots taken before the agent first started and after.
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { SimulatedNode } from "./support/node.ts";
import { inNetns, netSnapshot } from "./support/net_snapshot.ts";

const AS_ROOT = Deno.uid() === 0;
const SERVICE_CIDRS = ["172.30.0.0/16", "fd00:30::/108"];

async function inNode(node: SimulatedNode, argv: string[]): Promise<string> {
  return await inNetns(node.vpc.node.name, argv);
}

/** The node's network (tests/support/net_snapshot.ts). */
function snapshot(node: SimulatedNode, skipMacs: Set<string> = new Set()) {
  return netSnapshot(node.vpc.node.name, { skipMacs });
}

async function exists(path: string) {
  return await Deno.lstat(path).then(() => true, () => false);
}

async function nodeWithPods(): Promise<SimulatedNode> {
  const node = await SimulatedNode.start({ nodeNic: true, mock: { enis: 4 }, startAgent: false });
  return node;
}

for (const mode of ["--release-enis", "--keep-enis"] as const) {
  Deno.test({
    name:
      `enim uninstall ${mode}: refused while the agent runs, a dry run changes nothing, then the node's network is what it was before enim`,
    ignore: !AS_ROOT,
    async fn(t) {
      await using node = await nodeWithPods();
      const before = await snapshot(node);
      await Deno.mkdir(node.sandbox.host("cni-bin"));
      await Deno.mkdir(node.sandbox.host("net.d"));
      await Deno.writeTextFile(node.sandbox.host("cni-bin/enim"), "#!/bin/sh\n");
      // What the image's installer puts beside the plugin (scripts/image.ts installScript).
      await Deno.mkdir(node.sandbox.host("cni-bin/enim.d/0.2.0-test/bundle"), { recursive: true });
      await Deno.writeTextFile(node.sandbox.host("cni-bin/enim.d/0.2.0-test/deno"), "");
      await Deno.writeTextFile(node.sandbox.host("net.d/10-enim.conflist"), "{}\n");
      await Deno.writeTextFile(node.sandbox.host("net.d/99-other.conflist"), "{}\n");
      await node.startAgent();
      const config = node.netconf("1.1.0", { serviceCidrs: SERVICE_CIDRS });
      const pods = [await node.vpc.pod("a"), await node.vpc.pod("b")];
      for (const p of pods) await node.add(p, { config });
      const enis = await node.client.enis();
      const macs = new Set(enis.map((e) => e.mac));
      assert((await node.client.attachments()).every((a) => a.hostLink), "host links made");
      const args = [
        "uninstall",
        mode,
        "--config",
        node.sandbox.inner("agent.jsonc"),
        "--cni-bin-dir",
        node.sandbox.inner("cni-bin"),
        "--cni-conf-dir",
        node.sandbox.inner("net.d"),
      ];

      await t.step("refused while the agent runs (exit 2, saying why)", async () => {
        const r = await node.enim(args);
        assertEquals(r.code, 2, r.stdout + r.stderr);
        assertStringIncludes(r.stderr, "is running");
      });
      await node.stopAgent("SIGTERM");
      const stopped = await snapshot(node);

      await t.step("--dry-run says what it would do and changes nothing", async () => {
        const r = await node.enim([...args, "--dry-run"]);
        assertEquals(r.code, 0, r.stdout + r.stderr);
        assertStringIncludes(r.stdout, "would do  undo default/a's attachment");
        assertStringIncludes(r.stdout, "would do  remove nftables table inet enim");
        assertStringIncludes(r.stdout, "nothing changed");
        assertEquals(await snapshot(node), stopped);
        assert(await exists(node.sandbox.host("enim.db")));
      });

      await t.step(`uninstall ${mode}: every step done, printed`, async () => {
        const r = await node.enim(args);
        console.error(r.stdout);
        assertEquals(r.code, 0, r.stdout + r.stderr);
        assertStringIncludes(r.stdout, "done      undo default/a's attachment");
        assertStringIncludes(r.stdout, "done      undo default/b's attachment");
        for (const e of enis) {
          assertStringIncludes(
            r.stdout,
            mode === "--release-enis" ? `done      give ${e.id}` : `done      keep ${e.id}`,
          );
        }
        for (
          const f of [
            "enim.db",
            "agent.json",
            "cni-bin/enim",
            "cni-bin/enim.d",
            "net.d/10-enim.conflist",
          ]
        ) {
          assert(!(await exists(node.sandbox.host(f))), `${f} is gone`);
        }
        assert(await exists(node.sandbox.host("net.d/99-other.conflist")), "others' kept");
      });

      await t.step("the node's network is what it was before enim", async () => {
        if (mode === "--release-enis") {
          assertEquals(await snapshot(node), before);
        } else {
          // The kept ENIs' devices stay on the node, down and without addresses.
          assertEquals(await snapshot(node, macs), before);
          const links = JSON.parse(await inNode(node, ["/usr/sbin/ip", "-j", "addr", "show"]));
          for (const l of links.filter((l: { address: string }) => macs.has(l.address))) {
            assertEquals(l.addr_info.filter((a: { scope: string }) => a.scope !== "link"), []);
            assert(!String(l.flags).includes("UP") || l.operstate === "DOWN", l.ifname);
          }
        }
      });
    },
  });
}
