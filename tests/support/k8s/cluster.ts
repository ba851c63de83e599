/**
 * A real Kubernetes control plane for tests, from the components tests/support/k8s/build.ts
 * builds: etcd (its data in the cluster's temporary folder), kube-apiserver (the test CA,
 * RBAC and the Node authorizer, ServiceAccount token signing, the default admission plugins
 * plus NodeRestriction, as kubeadm runs it), kube-controller-manager (the ServiceAccount,
 * ServiceAccount-token, EndpointSlice, namespace, garbage-collector and pod-GC controllers,
 * each with its own ServiceAccount's credentials) and kube-scheduler, every one on a free
 * port of 127.0.0.1 only, each ready when its health endpoint says so. Clients get YAML
 * kubeconfigs ({@linkcode KubeCluster.kubeconfig}); everything is stopped by PID and the
 * folder removed in {@linkcode KubeCluster.stop}.
 *
 * No kubelet: tests/support/k8s/kubelet.ts registers Nodes and writes pods' status the way
 * kubelet does.
 *
 * @module
 */
import { z } from "zod";
import { stringify as toYaml } from "yaml";
import { type Component, ensureK8sBinaries, type K8sBinaries } from "./build.ts";
import { type CertFiles, type ClusterPki, issueClient, makeClusterPki } from "./pki.ts";
import { ComponentProcess, freePort } from "./process.ts";
import { KubeRest } from "./rest.ts";
import { admissionFlags } from "./manifests.ts";

/** Options of {@linkcode KubeCluster.start}. */
export interface KubeClusterOptions {
  /** The Kubernetes release (default: `ENIM_K8S_VERSION`, else the pinned one). */
  version?: string;
  /** Components built already (default: {@linkcode ensureK8sBinaries} of `version`). */
  binaries?: K8sBinaries;
  /** kube-apiserver's `--service-cluster-ip-range` (default `10.96.0.0/12`). */
  serviceCidrs?: string[];
  /** More kube-apiserver flags (appended). */
  apiserverFlags?: string[];
  /**
   * More controllers for kube-controller-manager (a real node's: {@linkcode NODE_CONTROLLERS}).
   */
  controllers?: string[];
  /** Progress lines (default: none). */
  progress?: (line: string) => void;
  /** How long each component may take to be ready (default 120 s: a loaded machine). */
  readyTimeoutMs?: number;
}

/** A user of the cluster, as a kubeconfig names it. */
export type KubeUser =
  | { cert: CertFiles }
  | { token: string }
  | { tokenFile: string };

/** One component's version and readiness, as `deno task cluster` prints them. */
export interface ComponentState {
  component: Component;
  version: string;
  /** The health endpoint asked and what it answered. */
  ready: string;
  pid: number;
}

const EtcdHeaderSchema = z.object({
  header: z.object({ revision: z.union([z.string(), z.number()]).transform(Number) }),
});
const EtcdRangeSchema = EtcdHeaderSchema.extend({
  kvs: z.optional(z.array(z.object({
    key: z.string(),
    value: z.optional(z.string()),
    version: z.optional(z.union([z.string(), z.number()]).transform(Number)),
  }))),
});
const EtcdTxnSchema = EtcdHeaderSchema.extend({ succeeded: z.optional(z.boolean()) });
const VersionSchema = z.looseObject({ gitVersion: z.string() });

const b64 = (s: string) => btoa(s);

/** The controllers kube-controller-manager runs (no node lifecycle: there is no kubelet). */
export const CONTROLLERS = [
  "serviceaccount-controller",
  "serviceaccount-token-controller",
  "endpointslice-controller",
  "namespace-controller",
  "garbage-collector-controller",
  "pod-garbage-collector-controller",
];

/**
 * The controllers a cluster with a real kubelet needs besides {@linkcode CONTROLLERS}: the
 * DaemonSet controller (enim's agent), the node lifecycle controller (it removes the
 * `node.kubernetes.io/not-ready` taint once kubelet reports Ready) and the root CA publisher
 * (every pod's projected token volume mounts the `kube-root-ca.crt` ConfigMap it writes).
 */
export const NODE_CONTROLLERS = [
  "daemonset-controller",
  "node-lifecycle-controller",
  "root-ca-certificate-publisher-controller",
];

/** The running control plane (see the module doc). */
export class KubeCluster implements AsyncDisposable {
  readonly bins: K8sBinaries;
  /** The cluster's temporary folder (PKI, etcd's data, kubeconfigs, logs). */
  readonly dir: string;
  readonly pki: ClusterPki;
  /** The CA certificate (PEM). */
  readonly caCert: string;
  /** `https://127.0.0.1:<port>`. */
  readonly url: string;
  readonly apiPort: number;
  /** etcd's client URL, `http://127.0.0.1:<port>` (its v3 JSON gateway too). */
  readonly etcdUrl: string;
  /** The Service CIDRs. */
  readonly serviceCidrs: string[];
  /** A client as the admin (`system:masters`). */
  readonly admin: KubeRest;
  readonly #procs = new Map<Component, ComponentProcess>();
  readonly #args = new Map<Component, string[]>();
  readonly #ports: Record<"etcd" | "peer" | "cm" | "scheduler", number>;
  readonly #readyMs: number;
  readonly #say: (line: string) => void;
  readonly #nodeCerts = new Map<string, Promise<CertFiles>>();
  #stopped = false;

  private constructor(
    bins: K8sBinaries,
    dir: string,
    pki: ClusterPki,
    caCert: string,
    admin: KubeRest,
    ports: { api: number; etcd: number; peer: number; cm: number; scheduler: number },
    o: KubeClusterOptions,
  ) {
    this.bins = bins;
    this.dir = dir;
    this.pki = pki;
    this.caCert = caCert;
    this.admin = admin;
    this.apiPort = ports.api;
    this.url = `https://127.0.0.1:${ports.api}`;
    this.etcdUrl = `http://127.0.0.1:${ports.etcd}`;
    this.#ports = ports;
    this.serviceCidrs = o.serviceCidrs ?? ["10.96.0.0/12"];
    this.#readyMs = o.readyTimeoutMs ?? 120_000;
    this.#say = o.progress ?? (() => {});
  }

  /** Builds (or finds) the components, starts the control plane and waits until it is ready. */
  static async start(o: KubeClusterOptions = {}): Promise<KubeCluster> {
    const bins = o.binaries ??
      await ensureK8sBinaries({ version: o.version, progress: o.progress });
    const dir = await Deno.makeTempDir({ prefix: "enim-k8s-" });
    let cluster: KubeCluster | null = null;
    try {
      const serviceCidrs = o.serviceCidrs ?? ["10.96.0.0/12"];
      const pki = await makeClusterPki(`${dir}/pki`, firstAddress(serviceCidrs[0]));
      const caCert = await Deno.readTextFile(pki.ca.cert);
      const ports = {
        api: freePort(),
        etcd: freePort(),
        peer: freePort(),
        cm: freePort(),
        scheduler: freePort(),
      };
      const admin = await KubeRest.withCert(
        `https://127.0.0.1:${ports.api}`,
        pki.ca.cert,
        pki.admin.cert,
        pki.admin.key,
      );
      cluster = new KubeCluster(bins, dir, pki, caCert, admin, ports, o);
      await Deno.mkdir(`${dir}/logs`);
      await cluster.#startAll(o);
      return cluster;
    } catch (err) {
      if (cluster) await cluster.stop().catch(() => {});
      else await Deno.remove(dir, { recursive: true }).catch(() => {});
      throw err;
    }
  }

  async #startAll(o: KubeClusterOptions): Promise<void> {
    const p = this.pki;
    const e = this.#ports;
    const peer = `http://127.0.0.1:${e.peer}`;
    this.#args.set("etcd", [
      "--name=enim-test",
      `--data-dir=${this.dir}/etcd`,
      `--listen-client-urls=${this.etcdUrl}`,
      `--advertise-client-urls=${this.etcdUrl}`,
      `--listen-peer-urls=${peer}`,
      `--initial-advertise-peer-urls=${peer}`,
      `--initial-cluster=enim-test=${peer}`,
      "--initial-cluster-state=new",
      // A test's data: no fsync (the machine is shared and loaded), no auto-compaction
      // (the tests compact when they mean to).
      "--unsafe-no-fsync",
      "--log-level=warn",
    ]);
    await this.#start("etcd");
    await this.#waitReady("etcd");

    this.#args.set("kube-apiserver", [
      `--etcd-servers=${this.etcdUrl}`,
      "--bind-address=127.0.0.1",
      `--secure-port=${this.apiPort}`,
      "--advertise-address=127.0.0.1",
      // The `kubernetes` Service's Endpoints would name 127.0.0.1, which validation refuses.
      "--endpoint-reconciler-type=none",
      `--service-cluster-ip-range=${this.serviceCidrs.join(",")}`,
      `--client-ca-file=${p.ca.cert}`,
      `--tls-cert-file=${p.serving.cert}`,
      `--tls-private-key-file=${p.serving.key}`,
      "--authorization-mode=Node,RBAC",
      "--enable-admission-plugins=NodeRestriction",
      "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
      `--service-account-key-file=${p.serviceAccount.pub}`,
      `--service-account-signing-key-file=${p.serviceAccount.key}`,
      "--allow-privileged=true",
      "--profiling=false",
      // MutatingAdmissionPolicy, GA from 1.36, is beta and off before.
      ...admissionFlags(this.bins.version),
      ...(o.apiserverFlags ?? []),
    ]);
    await this.#start("kube-apiserver");
    await this.#waitReady("kube-apiserver");

    const cm = await this.writeKubeconfig("controller-manager", { cert: p.controllerManager });
    this.#args.set("kube-controller-manager", [
      `--kubeconfig=${cm}`,
      `--authentication-kubeconfig=${cm}`,
      `--authorization-kubeconfig=${cm}`,
      "--bind-address=127.0.0.1",
      `--secure-port=${e.cm}`,
      `--tls-cert-file=${p.serving.cert}`,
      `--tls-private-key-file=${p.serving.key}`,
      `--client-ca-file=${p.ca.cert}`,
      `--controllers=${[...CONTROLLERS, ...(o.controllers ?? [])].join(",")}`,
      `--service-account-private-key-file=${p.serviceAccount.key}`,
      `--root-ca-file=${p.ca.cert}`,
      "--use-service-account-credentials=true",
      "--leader-elect=false",
      "--profiling=false",
    ]);
    const sched = await this.writeKubeconfig("scheduler", { cert: p.scheduler });
    this.#args.set("kube-scheduler", [
      `--kubeconfig=${sched}`,
      `--authentication-kubeconfig=${sched}`,
      `--authorization-kubeconfig=${sched}`,
      "--bind-address=127.0.0.1",
      `--secure-port=${e.scheduler}`,
      `--tls-cert-file=${p.serving.cert}`,
      `--tls-private-key-file=${p.serving.key}`,
      `--client-ca-file=${p.ca.cert}`,
      "--leader-elect=false",
      "--profiling=false",
    ]);
    await this.#start("kube-controller-manager");
    await this.#start("kube-scheduler");
    await Promise.all([
      this.#waitReady("kube-controller-manager"),
      this.#waitReady("kube-scheduler"),
    ]);
    await this.waitServiceAccount("default", "default");
  }

  async #start(c: Component): Promise<void> {
    const proc = await ComponentProcess.start(
      c,
      this.bins.paths[c],
      this.#args.get(c)!,
      `${this.dir}/logs/${c}.log`,
    );
    this.#procs.set(c, proc);
    this.#say(`k8s: ${c} started (pid ${proc.pid})`);
  }

  /** The health endpoint of `c` and how to ask it. */
  #health(c: Component): { url: string; tls: boolean } {
    switch (c) {
      case "etcd":
        return { url: `${this.etcdUrl}/health`, tls: false };
      case "kube-apiserver":
        return { url: `${this.url}/readyz`, tls: true };
      case "kube-controller-manager":
        return { url: `https://127.0.0.1:${this.#ports.cm}/healthz`, tls: true };
      case "kube-scheduler":
        return { url: `https://127.0.0.1:${this.#ports.scheduler}/readyz`, tls: true };
      default:
        throw new Error(`"${c}" is not a control-plane component`);
    }
  }

  /** Asks `c`'s health endpoint once: its answer when 200, else null. */
  async #askHealth(c: Component, http: Deno.HttpClient): Promise<string | null> {
    const h = this.#health(c);
    try {
      const res = c === "kube-apiserver"
        ? await this.admin.raw("GET", "/readyz")
        : await (async () => {
          const r = await fetch(h.url, {
            client: h.tls ? http : undefined,
            signal: AbortSignal.timeout(5_000),
          });
          return { status: r.status, text: await r.text() };
        })();
      return res.status === 200 ? res.text.trim() : null;
    } catch {
      return null;
    }
  }

  async #waitReady(c: Component): Promise<string> {
    const proc = this.#procs.get(c)!;
    const http = Deno.createHttpClient({ caCerts: [this.caCert] });
    const t0 = performance.now();
    try {
      for (;;) {
        if (proc.exited) {
          throw new Error(
            `${c} exited with ${proc.exited.code} before it was ready:\n${proc.tail()}`,
          );
        }
        const answer = await this.#askHealth(c, http);
        if (answer !== null) {
          const ms = Math.round(performance.now() - t0);
          this.#say(`k8s: ${c} ready in ${ms} ms (${this.#health(c).url}: ${answer})`);
          return answer;
        }
        if (performance.now() - t0 > this.#readyMs) {
          throw new Error(`${c} was not ready within ${this.#readyMs} ms:\n${proc.tail()}`);
        }
        await new Promise((r) => setTimeout(r, 200));
      }
    } finally {
      http.close();
    }
  }

  /** Each component's version (`--version`, the API server's /version) and health now. */
  async states(): Promise<ComponentState[]> {
    const http = Deno.createHttpClient({ caCerts: [this.caCert] });
    try {
      const out: ComponentState[] = [];
      for (const [c, proc] of this.#procs) {
        if (c === "kube-proxy") continue;
        const v = await new Deno.Command(this.bins.paths[c], {
          args: ["--version"],
          stdout: "piped",
          stderr: "piped",
        }).output();
        const text = new TextDecoder().decode(v.stdout).trim().split("\n")[0];
        const ready = await this.#askHealth(c, http);
        out.push({
          component: c,
          version: text,
          ready: `${this.#health(c).url}: ${ready ?? "not ready"}`,
          pid: proc.pid,
        });
      }
      const served = await this.admin.get("/version", VersionSchema);
      out.find((s) => s.component === "kube-apiserver")!.version +=
        ` (/version: ${served.gitVersion})`;
      return out;
    } finally {
      http.close();
    }
  }

  /**
   * A YAML kubeconfig for `user` at `server` (default the API server itself): the CA
   * inline, a client certificate by file, a token inline, or a `tokenFile`.
   */
  kubeconfig(user: KubeUser, server = this.url): string {
    const u: Record<string, string> = "cert" in user
      ? { "client-certificate": user.cert.cert, "client-key": user.cert.key }
      : "token" in user
      ? { token: user.token }
      : { tokenFile: user.tokenFile };
    return toYaml({
      apiVersion: "v1",
      kind: "Config",
      clusters: [{
        name: "enim-test",
        cluster: { server, "certificate-authority-data": btoa(this.caCert) },
      }],
      users: [{ name: "user", user: u }],
      contexts: [{ name: "enim-test", context: { cluster: "enim-test", user: "user" } }],
      "current-context": "enim-test",
    });
  }

  /** Writes {@linkcode kubeconfig} to `<dir>/<name>.kubeconfig`; returns the path. */
  async writeKubeconfig(name: string, user: KubeUser): Promise<string> {
    const path = `${this.dir}/${name}.kubeconfig`;
    await Deno.writeTextFile(path, this.kubeconfig(user));
    return path;
  }

  /** A client certificate for node `name` (`system:node:<name>` in `system:nodes`). */
  nodeCert(name: string): Promise<CertFiles> {
    let p = this.#nodeCerts.get(name);
    if (!p) {
      p = issueClient(this.pki.dir, `node-${name}`, `system:node:${name}`, ["system:nodes"]);
      this.#nodeCerts.set(name, p);
    }
    return p;
  }

  /** A REST client as `creds` (a certificate's files, or a token). */
  async client(user: { cert: CertFiles } | { token: string }): Promise<KubeRest> {
    if ("token" in user) return new KubeRest(this.url, this.caCert, { token: user.token });
    return await KubeRest.withCert(this.url, this.pki.ca.cert, user.cert.cert, user.cert.key);
  }

  /** Waits until ServiceAccount `name` exists in `namespace` (the controller makes `default`). */
  async waitServiceAccount(namespace: string, name: string, timeoutMs = 60_000): Promise<void> {
    const path = `/api/v1/namespaces/${namespace}/serviceaccounts/${name}`;
    const t0 = performance.now();
    while (!(await this.admin.find(path, z.looseObject({ metadata: z.object({}) })))) {
      if (performance.now() - t0 > timeoutMs) {
        throw new Error(
          `The ServiceAccount "${namespace}/${name}" did not appear in ${timeoutMs} ms`,
        );
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** POSTs to etcd's v3 JSON gateway. */
  async #etcd<S extends z.ZodType>(path: string, body: unknown, schema: S): Promise<z.infer<S>> {
    const res = await fetch(`${this.etcdUrl}${path}`, {
      method: "POST",
      body: JSON.stringify(body),
      headers: { "Content-Type": "application/json" },
      signal: AbortSignal.timeout(30_000),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`etcd ${path} answered ${res.status}: ${text}`);
    return schema.parse(JSON.parse(text));
  }

  /** etcd's current revision (what the API server's resourceVersions count). */
  async etcdRevision(): Promise<number> {
    const r = await this.#etcd("/v3/kv/range", { key: b64("compact_rev_key") }, EtcdRangeSchema);
    return r.header.revision;
  }

  /**
   * Compacts etcd at `revision` (default: its current one) through its v3 gateway
   * (`/v3/kv/compaction`), as an operator's `etcdctl compact` or etcd's own
   * auto-compaction does: the API server is not told.
   */
  async compactEtcd(revision?: number): Promise<number> {
    const rev = revision ?? await this.etcdRevision();
    await this.#etcd("/v3/kv/compaction", { revision: String(rev), physical: true }, z.unknown());
    return rev;
  }

  /**
   * Compacts etcd at `revision` (default: the current one) the way kube-apiserver's own
   * compactor does every `--etcd-compaction-interval` (another API server, to this one):
   * the revision written to `compact_rev_key` in a compare-and-swap on its version, then
   * the compaction. The API servers learn it from that key.
   */
  async compactAsApiserver(revision?: number): Promise<number> {
    const key = b64("compact_rev_key");
    const cur = await this.#etcd("/v3/kv/range", { key }, EtcdRangeSchema);
    const version = cur.kvs?.[0]?.version ?? 0;
    const rev = revision ?? cur.header.revision;
    const txn = await this.#etcd("/v3/kv/txn", {
      compare: [{ key, target: "VERSION", result: "EQUAL", version: String(version) }],
      success: [{ requestPut: { key, value: b64(String(rev)) } }],
    }, EtcdTxnSchema);
    if (!txn.succeeded) throw new Error("Another compactor changed compact_rev_key meanwhile");
    await this.#etcd("/v3/kv/compaction", { revision: String(rev), physical: true }, z.unknown());
    return rev;
  }

  /** Stops kube-apiserver (SIGTERM) and starts it again with the same flags and port. */
  async restartApiserver(): Promise<void> {
    await this.#procs.get("kube-apiserver")?.stop();
    await this.#start("kube-apiserver");
    await this.#waitReady("kube-apiserver");
  }

  /** The log of component `c` so far. */
  async log(c: Component): Promise<string> {
    return await Deno.readTextFile(`${this.dir}/logs/${c}.log`).catch(() => "");
  }

  /** Stops every component (by PID, the last started first) and removes the folder. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    this.admin.close();
    const procs = [...this.#procs.values()].reverse();
    for (const p of procs) await p.stop().catch(() => {});
    if (Deno.env.get("ENIM_K8S_KEEP") === "1") {
      console.error(`k8s: kept ${this.dir} (ENIM_K8S_KEEP=1)`);
      return;
    }
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

/** The first host address of an IPv4 CIDR (the `kubernetes` Service's ClusterIP). */
export function firstAddress(cidr: string): string {
  const [addr] = cidr.split("/");
  if (addr.includes(":")) return addr.replace(/::$/, "::1");
  const n = addr.split(".").map(Number).reduce((a, b) => a * 256 + b, 0) + 1;
  return [24, 16, 8, 0].map((s) => (n >>> s) & 255).join(".");
}
