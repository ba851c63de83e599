/**
 * A ServiceAccount's token as kubelet hands one to a pod: asked of the TokenRequest API
 * (`POST …/serviceaccounts/<name>/token`, the shortest expiry the API allows, 10 minutes),
 * written into a folder the way kubelet's projected volume writes it (`token` →
 * `..data/token`, `..data` → a timestamped folder, swapped by one rename), and rotated in
 * place. Each token is bound to a Secret of its own; a rotation deletes the previous
 * token's Secret, which revokes that token at once: an agent that does not read the file
 * again fails with 401 from then on (stricter than kubelet, whose old token lives until it
 * expires, so that the test does not wait for the expiry).
 *
 * @module
 */
import { z } from "zod";
import type { KubeCluster } from "./cluster.ts";
import { StoredSchema } from "./rest.ts";

const TokenRequestSchema = z.looseObject({
  status: z.object({ token: z.string().check(z.minLength(10)), expirationTimestamp: z.string() }),
});

/** One issued token. */
export interface IssuedToken {
  token: string;
  expires: string;
  /** The Secret it is bound to (deleting it revokes the token). */
  secret: string;
}

/** A ServiceAccount's rotating token file (see the module doc). */
export class ProjectedToken {
  /** The folder; the token is `<dir>/token`. */
  readonly dir: string;
  readonly namespace: string;
  readonly serviceAccount: string;
  readonly #cluster: KubeCluster;
  /** Every token issued, in order (the last is in the file). */
  readonly issued: IssuedToken[] = [];
  #serial = 0;

  private constructor(cluster: KubeCluster, dir: string, namespace: string, sa: string) {
    this.#cluster = cluster;
    this.dir = dir;
    this.namespace = namespace;
    this.serviceAccount = sa;
  }

  /** The file the agent reads. */
  get path(): string {
    return `${this.dir}/token`;
  }

  /** Issues the first token of `namespace/sa` into `dir` (created). */
  static async create(
    cluster: KubeCluster,
    dir: string,
    namespace: string,
    sa: string,
  ): Promise<ProjectedToken> {
    await Deno.mkdir(dir, { recursive: true });
    const t = new ProjectedToken(cluster, dir, namespace, sa);
    await t.rotate();
    return t;
  }

  /** Issues a token bound to a new Secret (not yet in the file). */
  async #issue(): Promise<IssuedToken> {
    const ns = encodeURIComponent(this.namespace);
    const secret = `${this.serviceAccount}-token-binding-${++this.#serial}-${
      crypto.randomUUID().slice(0, 5)
    }`;
    const s = await this.#cluster.admin.create(`/api/v1/namespaces/${ns}/secrets`, {
      apiVersion: "v1",
      kind: "Secret",
      metadata: { name: secret, labels: { "app.kubernetes.io/name": "enim-tests" } },
      type: "Opaque",
    }, StoredSchema);
    const r = await this.#cluster.admin.create(
      `/api/v1/namespaces/${ns}/serviceaccounts/${encodeURIComponent(this.serviceAccount)}/token`,
      {
        apiVersion: "authentication.k8s.io/v1",
        kind: "TokenRequest",
        spec: {
          expirationSeconds: 600,
          boundObjectRef: { apiVersion: "v1", kind: "Secret", name: secret, uid: s.metadata.uid },
        },
      },
      TokenRequestSchema,
    );
    return { token: r.status.token, expires: r.status.expirationTimestamp, secret };
  }

  /**
   * Puts a new token in the file (the projected volume's atomic swap) and, when `revoke`
   * (the default), revokes the one before it. Returns the new token.
   */
  async rotate(revoke = true): Promise<IssuedToken> {
    const next = await this.#issue();
    const stamp = `..${new Date().toISOString().replace(/[-:.]/g, "_")}.${this.#serial}`;
    await Deno.mkdir(`${this.dir}/${stamp}`);
    await Deno.writeTextFile(`${this.dir}/${stamp}/token`, next.token, { mode: 0o600 });
    await Deno.remove(`${this.dir}/..data_tmp`).catch(() => {});
    await Deno.symlink(stamp, `${this.dir}/..data_tmp`);
    let old: string | null = null;
    try {
      old = await Deno.readLink(`${this.dir}/..data`);
    } catch { /* the first */ }
    await Deno.rename(`${this.dir}/..data_tmp`, `${this.dir}/..data`);
    try {
      await Deno.lstat(this.path);
    } catch {
      await Deno.symlink("..data/token", this.path);
    }
    if (old) await Deno.remove(`${this.dir}/${old}`, { recursive: true });
    const prev = this.issued.at(-1);
    this.issued.push(next);
    if (prev && revoke) await this.revoke(prev);
    return next;
  }

  /** Revokes `t` (deletes its Secret). */
  async revoke(t: IssuedToken): Promise<void> {
    await this.#cluster.admin.delete(
      `/api/v1/namespaces/${encodeURIComponent(this.namespace)}/secrets/${t.secret}`,
    );
  }

  /** Whether the API server takes `token` now (a SelfSubjectReview as that token). */
  async accepted(token: string): Promise<boolean> {
    const rest = await this.#cluster.client({ token });
    try {
      const r = await rest.raw("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {
        body: JSON.stringify({
          apiVersion: "authentication.k8s.io/v1",
          kind: "SelfSubjectReview",
        }),
        contentType: "application/json",
      });
      return r.status === 201 || r.status === 200;
    } finally {
      rest.close();
    }
  }
}
