/** Path helpers for the scripts (node:path stands in for @std/path). */
import { fileURLToPath } from "node:url";
export { dirname, join, resolve } from "node:path";

/** The file path of a `file:` URL. */
export function fromFileUrl(url: string | URL): string {
  return fileURLToPath(url);
}

/** The repository root. */
export const ROOT: string = fileURLToPath(new URL("..", import.meta.url)).replace(/\/$/, "");
