/**
 * The plugin process's own entry: what `main.ts` runs when `CNI_COMMAND` is set, and
 * nothing else. The launcher (scripts/launcher.ts) starts this file for a CNI call, so
 * `deno run` never reads or parses the CLI's chunks: it reads and parses every module
 * a literal dynamic import can reach before it starts, and `main.js` reaches the whole
 * CLI (the agent, the providers, gRPC), about 0.8 MB, which cost each plugin call
 * about 2.5 ms of start-up and its peak RSS about 1 MB (measured against `main.js`).
 * The build bundles this entry alone (scripts/build.ts): one minified file that imports
 * nothing. The compiled binary keeps `main.ts` as its one entry: it loads modules as they
 * are imported and parses nothing ahead.
 *
 * @module
 */
import { runPluginProcess } from "./forward.ts";

if (import.meta.main) Deno.exit(await runPluginProcess());
