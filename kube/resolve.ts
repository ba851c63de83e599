/**
 * Finding the API server the standard ways, in this order (as client-go's
 * `clientcmd` and `rest.InClusterConfig` do):
 *
 * 1. a kubeconfig named by the agent option `kubernetes.kubeconfig`;
 * 2. else a kubeconfig named by the `KUBECONFIG` environment variable (one path:
 *    kubectl's colon-separated list of files to merge is refused);
 * 3. else in-cluster: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, with the
 *    service account's token and CA under `SERVICE_ACCOUNT_DIR` (the token file is
 *    re-read as it rotates, see kube/client.ts).
 *
 * @module
 */
import {
  inClusterAccess,
  type KubeAccess,
  KubeAccessError,
  type KubeEnv,
  kubeEnv,
  SERVICE_ACCOUNT_DIR,
} from "./access.ts";
import { readKubeconfig } from "./kubeconfig.ts";

/** Where to look for the API server. */
export interface AccessOptions {
  /** A kubeconfig path (the agent option `kubernetes.kubeconfig`); wins over `KUBECONFIG`. */
  kubeconfig?: string;
  /** The kubeconfig context to use (default: its `current-context`). */
  context?: string;
  /** The environment (default: the process's, {@linkcode kubeEnv}). */
  env?: KubeEnv;
  /** The service-account directory (default {@linkcode SERVICE_ACCOUNT_DIR}; tests change it). */
  serviceAccountDir?: string;
}

/**
 * Finds the API server and the credentials (see the module doc for the order).
 * Throws {@linkcode KubeAccessError} saying what is missing or refused.
 *
 * @example
 * ```ts
 * const access = await resolveAccess({ kubeconfig: "/etc/enim/kubeconfig" });
 * console.log(access.server, access.source);
 * ```
 */
export async function resolveAccess(o: AccessOptions = {}): Promise<KubeAccess> {
  const env = o.env ?? kubeEnv();
  if (o.kubeconfig !== undefined && o.kubeconfig !== "") {
    return await readKubeconfig(o.kubeconfig, { context: o.context });
  }
  if (env.KUBECONFIG !== undefined && env.KUBECONFIG !== "") {
    if (env.KUBECONFIG.includes(":")) {
      throw new KubeAccessError(
        `KUBECONFIG "${env.KUBECONFIG}" names several files; enim reads one kubeconfig ` +
          "(merge them with `kubectl config view --flatten` into one file)",
      );
    }
    return await readKubeconfig(env.KUBECONFIG, { context: o.context });
  }
  if (env.KUBERNETES_SERVICE_HOST !== undefined) {
    return await inClusterAccess(env, o.serviceAccountDir ?? SERVICE_ACCOUNT_DIR);
  }
  throw new KubeAccessError(
    "No Kubernetes API server is configured: set the agent option kubernetes.kubeconfig " +
      "(or the KUBECONFIG variable), or run the agent in a pod with a service account " +
      "(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT set)",
  );
}
