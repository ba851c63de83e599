/**
 * enim's entry point: picks the role and nothing else.
 *
 * - `CNI_COMMAND` set: the CNI plugin process (`cni/forward.ts`, which loads
 *   nothing else: it forwards the call to the agent).
 * - otherwise: the commander program (`agent`, `gc`, `status`, `version`).
 *
 * @module
 */

if (import.meta.main) {
  let cni = false;
  try {
    cni = Deno.env.get("CNI_COMMAND") !== undefined;
  } catch { /* no env permission for it: not a CNI call */ }
  if (cni) {
    const { runPluginProcess } = await import("./cni/forward.ts");
    Deno.exit(await runPluginProcess());
  } else {
    const { runCli } = await import("./cli/mod.ts");
    Deno.exit(await runCli(Deno.args));
  }
}
