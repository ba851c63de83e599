/**
 * Scratch directories for tests under /run/enim/test-<random>/ (inside the enim
 * permission set), removed when the test ends.
 *
 * @module
 */

/** Creates /run/enim/test-<random>/, runs `fn` with its path, and removes it afterwards. */
export async function withRunDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = `/run/enim/test-${crypto.randomUUID().slice(0, 8)}`;
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  try {
    return await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}
