/**
 * The plugin's log file: JSON lines appended to one file, rotated to `<file>.1`
 * once it passes a size bound (one old generation is kept, so the disk use is
 * at most about twice the bound).
 *
 * Every failure (no directory, no permission, a full disk) is swallowed: a
 * log problem never changes a CNI result.
 *
 * @module
 */
import type { Sink } from "../lib/log.ts";

/** The default size bound: 10 MiB. */
export const DEFAULT_MAX_LOG_BYTES = 10 * 1024 * 1024;

const encoder = new TextEncoder();

/**
 * A sink appending lines to `path`, rotating to `path.1` when the file is larger than `maxBytes`.
 *
 * @example
 * ```ts
 * const log = new Logger(fileSink("/var/log/enim/cni.log"));
 * ```
 */
export function fileSink(path: string, maxBytes = DEFAULT_MAX_LOG_BYTES): Sink {
  return (line) => {
    try {
      appendLine(path, line, maxBytes);
    } catch {
      // Logging never affects the result.
    }
  };
}

/** Appends one line, creating the directory and rotating as needed. Throws on failure. */
export function appendLine(path: string, line: string, maxBytes = DEFAULT_MAX_LOG_BYTES): void {
  let size = -1;
  try {
    const st = Deno.statSync(path);
    size = st.size;
    // 0640 at most, whoever created it: it names every pod's ENI and addresses.
    if (st.mode !== null && (st.mode & 0o137) !== 0) Deno.chmodSync(path, 0o640);
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
    const dir = path.slice(0, path.lastIndexOf("/"));
    if (dir) Deno.mkdirSync(dir, { recursive: true, mode: 0o750 });
  }
  if (size > maxBytes) {
    // Another plugin run may rotate at the same moment; losing that race is harmless.
    try {
      Deno.renameSync(path, `${path}.1`);
    } catch { /* rotated by someone else */ }
  }
  Deno.writeFileSync(path, encoder.encode(line + "\n"), {
    append: true,
    create: true,
    mode: 0o640,
  });
}
