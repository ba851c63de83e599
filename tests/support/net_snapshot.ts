/**
 * A node's network as `enim uninstall` must leave it: its links, addresses, routes, rules
 * and nftables, read in its network namespace, without what changes by itself (counters,
 * ages, indexes). Taken before enim first starts and after uninstall, the two are equal
 * (tests/uninstall_test.ts on a simulated node, tests/k8s_rollout_test.ts on the real one).
 *
 * @module
 */

/** Runs `argv` in the named network namespace and returns its stdout. */
export async function inNetns(netns: string, argv: string[]): Promise<string> {
  const out = await new Deno.Command("/usr/sbin/ip", {
    args: ["netns", "exec", netns, ...argv],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) throw new Error(`${argv.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  return new TextDecoder().decode(out.stdout);
}

/** Options of {@linkcode netSnapshot}. */
export interface SnapshotOptions {
  /** Links left out by MAC (ENIs kept on the node: `--keep-enis`). */
  skipMacs?: Set<string>;
  /**
   * `ruleset`: the whole nftables ruleset, counters left out; `tables`: the tables' names
   * only, and whether any rule, chain or set anywhere names enim (a node whose kube-proxy
   * rewrites its own tables as Services come and go).
   */
  nft?: "ruleset" | "tables";
}

/** The network of the namespace `netns` (the module doc). */
export async function netSnapshot(netns: string, o: SnapshotOptions = {}) {
  const skipMacs = o.skipMacs ?? new Set<string>();
  const ip = async (...a: string[]) =>
    JSON.parse(await inNetns(netns, ["/usr/sbin/ip", "-j", ...a]) || "[]");
  const links = (await ip("link", "show")) as Record<string, unknown>[];
  const kept = links.filter((l) => !skipMacs.has(String(l.address)));
  const names = new Set(kept.map((l) => String(l.ifname)));
  const addrs = ((await ip("addr", "show")) as Record<string, unknown>[])
    .filter((l) => names.has(String(l.ifname)))
    .map((l) => ({
      ifname: l.ifname,
      addrs: (l.addr_info as Record<string, unknown>[]).map((a) => `${a.local}/${a.prefixlen}`),
    }));
  const routes = [];
  for (const f of ["-4", "-6"]) {
    for (const r of (await ip(f, "route", "show", "table", "all")) as Record<string, unknown>[]) {
      if (r.dev && !names.has(String(r.dev))) continue;
      routes.push(
        `${f} ${r.table ?? "main"} ${r.type ?? ""} ${r.dst} ${r.gateway ?? ""} ${r.dev ?? ""}`,
      );
    }
  }
  const rules = [...(await ip("-4", "rule")), ...(await ip("-6", "rule"))].map((r) =>
    JSON.stringify(r)
  );
  // Counters left out: packets pods send meanwhile (router solicitations) move them.
  const ruleset = (await inNetns(netns, ["/usr/sbin/nft", "list", "ruleset"]))
    .replace(/counter packets \d+ bytes \d+/g, "counter");
  const nft = o.nft === "tables"
    ? {
      tables: (await inNetns(netns, ["/usr/sbin/nft", "list", "tables"])).split("\n")
        .filter((l) => l.trim()).sort(),
      namesEnim: /enim/i.test(ruleset),
    }
    : ruleset;
  return {
    links: kept.map((l) => `${l.ifname} ${l.address} ${l.flags}`).sort(),
    addrs,
    routes: routes.sort(),
    rules,
    nft,
  };
}
