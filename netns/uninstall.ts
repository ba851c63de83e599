/**
 * What enim leaves in the node's own namespace that `enim uninstall` removes once every
 * pod's attachment is gone: its nftables tables (`inet enim`, the host links' node side;
 * `inet enim_policy`, NetworkPolicy's), host links' node ends (`enimh…`), the node's
 * routing rules for them (priorities {@linkcode NODE_RULE_PREF}) and the routes of their
 * tables ({@linkcode HOST_LINK_TABLE} and each pod's, from {@linkcode NODE_TABLE_BASE}).
 * A DEL removes a pod's share of these; what is left is what a crash or a bug left.
 *
 * @module
 */
import { IP_BIN, NFT_BIN } from "./ip.ts";
import { HOST_LINK_TABLE, NFT_TABLE, NODE_RULE_PREF, NODE_TABLE_BASE } from "./host_link.ts";

/** One thing to remove: what it is (as printed) and the command that removes it. */
export interface KernelLeftover {
  what: string;
  argv: string[];
}

async function run(argv: string[]): Promise<string> {
  const out = await new Deno.Command(argv[0], {
    args: argv.slice(1),
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(
      `${argv.join(" ")} failed: ${new TextDecoder().decode(out.stderr).trim()}`,
    );
  }
  return new TextDecoder().decode(out.stdout);
}

function json(text: string): unknown {
  return text.trim() ? JSON.parse(text) : [];
}

/**
 * enim's leftovers in the current network namespace, tables first, links last; `tables`
 * names enim's other `inet` tables besides the host links' (NetworkPolicy's, from the
 * agent, which knows it).
 */
export async function kernelLeftovers(tables: readonly string[] = []): Promise<KernelLeftover[]> {
  const out: KernelLeftover[] = [];
  const listed = json(await run([NFT_BIN, "-j", "list", "tables"])) as {
    nftables?: { table?: { family?: string; name?: string } }[];
  };
  const ours = new Set([NFT_TABLE, ...tables]);
  for (const o of listed.nftables ?? []) {
    const t = o.table;
    if (t?.family === "inet" && t.name !== undefined && ours.has(t.name)) {
      out.push({
        what: `nftables table inet ${t.name}`,
        argv: [NFT_BIN, "delete", "table", "inet", t.name],
      });
    }
  }
  const prefs = new Set<number>(Object.values(NODE_RULE_PREF));
  for (const family of ["-4", "-6"]) {
    const rules = json(await run([IP_BIN, "-j", family, "rule", "show"])) as {
      priority?: number;
      table?: string;
    }[];
    const seen = new Set<string>();
    for (const r of rules) {
      if (r.priority === undefined || !prefs.has(r.priority)) continue;
      out.push({
        what: `IPv${family.slice(1)} rule priority ${r.priority} (lookup ${r.table ?? "?"})`,
        argv: [IP_BIN, family, "rule", "del", "pref", String(r.priority)],
      });
      const table = Number(r.table);
      if (Number.isInteger(table) && table >= NODE_TABLE_BASE && !seen.has(r.table!)) {
        seen.add(r.table!);
        out.push({
          what: `IPv${family.slice(1)} routes of table ${table}`,
          argv: [IP_BIN, family, "route", "flush", "table", String(table)],
        });
      }
    }
    // A table nothing was ever put in does not exist: nothing to flush.
    const hostRoutes = json(
      await run([IP_BIN, "-j", family, "route", "show", "table", String(HOST_LINK_TABLE)])
        .catch((err) => {
          if (/table does not exist/i.test(String(err))) return "[]";
          throw err;
        }),
    ) as unknown[];
    if (hostRoutes.length > 0) {
      out.push({
        what: `IPv${family.slice(1)} routes of table ${HOST_LINK_TABLE}`,
        argv: [IP_BIN, family, "route", "flush", "table", String(HOST_LINK_TABLE)],
      });
    }
  }
  const links = json(await run([IP_BIN, "-j", "link", "show"])) as { ifname?: string }[];
  for (const l of links) {
    if (l.ifname?.startsWith("enimh")) {
      out.push({ what: `host link ${l.ifname}`, argv: [IP_BIN, "link", "del", l.ifname] });
    }
  }
  return out;
}

/** Removes one leftover (a rule deleted meanwhile, a link gone with its peer: not an error). */
export async function removeLeftover(l: KernelLeftover): Promise<void> {
  try {
    await run(l.argv);
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    if (/No such file|Cannot find device|No such process|does not exist/i.test(why)) return;
    throw err;
  }
}
