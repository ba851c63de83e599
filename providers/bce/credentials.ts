/**
 * The BCE provider's credentials: a JSON file (`{accessKeyId, secretAccessKey,
 * sessionToken?}`) readable and writable by its owner only, read again when it
 * changes (a Kubernetes Secret mounted as files rotates the key without a
 * restart), or the `ENIM_BCE_*` environment. Never logged, never in an error.
 *
 * @module
 */
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import { ProviderError } from "../contract.ts";
import type { Credentials } from "./signer.ts";

const CredentialsFileSchema = z.object({
  accessKeyId: z.string().check(z.minLength(1)),
  secretAccessKey: z.string().check(z.minLength(1)),
  sessionToken: z.optional(z.string().check(z.minLength(1))),
});

/**
 * Loads credentials from the file (refusing one that group or others can read
 * or write) or from the environment.
 */
export function loadCredentials(
  file: string | undefined,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): Credentials {
  if (file) {
    let info: Deno.FileInfo;
    try {
      info = Deno.statSync(file);
    } catch (e) {
      throw new ProviderError(
        "auth_failed",
        `Cannot read the BCE credentials file "${file}": ${(e as Error).message}`,
      );
    }
    const mode = info.mode ?? 0;
    if ((mode & 0o066) !== 0) {
      throw new ProviderError(
        "auth_failed",
        `Refusing the BCE credentials file "${file}": it is accessible by group or others (mode ${
          (mode & 0o777).toString(8).padStart(4, "0")
        }); run chmod 600 on it`,
      );
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(Deno.readTextFileSync(file));
    } catch {
      throw new ProviderError(
        "auth_failed",
        `The BCE credentials file "${file}" is not valid JSON`,
      );
    }
    const r = CredentialsFileSchema.safeParse(parsed);
    if (!r.success) {
      throw new ProviderError(
        "auth_failed",
        `The BCE credentials file "${file}" needs string fields accessKeyId and secretAccessKey (and optionally sessionToken)`,
      );
    }
    return r.data;
  }
  const accessKeyId = env("ENIM_BCE_ACCESS_KEY_ID");
  const secretAccessKey = env("ENIM_BCE_SECRET_ACCESS_KEY");
  const sessionToken = env("ENIM_BCE_SESSION_TOKEN") || undefined;
  if (!accessKeyId || !secretAccessKey) {
    throw new ProviderError(
      "auth_failed",
      "No BCE credentials: set credentialsFile or ENIM_BCE_ACCESS_KEY_ID and ENIM_BCE_SECRET_ACCESS_KEY",
    );
  }
  return { accessKeyId, secretAccessKey, ...(sessionToken ? { sessionToken } : {}) };
}

/** What identifies one version of a file: a rewrite or a Secret's swap changes it. */
function versionOf(info: Deno.FileInfo): string {
  return `${info.ino ?? ""}:${info.mtime?.getTime() ?? ""}:${info.size}`;
}

/** Something that logs a warning (the provider's logger). */
interface Warner {
  warn(message: string, fields?: Record<string, unknown>): void;
}

/**
 * The credentials, as a function the client calls before each signature. From the
 * environment: read once. From a file: read now (failing as {@linkcode loadCredentials}
 * does), then read again whenever the file changes (its inode, mtime or size, checked
 * with one `stat` per request), so the next signed request carries a rotated key: a
 * Kubernetes Secret mounted as files is swapped atomically by the kubelet (a new
 * `..data` folder). A new version that cannot be used (a half-written file, a mode
 * opened to group or others) is refused with a warning, and the last good
 * credentials stay in use.
 */
export function credentialsSource(
  file: string | undefined,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
  log?: Warner,
): () => Credentials {
  let current = loadCredentials(file, env);
  if (!file) return () => current;
  let version = versionOf(Deno.statSync(file));
  let refused = "";
  return () => {
    let now: string;
    try {
      now = versionOf(Deno.statSync(file));
    } catch (e) {
      log?.warn("Cannot stat the BCE credentials file; using the last credentials read", {
        file,
        error: (e as Error).message,
      });
      return current;
    }
    if (now === version || now === refused) return current;
    try {
      const next = loadCredentials(file, env);
      const rotated = next.accessKeyId !== current.accessKeyId;
      current = next;
      version = now;
      refused = "";
      if (rotated) {
        log?.warn("The BCE credentials file changed: the next requests use the new key", {
          file,
          accessKeyId: next.accessKeyId,
        });
      }
    } catch (e) {
      refused = now;
      log?.warn(
        "The BCE credentials file changed but cannot be used; keeping the last good credentials",
        {
          file,
          error: (e as Error).message,
        },
      );
    }
    return current;
  };
}
