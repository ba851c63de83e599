/**
 * What a client needs to reach the Kubernetes API server ({@linkcode KubeAccess}: the
 * server's URL, the CAs to trust, the credentials), the in-cluster way of finding it
 * (`KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` and the service account's files),
 * and the node's name. kube/kubeconfig.ts reads a kubeconfig into a {@linkcode KubeAccess};
 * kube/resolve.ts picks between the two.
 *
 * @module
 */
/** Where a pod's service-account credentials are mounted. */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

/** A bearer token: given (from a kubeconfig), or read from a file that may change. */
export type TokenSpec = { value: string } | { file: string };

/** What a client needs to talk to one API server. */
export interface KubeAccess {
  /** `https://host[:port][/prefix]`, no trailing slash. */
  server: string;
  /** CA certificates (PEM) to verify the server with; Deno's default roots when absent. */
  caCerts?: string[];
  /** A client certificate and its key (PEM), for mutual TLS. */
  clientCert?: { cert: string; key: string };
  /** The bearer token, if any. */
  token?: TokenSpec;
  /** Where this came from, for logs and errors (`kubeconfig "/etc/enim/kubeconfig" context "prod"`). */
  source: string;
}

/** The API access could not be configured; the message says what to fix. */
export class KubeAccessError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "KubeAccessError";
  }
}

/** The environment variables the Kubernetes access reads. */
export interface KubeEnv {
  KUBECONFIG?: string;
  KUBERNETES_SERVICE_HOST?: string;
  KUBERNETES_SERVICE_PORT?: string;
  NODE_NAME?: string;
}

/** The names in {@linkcode KubeEnv}, for reading them from the process. */
export const KUBE_ENV_NAMES = [
  "KUBECONFIG",
  "KUBERNETES_SERVICE_HOST",
  "KUBERNETES_SERVICE_PORT",
  "NODE_NAME",
] as const;

/** The process's {@linkcode KubeEnv} (needs env permission for those four names). */
export function kubeEnv(): KubeEnv {
  const out: KubeEnv = {};
  for (const n of KUBE_ENV_NAMES) {
    const v = Deno.env.get(n);
    if (v !== undefined && v !== "") out[n] = v;
  }
  return out;
}

/**
 * The in-cluster access: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`
 * (an IPv6 host is bracketed), the token file (re-read as it rotates) and `ca.crt`
 * of the service-account directory. Both files must be readable now.
 */
export async function inClusterAccess(
  env: KubeEnv,
  dir: string = SERVICE_ACCOUNT_DIR,
): Promise<KubeAccess> {
  const host = env.KUBERNETES_SERVICE_HOST ?? "";
  const port = env.KUBERNETES_SERVICE_PORT ?? "";
  if (!/^[A-Za-z0-9.:-]+$/.test(host)) {
    throw new KubeAccessError(`KUBERNETES_SERVICE_HOST "${host}" is not a host name or address`);
  }
  if (!/^\d{1,5}$/.test(port) || Number(port) < 1 || Number(port) > 65535) {
    throw new KubeAccessError(
      `KUBERNETES_SERVICE_PORT "${port}" is not a port (1-65535); it is set with ` +
        "KUBERNETES_SERVICE_HOST in every pod",
    );
  }
  const tokenFile = `${dir}/token`;
  const caFile = `${dir}/ca.crt`;
  const token = await readText(tokenFile, "the service account's token");
  if (token.trim() === "") throw new KubeAccessError(`The token file "${tokenFile}" is empty`);
  const ca = await readText(caFile, "the service account's CA");
  const hostPart = host.includes(":") ? `[${host}]` : host;
  return {
    server: `https://${hostPart}:${Number(port)}`,
    caCerts: [ca],
    token: { file: tokenFile },
    source: `in-cluster (KUBERNETES_SERVICE_HOST "${host}", ${dir})`,
  };
}

/**
 * The node's name as Kubernetes knows it: `option` (the agent option
 * `kubernetes.nodeName`), else `NODE_NAME` (a DaemonSet sets it from
 * `spec.nodeName`), else the host name lowercased, which is kubelet's default.
 */
export function resolveNodeName(
  option: string | undefined,
  env: KubeEnv = kubeEnv(),
  hostname: () => string = Deno.hostname,
): string {
  const name = option || env.NODE_NAME || hostname().toLowerCase();
  if (!/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(name)) {
    throw new KubeAccessError(
      `The node name "${name}" is not a Kubernetes node name (a DNS subdomain: lowercase ` +
        "letters, digits, '-' and '.'); set kubernetes.nodeName or NODE_NAME",
    );
  }
  return name;
}

/** Reads a text file, or throws a {@linkcode KubeAccessError} naming what it is for. */
export async function readText(path: string, what: string): Promise<string> {
  try {
    return await Deno.readTextFile(path);
  } catch (err) {
    throw new KubeAccessError(`Cannot read ${what} "${path}": ${describe(err)}`, { cause: err });
  }
}

/** Why a file could not be read, in words (permission errors name enim's permission set). */
function describe(err: unknown): string {
  if (err instanceof Deno.errors.NotFound) return "no such file";
  if (err instanceof Deno.errors.NotCapable) {
    return "enim's permission set does not allow reading it (see the permissions in deno.json)";
  }
  if (err instanceof Deno.errors.PermissionDenied) return "permission denied";
  return err instanceof Error ? err.message : String(err);
}
