/** Path helpers for the scripts (node:path stands in for @std/path). */
import { fileURLToPath } from "node:url";
export { dirname, join, resolve } from "node:path";

/** The file path of a `file:` URL. */
export function fromFileUrl(url: string | URL): string {
  return fileURLToPath(url);
}

/** The repository root. */
export const ROOT: string = fileURLToPath(new URL("..", import.meta.url)).replace(/\/$/, "");

/**
 * The folders of the shipped program, beside `main.ts`: what the bundle is built from
 * (scripts/build.ts), what the bundle's lazy imports are checked in
 * (scripts/bundle_lazy_test.ts) and, with the tests', what the tool paths are checked in
 * (tests/support/tool_paths.ts).
 */
export const SHIPPED_DIRS: readonly string[] = [
  "agent",
  "api",
  "cli",
  "cni",
  "kube",
  "lib",
  "manager",
  "netns",
  "policy",
  "providers",
];
