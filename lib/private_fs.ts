/**
 * Files and directories only root may read: the agent's state, lock, socket
 * directory and logs hold every pod's ENI, MAC and addresses.
 *
 * The modes are set explicitly, whatever the umask and whoever created the
 * path (a DaemonSet's `hostPath: DirectoryOrCreate` makes directories 0755,
 * and a container's umask 022 would make new files 0644), and checked after:
 * a path that cannot be made private is an error naming it and its mode, and
 * the agent does not start.
 *
 * @module
 */

/** A path that cannot be made private. */
export class NotPrivateError extends Error {
  readonly path: string;
  constructor(path: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "NotPrivateError";
    this.path = path;
  }
}

const octal = (mode: number) => (mode & 0o7777).toString(8).padStart(4, "0");

/** Whether this process's user owns a file (`uid` null: the platform does not say). */
function ownedByMe(st: Deno.FileInfo): boolean {
  return st.uid === null || st.uid === Deno.uid();
}

/**
 * Makes sure `mode` (0700 by default) is what `path` allows at most: chmods a path
 * this user owns; refuses one it does not own or that stays wider.
 */
async function tighten(path: string, st: Deno.FileInfo, mode: number, what: string) {
  if (st.mode === null || (st.mode & 0o777 & ~mode) === 0) return;
  if (!ownedByMe(st)) {
    throw new NotPrivateError(
      path,
      `The ${what} "${path}" is mode ${
        octal(st.mode)
      } and owned by uid ${st.uid}, not by this user (uid ${Deno.uid()}): enim needs it ${
        octal(mode)
      } at most`,
    );
  }
  try {
    await Deno.chmod(path, mode);
  } catch (err) {
    throw new NotPrivateError(
      path,
      `Cannot make the ${what} "${path}" mode ${octal(mode)} (it is ${octal(st.mode)}): ${
        err instanceof Error ? err.message : String(err)
      }`,
      { cause: err },
    );
  }
  const again = await Deno.stat(path);
  if (again.mode !== null && (again.mode & 0o777 & ~mode) !== 0) {
    throw new NotPrivateError(
      path,
      `The ${what} "${path}" stays mode ${octal(again.mode)} after chmod ${octal(mode)}`,
    );
  }
}

/** Creates `path` (and its parents) if missing and makes it mode `mode` (default 0700). */
export async function privateDir(path: string, mode = 0o700): Promise<void> {
  await Deno.mkdir(path, { recursive: true, mode });
  const st = await Deno.stat(path);
  if (!st.isDirectory) throw new NotPrivateError(path, `"${path}" is not a directory`);
  await tighten(path, st, mode, "directory");
}

/**
 * Creates the file `path` empty with `mode` (default 0600) if it is missing, and
 * tightens it to `mode` if it exists. SQLite creates its `-wal` and `-shm` files
 * with the mode of the database file, so a database made private here stays so.
 */
export async function privateFile(path: string, mode = 0o600): Promise<void> {
  try {
    await Deno.writeFile(path, new Uint8Array(), { createNew: true, mode });
  } catch (err) {
    if (!(err instanceof Deno.errors.AlreadyExists)) throw err;
  }
  const st = await Deno.stat(path);
  if (!st.isFile) throw new NotPrivateError(path, `"${path}" is not a regular file`);
  await tighten(path, st, mode, "file");
}

/** {@linkcode privateFile} for the files that exist among `paths` (a database's -wal, -shm). */
export async function tightenExisting(paths: string[], mode = 0o600): Promise<void> {
  for (const p of paths) {
    let st: Deno.FileInfo;
    try {
      st = await Deno.stat(p);
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) continue;
      throw err;
    }
    await tighten(p, st, mode, "file");
  }
}
