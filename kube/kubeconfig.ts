/**
 * Reading a kubeconfig (kubectl's `Config`, `clientcmd/api/v1`) into a
 * {@linkcode KubeAccess}: its `current-context` (or the context asked for) names a
 * cluster and a user.
 *
 * - cluster: `server` (https only), `certificate-authority` (a file) or
 *   `certificate-authority-data` (base64 PEM; wins over the file, as in kubectl).
 *   `insecure-skip-tls-verify: true` is refused: Deno verifies every certificate and
 *   can turn verification off only for the whole process (a runtime flag), which
 *   enim will not do for the API server's sake; give the cluster's CA instead.
 *   `tls-server-name` and `proxy-url` are refused too (Deno's fetch can neither
 *   check another name than the URL's host nor is a proxy in enim's permissions).
 * - user: `tokenFile` (re-read as it changes; wins over `token`, as in client-go),
 *   `token`, and `client-certificate(-data)` with `client-key(-data)`. An `exec`
 *   plugin or an `auth-provider` is refused (enim runs no credential helper), and so
 *   are basic auth and impersonation.
 *
 * Relative file paths are relative to the kubeconfig's folder. The file is JSON or
 * YAML: JSON is parsed at once, YAML with npm:yaml, imported only here, when a YAML
 * kubeconfig is read (an in-cluster agent never loads it).
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { type KubeAccess, KubeAccessError, readText, type TokenSpec } from "./access.ts";

const ClusterSchema = z.object({
  server: z.string().check(z.minLength(1)),
  "certificate-authority": z.optional(z.string()),
  "certificate-authority-data": z.optional(z.string()),
  "insecure-skip-tls-verify": z.optional(z.boolean()),
  "tls-server-name": z.optional(z.string()),
  "proxy-url": z.optional(z.string()),
});

const UserSchema = z.object({
  token: z.optional(z.string()),
  tokenFile: z.optional(z.string()),
  "client-certificate": z.optional(z.string()),
  "client-certificate-data": z.optional(z.string()),
  "client-key": z.optional(z.string()),
  "client-key-data": z.optional(z.string()),
  // Refused when present: read only to say so.
  exec: z.optional(z.object({ command: z.optional(z.string()) })),
  "auth-provider": z.optional(z.object({ name: z.optional(z.string()) })),
  username: z.optional(z.string()),
  password: z.optional(z.string()),
  as: z.optional(z.string()),
});

const ContextSchema = z.object({
  cluster: z.string().check(z.minLength(1)),
  user: z.optional(z.string()),
  namespace: z.optional(z.string()),
});

/** A kubeconfig, the parts enim reads (unknown fields such as `preferences` are ignored). */
export const KubeconfigSchema = z.object({
  clusters: z.nullish(z.array(z.object({ name: z.string(), cluster: ClusterSchema }))),
  users: z.nullish(
    z.array(
      z.object({
        name: z.string(),
        user: z.pipe(z.nullish(UserSchema), z.transform((u) => u ?? {})),
      }),
    ),
  ),
  contexts: z.nullish(z.array(z.object({ name: z.string(), context: ContextSchema }))),
  "current-context": z.optional(z.string()),
});
/** A parsed kubeconfig. */
export type Kubeconfig = z.infer<typeof KubeconfigSchema>;

/** Options for {@linkcode readKubeconfig} and {@linkcode kubeconfigAccess}. */
export interface KubeconfigOptions {
  /** The context to use instead of `current-context`. */
  context?: string;
}

/** Reads the kubeconfig at `path` into a {@linkcode KubeAccess}; throws {@linkcode KubeAccessError}. */
export async function readKubeconfig(
  path: string,
  o: KubeconfigOptions = {},
): Promise<KubeAccess> {
  const text = await readText(path, "the kubeconfig");
  return await kubeconfigAccess(await parseKubeconfigText(text, path), path, o);
}

/** The kubeconfig's text as data: JSON when it is JSON, else YAML (npm:yaml, loaded now). */
export async function parseKubeconfigText(text: string, path: string): Promise<unknown> {
  const head = text.trimStart();
  if (head.startsWith("{")) {
    try {
      return JSON.parse(text);
    } catch {
      // YAML's flow style starts with "{" too: let the YAML parser say what is wrong.
    }
  }
  const { LineCounter, parseDocument } = yamlExports(await import("yaml"));
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, prettyErrors: false, uniqueKeys: true });
  if (doc.errors.length > 0) {
    const e = doc.errors[0];
    const { line, col } = lines.linePos(e.pos[0]);
    throw new KubeAccessError(
      `The kubeconfig "${path}" is not valid YAML (line ${line}, column ${col}): ${e.message}`,
    );
  }
  return doc.toJS({ maxAliasCount: 100 });
}

/**
 * A parsed kubeconfig (`doc`, read from `path`) into a {@linkcode KubeAccess}: picks the
 * context, its cluster and user, checks what enim refuses and reads the files they name.
 */
export async function kubeconfigAccess(
  doc: unknown,
  path: string,
  o: KubeconfigOptions = {},
): Promise<KubeAccess> {
  const fail = (why: string): never => {
    throw new KubeAccessError(`Cannot use the kubeconfig "${path}": ${why}`);
  };
  const parsed = KubeconfigSchema.safeParse(doc ?? {});
  if (!parsed.success) {
    const i = parsed.error.issues[0];
    return fail(`${i.path.map(String).join(".") || "(top level)"}: ${i.message}`);
  }
  const cfg = parsed.data;
  const contextName = o.context || cfg["current-context"];
  if (!contextName) return fail("it has no current-context (and no context was chosen)");
  const context = cfg.contexts?.find((c) => c.name === contextName)?.context ??
    fail(`it has no context "${contextName}"`);
  const cluster = cfg.clusters?.find((c) => c.name === context.cluster)?.cluster ??
    fail(`context "${contextName}" names cluster "${context.cluster}", which it does not define`);
  const user = context.user === undefined || context.user === ""
    ? {}
    : cfg.users?.find((u) => u.name === context.user)?.user ??
      fail(`context "${contextName}" names user "${context.user}", which it does not define`);

  const where = `cluster "${context.cluster}"`;
  let url: URL;
  try {
    url = new URL(cluster.server);
  } catch {
    return fail(`${where} has server "${cluster.server}", which is not a URL`);
  }
  if (url.protocol !== "https:") {
    return fail(
      `${where} has server "${cluster.server}": enim talks to the API server over https only`,
    );
  }
  if (url.search !== "" || url.hash !== "" || url.username !== "" || url.password !== "") {
    return fail(`${where} has server "${cluster.server}", with parts a server URL does not have`);
  }
  if (cluster["insecure-skip-tls-verify"] === true) {
    return fail(
      `${where} sets insecure-skip-tls-verify, which enim refuses: Deno can skip certificate ` +
        "checks only for the whole process; give the cluster's CA with certificate-authority " +
        "or certificate-authority-data",
    );
  }
  if (cluster["tls-server-name"] !== undefined) {
    return fail(
      `${where} sets tls-server-name "${cluster["tls-server-name"]}", which enim cannot honour ` +
        "(Deno checks the certificate against the server URL's host): put that name in server",
    );
  }
  if (cluster["proxy-url"] !== undefined) {
    return fail(`${where} sets proxy-url, which enim does not support: reach the server directly`);
  }

  const who = `user "${context.user}"`;
  if (user.exec !== undefined) {
    return fail(
      `${who} authenticates with an exec plugin` +
        (user.exec.command ? ` ("${user.exec.command}")` : "") +
        ", which enim does not run: give it a token, a tokenFile or a client certificate",
    );
  }
  if (user["auth-provider"] !== undefined) {
    return fail(
      `${who} authenticates with the auth-provider` +
        (user["auth-provider"].name ? ` "${user["auth-provider"].name}"` : "") +
        ", which enim does not support: give it a token, a tokenFile or a client certificate",
    );
  }
  if (user.username !== undefined || user.password !== undefined) {
    return fail(`${who} uses basic authentication, which Kubernetes no longer supports`);
  }
  if (user.as !== undefined) {
    return fail(`${who} impersonates "${user.as}", which enim does not do`);
  }

  const dir = folderOf(path);
  const file = (p: string) => p.startsWith("/") ? p : `${dir}/${p}`;

  let caCerts: string[] | undefined;
  if (cluster["certificate-authority-data"] !== undefined) {
    caCerts = [
      pemFromBase64(
        cluster["certificate-authority-data"],
        `${where}'s certificate-authority-data`,
        fail,
      ),
    ];
  } else if (cluster["certificate-authority"] !== undefined) {
    caCerts = [
      await readText(file(cluster["certificate-authority"]), `${where}'s certificate-authority`),
    ];
  }

  const cert = user["client-certificate-data"] !== undefined
    ? pemFromBase64(user["client-certificate-data"], `${who}'s client-certificate-data`, fail)
    : user["client-certificate"] !== undefined
    ? await readText(file(user["client-certificate"]), `${who}'s client-certificate`)
    : undefined;
  const key = user["client-key-data"] !== undefined
    ? pemFromBase64(user["client-key-data"], `${who}'s client-key-data`, fail)
    : user["client-key"] !== undefined
    ? await readText(file(user["client-key"]), `${who}'s client-key`)
    : undefined;
  if ((cert === undefined) !== (key === undefined)) {
    return fail(
      `${who} has a client ${cert === undefined ? "key" : "certificate"} without its ${
        cert === undefined ? "certificate" : "key"
      }`,
    );
  }

  let token: TokenSpec | undefined;
  if (user.tokenFile !== undefined && user.tokenFile !== "") token = { file: file(user.tokenFile) };
  else if (user.token !== undefined && user.token !== "") token = { value: user.token };

  return {
    server: url.href.replace(/\/+$/, ""),
    ...(caCerts ? { caCerts } : {}),
    ...(cert !== undefined && key !== undefined ? { clientCert: { cert, key } } : {}),
    ...(token ? { token } : {}),
    source: `kubeconfig "${path}" context "${contextName}"`,
  };
}

/** npm:yaml's module as the source sees it. */
type Yaml = typeof import("yaml");

/**
 * npm:yaml's exports from a dynamic import of it: the module itself from source; in the
 * built bundle (deno bundle wraps the package's CommonJS build in a chunk of its own)
 * they are under `default`, and the named ones are absent.
 */
export function yamlExports(mod: Yaml | { default: Yaml }): Yaml {
  return "parseDocument" in mod ? mod : mod.default;
}

/** The folder holding `path` (relative paths in a kubeconfig are relative to it). */
function folderOf(path: string): string {
  const i = path.lastIndexOf("/");
  if (i < 0) return ".";
  return i === 0 ? "" : path.slice(0, i);
}

/** Base64 to PEM text, or `fail` naming the field. */
function pemFromBase64(data: string, what: string, fail: (why: string) => never): string {
  let text: string;
  try {
    const bin = atob(data.replace(/\s+/g, ""));
    text = new TextDecoder("utf-8", { fatal: true }).decode(
      Uint8Array.from(bin, (c) => c.charCodeAt(0)),
    );
  } catch {
    return fail(`${what} is not base64`);
  }
  if (!text.includes("-----BEGIN ")) return fail(`${what} is not a PEM certificate or key`);
  return text;
}
