/**
 * enim's entry point: picks the role and nothing else.
 *
 * - `CNI_COMMAND` set: the CNI plugin (only `cni/` and the agent client load).
 * - otherwise: the commander program (`agent`, `gc`, `status`, `version`).
 *
 * @module
 */

if (import.meta.main) {
  if (Deno.env.get("CNI_COMMAND") !== undefined) {
    const { runPluginFromProcess } = await import("./cni/main.ts");
    Deno.exit(await runPluginFromProcess());
  } else {
    const { runCli } = await import("./cli/mod.ts");
    Deno.exit(await runCli(Deno.args));
  }
}
