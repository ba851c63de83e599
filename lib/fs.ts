/**
 * Whether a path exists, the one helper for it (scripts and tests ask often).
 *
 * @module
 */

/** Whether `path` exists (a dangling symlink counts: it is not followed). */
export function existsSync(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

/** Whether `path` exists (a dangling symlink counts: it is not followed). */
export async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}
