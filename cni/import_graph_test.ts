/**
 * The plugin's start-up cost is its import graph: the CNI entry must load only
 * what CNI mode needs (cni/, the agent API schemas and client, the logger, zod),
 * never ipaddr.js, commander, prom-client, the agent, the manager or the providers.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { ROOT } from "../tests/_enim.ts";

/** Every module specifier `deno info` resolves from `entry`. */
async function moduleGraph(entry: string): Promise<string[]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "--config", `${ROOT}/deno.json`, entry],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert(out.success, new TextDecoder().decode(out.stderr));
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: { specifier: string }[];
  };
  return info.modules.map((m) => m.specifier.replace(`file://${ROOT}/`, ""));
}

Deno.test("the CNI entry's module graph excludes the agent-only modules and packages", async () => {
  const graph = await moduleGraph(`${ROOT}/cni/main.ts`);
  assert(graph.includes("cni/plugin.ts"), `unexpected graph: ${graph.join(", ")}`);
  const forbidden = graph.filter((s) =>
    /ipaddr|commander|prom-client|yaml|jsonc-parser|fast-check/.test(s) ||
    /^(cli|providers\/(?!schema\.ts$)|netns|manager\/(?!api_schema\.ts$|client\.ts$))/.test(s) ||
    s === "lib/metrics.ts" || s === "node:sqlite"
  );
  assertEquals(forbidden, [], "modules the plugin must not load");
  const npm = graph.filter((s) => s.startsWith("npm:")).map((s) => s.replace(/@[^@]*$/, ""));
  assertEquals(npm, ["npm:/zod"], "the only npm package on the CNI path");
});
