/**
 * enim's version, the one place it is defined: `enim version`, the agent's status (API and
 * `enim status`), its `enim_build_info` metric, the plugin's calls (`api/wire.ts`
 * `PLUGIN_VERSION_HEADER`), the bundle's BUILD.json and the image's label read it.
 * `deno.json`'s "version" says the same (`scripts/releases_test.ts` keeps them in step);
 * released versions and their commits are in `releases.json` and `CHANGELOG.md`.
 */
export const VERSION = "0.2.0";
