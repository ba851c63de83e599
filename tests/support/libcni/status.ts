/**
 * CNI STATUS as containerd ≥ 2.0.1 asks it: its CRI `Status` (kubelet's runtime status,
 * every few seconds) runs go-cni's `Status()`, which runs libcni's `GetStatusNetworkList`
 * for each network (containerd/go-cni#123). Debian's libcni (1.1.2, the Go driver beside
 * this file) predates STATUS, so this module does what libcni ≥ 1.2's
 * `GetStatusNetworkList` does, as its source (containernetworking/cni `libcni/api.go`,
 * `libcni/conf.go`, `pkg/invoke/args.go`) describes it:
 *
 * - the conflist's version: its `cniVersion`, or the highest of `cniVersions` that
 *   libcni speaks (1.1.0 at most); below 1.1.0 there is no STATUS and nothing is run
 *   (so go-cni's loopback network, spec 0.3.1, never gets one);
 * - each plugin of the list in order, its own object with the list's `name` and
 *   `cniVersion` set in it (no `prevResult`, no `runtimeConfig`);
 * - the plugin found by its `type` in the plugin directories, exec'd with
 *   `CNI_COMMAND=STATUS`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_ARGS` and `CNI_IFNAME`
 *   all present and empty, `CNI_PATH` the directories joined by ":", then the runtime's
 *   own environment, and the config on stdin;
 * - the first plugin that fails ends the call with its error (its CNI error object on
 *   stdout); containerd then reports NetworkReady=false with that message.
 *
 * It runs inside a simulated node's sandbox, so the plugin reaches that node's agent.
 *
 * @module
 */
import * as z from "zod/mini";
import { runInNode } from "../clients.ts";
import type { SimulatedNode } from "../node.ts";

/** The newest spec version libcni ≥ 1.2 speaks (`version.Current()`). */
const LIBCNI_CURRENT = [1, 1, 0];

const ConflistSchema = z.looseObject({
  name: z.string(),
  cniVersion: z.optional(z.string()),
  cniVersions: z.optional(z.array(z.string())),
  plugins: z.array(z.looseObject({ type: z.string() })),
});

const CniErrorSchema = z.looseObject({ code: z.number(), msg: z.string() });

function parts(v: string): number[] {
  return v.split(".").map(Number);
}

function compare(a: number[], b: number[]): number {
  for (let i = 0; i < 3; i++) if ((a[i] ?? 0) !== (b[i] ?? 0)) return (a[i] ?? 0) - (b[i] ?? 0);
  return 0;
}

/** The list's version as libcni picks it: the highest it speaks of `cniVersions` and `cniVersion`. */
export function listVersion(list: z.infer<typeof ConflistSchema>): string {
  const candidates = [...(list.cniVersions ?? []), ...(list.cniVersion ? [list.cniVersion] : [])]
    .filter((v) => compare(parts(v), LIBCNI_CURRENT) <= 0)
    .sort((a, b) => compare(parts(a), parts(b)));
  return candidates.at(-1) ?? list.cniVersion ?? "";
}

/** What one `GetStatusNetworkList` came to. */
export type StatusOutcome =
  | { ok: true; ran: string[] }
  | { ok: false; plugin: string; exit: number; code: number | null; msg: string };

/**
 * Runs `GetStatusNetworkList` for the conflist `text` against `pluginDirs` inside
 * `node`'s sandbox, with `env` as the runtime's own environment.
 */
export async function getStatusNetworkList(
  node: SimulatedNode,
  text: string,
  pluginDirs: string[],
  env: Record<string, string> = {},
): Promise<StatusOutcome> {
  const list = z.parse(ConflistSchema, JSON.parse(text));
  const version = listVersion(list);
  if (compare(parts(version), [1, 1, 0]) < 0) return { ok: true, ran: [] };
  const ran: string[] = [];
  for (const plugin of list.plugins) {
    const config = { ...plugin, name: list.name, cniVersion: version };
    const dir = pluginDirs.find((d) => {
      try {
        return Deno.statSync(`${d}/${plugin.type}`).isFile;
      } catch {
        return false;
      }
    });
    if (!dir) {
      return { ok: false, plugin: plugin.type, exit: -1, code: null, msg: "plugin not found" };
    }
    const out = await runInNode(node, [`${dir}/${plugin.type}`], {
      CNI_COMMAND: "STATUS",
      CNI_CONTAINERID: "",
      CNI_NETNS: "",
      CNI_ARGS: "",
      CNI_IFNAME: "",
      CNI_PATH: pluginDirs.join(":"),
      ...env,
    }, JSON.stringify(config));
    ran.push(plugin.type);
    if (out.code !== 0) {
      const parsed = z.safeParse(CniErrorSchema, safeJson(out.stdout));
      return {
        ok: false,
        plugin: plugin.type,
        exit: out.code,
        code: parsed.success ? parsed.data.code : null,
        msg: parsed.success ? parsed.data.msg : `${out.stdout}${out.stderr}`,
      };
    }
  }
  return { ok: true, ran };
}

function safeJson(s: string): unknown {
  try {
    return JSON.parse(s);
  } catch {
    return null;
  }
}
