/**
 * The shipped manifests (deploy/kubernetes/*.yaml) applied to a real API server as
 * `kubectl apply --server-side` applies them: each YAML document is PATCHed as
 * `application/apply-patch+yaml` to its object's path (found by discovery), with strict
 * field validation, so the server's own validation and defaulting judge every field. A
 * document whose API the server does not serve (Kyverno's ClusterPolicy without Kyverno's
 * CRDs) is reported, not applied.
 *
 * @module
 */
import { parseAllDocuments } from "yaml";
import { z } from "zod";
import { ROOT } from "../../../scripts/_paths.ts";
import { type KubeRest, KubeStatusError, type Stored, StoredSchema } from "./rest.ts";

/** The folder of the shipped manifests. */
export const MANIFEST_DIR = `${ROOT}/deploy/kubernetes`;

/** The field manager the tests apply as. */
export const FIELD_MANAGER = "enim-tests";

const DocSchema = z.looseObject({
  apiVersion: z.string(),
  kind: z.string(),
  metadata: z.looseObject({ name: z.string(), namespace: z.optional(z.string()) }),
});

/** One document of a manifest. */
export interface ManifestDoc {
  file: string;
  apiVersion: string;
  kind: string;
  namespace?: string;
  name: string;
  /** The document's YAML text. */
  text: string;
}

/**
 * The files of deploy/kubernetes/ that are not part of an install: the uninstall Job, a
 * template the operator applies once per node to take enim away (docs/upgrading.md).
 */
export const NOT_INSTALLED = ["uninstall-job.yaml"];

/**
 * Every document of the `.yaml` files in `dir` (sorted by file name) that an install
 * applies (not {@linkcode NOT_INSTALLED}), parsed; for a cluster of `version` when given
 * ({@linkcode forRelease}).
 */
export async function readManifests(version?: string, dir = MANIFEST_DIR): Promise<ManifestDoc[]> {
  const files = [...Deno.readDirSync(dir)]
    .filter((e) => e.isFile && e.name.endsWith(".yaml") && !NOT_INSTALLED.includes(e.name))
    .map((e) => e.name)
    .sort();
  const out: ManifestDoc[] = [];
  for (const file of files) out.push(...await readFileDocs(dir, file));
  return version ? forRelease(out, version) : out;
}

/** The documents of one YAML file (`file` relative to `dir`), parsed. */
export async function readFileDocs(dir: string, file: string): Promise<ManifestDoc[]> {
  const out: ManifestDoc[] = [];
  const text = await Deno.readTextFile(`${dir}/${file}`);
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length) throw new Error(`${file}: ${doc.errors[0].message}`);
    const js = doc.toJS();
    if (js === null || js === undefined) continue;
    const d = DocSchema.parse(js);
    out.push({
      file,
      apiVersion: d.apiVersion,
      kind: d.kind,
      namespace: d.metadata.namespace,
      name: d.metadata.name,
      text: JSON.stringify(js),
    });
  }
  return out;
}

/** The fields of a kustomization.yaml that {@linkcode readKustomization} renders. */
const KustomizationSchema = z.looseObject({
  apiVersion: z.literal("kustomize.config.k8s.io/v1beta1"),
  kind: z.literal("Kustomization"),
  resources: z.array(z.string()),
  patches: z.optional(z.array(z.strictObject({ path: z.string() }))),
});

/**
 * The list fields whose items a strategic merge patch merges by a key (the Kubernetes
 * types' `patchMergeKey`) among those the shipped overlays patch; any other list is
 * replaced.
 */
const MERGE_KEYS: Record<string, string> = {
  containers: "name",
  initContainers: "name",
  volumes: "name",
  env: "name",
  volumeMounts: "mountPath",
  ports: "containerPort",
};

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json =>
  typeof v === "object" && v !== null && !Array.isArray(v);

/** `patch` merged into `base` as a strategic merge patch does (without directives). */
export function strategicMerge(base: unknown, patch: unknown, field = ""): unknown {
  if (isObject(base) && isObject(patch)) {
    const out: Json = { ...base };
    for (const [k, v] of Object.entries(patch)) {
      out[k] = v === null ? undefined : k in base ? strategicMerge(base[k], v, k) : v;
      if (out[k] === undefined) delete out[k];
    }
    return out;
  }
  const key = MERGE_KEYS[field];
  if (Array.isArray(base) && Array.isArray(patch) && key) {
    const out = [...base];
    for (const item of patch) {
      const i = out.findIndex((b) => isObject(b) && isObject(item) && b[key] === item[key]);
      if (i >= 0) out[i] = strategicMerge(out[i], item);
      else out.push(item);
    }
    return out;
  }
  return patch;
}

/**
 * The documents `kubectl apply -k <dir>` applies for the kustomization in `dir`: its
 * `resources` (files, in order), each `patches` file merged into the document of its
 * kind, namespace and name as a strategic merge patch; for a cluster of `version` when
 * given. Only what the shipped overlays use (a patch naming no resource throws).
 */
export async function readKustomization(dir: string, version?: string): Promise<ManifestDoc[]> {
  const raw = parseAllDocuments(await Deno.readTextFile(`${dir}/kustomization.yaml`));
  if (!Array.isArray(raw) || raw.length !== 1) throw new Error(`${dir}: one kustomization`);
  const k = KustomizationSchema.parse(raw[0].toJS());
  const docs: ManifestDoc[] = [];
  for (const r of k.resources) docs.push(...await readFileDocs(dir, r));
  for (const p of k.patches ?? []) {
    for (const patch of await readFileDocs(dir, p.path)) {
      const i = docs.findIndex((d) =>
        d.kind === patch.kind && d.name === patch.name && d.namespace === patch.namespace
      );
      if (i < 0) throw new Error(`${p.path}: no resource ${patch.kind} "${patch.name}" to patch`);
      const merged = strategicMerge(JSON.parse(docs[i].text), JSON.parse(patch.text));
      docs[i] = { ...docs[i], text: JSON.stringify(merged) };
    }
  }
  return version ? forRelease(docs, version) : docs;
}

/**
 * The documents as a cluster of `version` takes them, as eni-request-policy.yaml's own
 * comment says: MutatingAdmissionPolicy is `admissionregistration.k8s.io/v1` from 1.36;
 * on 1.34 and 1.35 it is written `v1beta1` (the API server needs the feature gate and the
 * runtime config, {@linkcode admissionFlags}).
 */
export function forRelease(docs: ManifestDoc[], version: string): ManifestDoc[] {
  const minor = Number(version.split(".")[1]);
  if (minor >= 36) return docs;
  return docs.map((d) => {
    if (!d.kind.startsWith("MutatingAdmissionPolicy")) return d;
    const apiVersion = "admissionregistration.k8s.io/v1beta1";
    const obj = JSON.parse(d.text);
    return { ...d, apiVersion, text: JSON.stringify({ ...obj, apiVersion }) };
  });
}

/** The kube-apiserver flags that serve MutatingAdmissionPolicy on `version` (none from 1.36). */
export function admissionFlags(version: string): string[] {
  const minor = Number(version.split(".")[1]);
  if (minor >= 36) return [];
  return [
    "--feature-gates=MutatingAdmissionPolicy=true",
    "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
  ];
}

/** What happened to one document. */
export type ApplyOutcome =
  | { doc: ManifestDoc; applied: Stored }
  | { doc: ManifestDoc; notServed: string };

/** Whether the server serves `apiVersion` at all (discovery answers 404 otherwise). */
async function served(rest: KubeRest, apiVersion: string): Promise<boolean> {
  const path = apiVersion.includes("/") ? `/apis/${apiVersion}` : `/api/${apiVersion}`;
  const r = await rest.raw("GET", path);
  return r.status === 200;
}

/**
 * Applies every document of `docs` in order (server-side apply, strict validation); a
 * document of an API the server does not serve is skipped with the reason. A document the
 * server refuses throws, naming the file.
 */
export async function applyManifests(rest: KubeRest, docs: ManifestDoc[]): Promise<ApplyOutcome[]> {
  const out: ApplyOutcome[] = [];
  for (const doc of docs) {
    if (!(await served(rest, doc.apiVersion))) {
      out.push({ doc, notServed: `the API server does not serve ${doc.apiVersion}` });
      continue;
    }
    const path = await rest.pathOf(doc.apiVersion, doc.kind, doc.namespace, doc.name);
    try {
      out.push({ doc, applied: await rest.apply(path, doc.text, StoredSchema, FIELD_MANAGER) });
    } catch (err) {
      if (err instanceof KubeStatusError) {
        throw new Error(`${doc.file}: ${doc.kind} "${doc.name}" was refused: ${err.message}`, {
          cause: err,
        });
      }
      throw err;
    }
  }
  return out;
}

const DryRunPodSchema = z.looseObject({
  spec: z.looseObject({
    containers: z.array(z.looseObject({
      resources: z.optional(z.looseObject({
        limits: z.optional(z.record(z.string(), z.string())),
      })),
    })),
  }),
});

/**
 * Waits until eni-request-policy.yaml's admission policy acts on pods of `namespace` (a
 * labelled one): the API server runs a new policy once its own watch has loaded it, a
 * moment after it is stored, and admits pods without the request until then. Probes with
 * dry-run pods (admission runs, nothing is stored); returns how long it waited (ms).
 */
export async function waitEniPolicy(
  rest: KubeRest,
  namespace: string,
  timeoutMs = 30_000,
): Promise<number> {
  const t0 = performance.now();
  for (;;) {
    const pod = await rest.create(
      `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods`,
      {
        apiVersion: "v1",
        kind: "Pod",
        metadata: { name: "enim-policy-probe" },
        spec: { containers: [{ name: "probe", image: "registry.example.com/probe:1" }] },
      },
      DryRunPodSchema,
      { dryRun: "All" },
    );
    if (pod.spec.containers[0].resources?.limits?.["enim.dev/eni"] === "1") {
      return Math.round(performance.now() - t0);
    }
    if (performance.now() - t0 > timeoutMs) {
      throw new Error(`The ENI admission policy did not act on "${namespace}" in ${timeoutMs} ms`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}
