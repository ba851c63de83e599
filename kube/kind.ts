/**
 * One kind of Kubernetes object as a cache sees it: where it is listed and watched, the
 * schema that parses (and trims) it, whether it is namespaced, its indexes, and the key
 * of an object.
 *
 * @module
 */
import type { Indexers } from "./store.ts";

/** What every object the cache holds has: its name, namespace and resourceVersion. */
export interface KubeObject {
  metadata: { name: string; namespace?: string; resourceVersion?: string };
}

/** A schema that parses one object of a kind (zod's `safeParse` shape). */
export interface ObjectSchema<T> {
  safeParse(
    value: unknown,
  ): { success: true; data: T } | {
    success: false;
    error: { issues: readonly { path: readonly PropertyKey[]; message: string }[] };
  };
}

/** One kind of object: where it is listed and watched, how it is parsed and indexed. */
export interface ResourceKind<T extends KubeObject> {
  /** The resource's plural name (`pods`), for logs and stats. */
  resource: string;
  /** The cluster-wide collection path (`/api/v1/pods`). */
  path: string;
  /** Parses an item or an event's object (and trims it). */
  schema: ObjectSchema<T>;
  /** Whether its objects live in namespaces (the key is then `namespace/name`). */
  namespaced: boolean;
  /** Secondary indexes. */
  indexers?: Indexers<T>;
}

/** The key of an object: `namespace/name`, or `name` when it has no namespace. */
export function objectKey(obj: KubeObject): string {
  return obj.metadata.namespace
    ? `${obj.metadata.namespace}/${obj.metadata.name}`
    : obj.metadata.name;
}
