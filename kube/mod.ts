/**
 * enim's Kubernetes API client, for the agent only (the CNI plugin process never
 * imports it): the access found the standard ways (kube/resolve.ts), HTTPS with the
 * cluster's CA (kube/client.ts), and one shared list-and-watch cache per kind
 * (kube/informer.ts) of the trimmed objects (kube/objects.ts): Pods cluster-wide,
 * Namespaces and NetworkPolicies, created on first use and read by everyone who needs
 * that kind.
 *
 * @example
 * ```ts
 * const kube = await Kube.connect({ kubeconfig: cfg.kubernetes.kubeconfig, log });
 * try {
 *   const stop = kube.pods.subscribe((old, cur) => log.info("pod", { old, cur }));
 *   if (!(await kube.pods.waitSynced(30_000))) log.warn("pods are not listed yet");
 *   const [pod] = kube.pods.byIndex("ip", "10.0.0.5");
 *   const late = await kube.getPod("default", "web-0", { timeoutMs: 2_000 });
 *   stop();
 * } finally {
 *   await kube.close();
 * }
 * ```
 *
 * @module
 */
import {
  type KubeAccess,
  KubeAccessError,
  type KubeEnv,
  kubeEnv,
  resolveNodeName,
} from "./access.ts";
import { resolveAccess } from "./resolve.ts";
import { KubeApiError, KubeClient, KubeRequestError } from "./client.ts";
import {
  Informer,
  type InformerOptions,
  type InformerStats,
  type KubeObject,
  type ResourceKind,
} from "./informer.ts";
import { NAMESPACES, NETWORK_POLICIES, PODS } from "./resources.ts";
import { type Namespace, type NetworkPolicy, type Pod, PodSchema } from "./objects.ts";
import type { BackoffOptions } from "./_backoff.ts";
import { type Logger, nullLogger } from "../lib/log.ts";

export { KubeAccessError, KubeApiError, KubeClient, KubeRequestError, resolveAccess };
export type { InformerStats, KubeAccess };
export { Informer, NAMESPACES, NETWORK_POLICIES, PODS };
export type { Namespace, NetworkPolicy, Pod };

/** The settings of the agent's `kubernetes` section, and what tests adjust. */
export interface KubeOptions {
  /** A kubeconfig path; else `KUBECONFIG`; else in-cluster. */
  kubeconfig?: string;
  /** The kubeconfig context (default: its current-context). */
  context?: string;
  /** The node's name; else `NODE_NAME`; else the host name. */
  nodeName?: string;
  /** Objects per list page (default 500). */
  pageSize?: number;
  /** How long one list page or GET may take (default 30 s). */
  requestTimeoutSeconds?: number;
  /** Watches end on the server after a random [w, 2w) seconds (default 300). */
  watchTimeoutSeconds?: number;
  /**
   * How often the API server sends a watch bookmark (default 60, kube-apiserver's); a
   * watch that hears nothing for twice this is taken for dead.
   */
  watchBookmarkSeconds?: number;
  /** The environment (default: the process's KUBECONFIG, KUBERNETES_SERVICE_*, NODE_NAME). */
  env?: KubeEnv;
  /** The service-account folder (tests). */
  serviceAccountDir?: string;
  /** How old the token file's copy may get (default 60 s; tests). */
  tokenMaxAgeMs?: number;
  /** The list-and-watch backoff (tests). */
  backoff?: BackoffOptions;
  /**
   * On a server that sends no bookmarks, how long past its timeout a silent watch is
   * taken for dead (default 30 s; tests).
   */
  watchGraceMs?: number;
  log?: Logger;
}

/**
 * Throws a {@linkcode KubeAccessError} unless the process may connect to `server`
 * (Deno's net permission for its host and port): a server the permission set does not
 * allow would otherwise fail every request, forever, with the same error.
 */
export async function checkNetPermission(server: string, source: string): Promise<void> {
  const url = new URL(server);
  const host = `${url.hostname}:${url.port || "443"}`;
  const { state } = await Deno.permissions.query({ name: "net", host });
  if (state === "granted") return;
  throw new KubeAccessError(
    `enim's permission set does not allow connecting to the Kubernetes API server "${host}" ` +
      `(from ${source}): the shipped set (permissions.enim in deno.json) allows every address; ` +
      `a set narrowed since must list "${host}" in its net permission, and enim be built again`,
  );
}

/** The agent's Kubernetes API client and its shared caches (see the module doc). */
export class Kube {
  /** The node this agent runs on, as Kubernetes names it. */
  readonly nodeName: string;
  /** The HTTPS client (for GETs the caches do not cover). */
  readonly client: KubeClient;
  readonly #o: KubeOptions;
  readonly #log: Logger;
  readonly #informers = new Map<string, Informer<KubeObject>>();
  #closed = false;

  /** A client of `access`; nothing is requested until a cache is used. */
  constructor(access: KubeAccess, nodeName: string, o: KubeOptions = {}) {
    this.nodeName = nodeName;
    this.#o = o;
    this.#log = (o.log ?? nullLogger).child({ component: "kube" });
    this.client = new KubeClient(access, {
      requestTimeoutMs: (o.requestTimeoutSeconds ?? 30) * 1000,
      tokenMaxAgeMs: o.tokenMaxAgeMs,
      log: this.#log,
    });
  }

  /**
   * Finds the API server (kubeconfig option, `KUBECONFIG`, in-cluster), checks that the
   * permission set lets enim reach it, and returns the client. Throws
   * {@linkcode KubeAccessError}.
   */
  static async connect(o: KubeOptions = {}): Promise<Kube> {
    const env = o.env ?? kubeEnv();
    const access = await resolveAccess({ ...o, env });
    await checkNetPermission(access.server, access.source);
    const kube = new Kube(access, resolveNodeName(o.nodeName, env), o);
    kube.#log.info("Kubernetes API server found", {
      server: access.server,
      source: access.source,
      nodeName: kube.nodeName,
    });
    return kube;
  }

  /** The shared cache of every pod in the cluster (started on first use). */
  get pods(): Informer<Pod> {
    return this.informer(PODS);
  }

  /** The shared cache of namespaces (started on first use). */
  get namespaces(): Informer<Namespace> {
    return this.informer(NAMESPACES);
  }

  /** The shared cache of NetworkPolicies (started on first use). */
  get networkPolicies(): Informer<NetworkPolicy> {
    return this.informer(NETWORK_POLICIES);
  }

  /** The shared, started cache of `kind` (one per resource). */
  informer<T extends KubeObject>(kind: ResourceKind<T>): Informer<T> {
    if (this.#closed) {
      throw new Error(`The Kubernetes client is closed; cannot watch ${kind.resource}`);
    }
    let inf = this.#informers.get(kind.resource) as Informer<T> | undefined;
    if (inf === undefined) {
      const o: InformerOptions = {
        pageSize: this.#o.pageSize,
        watchTimeoutSeconds: this.#o.watchTimeoutSeconds,
        bookmarkSeconds: this.#o.watchBookmarkSeconds,
        watchGraceMs: this.#o.watchGraceMs,
        backoff: this.#o.backoff,
        log: this.#log,
      };
      inf = new Informer(this.client, kind, o);
      this.#informers.set(kind.resource, inf as unknown as Informer<KubeObject>);
      inf.start();
    }
    return inf;
  }

  /**
   * One pod straight from the API server (for a pod the cache has not seen yet): null
   * when it does not exist. Throws {@linkcode KubeApiError} or
   * {@linkcode KubeRequestError} (no answer within `timeoutMs`, default 5 s).
   */
  async getPod(
    namespace: string,
    name: string,
    o: { timeoutMs?: number; signal?: AbortSignal } = {},
  ): Promise<Pod | null> {
    const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${
      encodeURIComponent(name)
    }`;
    let body: unknown;
    try {
      body = await this.client.get(path, { timeoutMs: o.timeoutMs ?? 5_000, signal: o.signal });
    } catch (err) {
      if (err instanceof KubeApiError && err.status === 404) return null;
      throw err;
    }
    const pod = PodSchema.safeParse(body);
    if (!pod.success) {
      throw new KubeRequestError(`The pod "${namespace}/${name}" the API server sent is malformed`);
    }
    return pod.data;
  }

  /** Every cache's counters. */
  stats(): InformerStats[] {
    return [...this.#informers.values()].map((i) => i.stats());
  }

  /** Stops every cache and closes the connections. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.all([...this.#informers.values()].map((i) => i.close()));
    this.client.close();
  }
}
