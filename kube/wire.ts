/**
 * The API server's envelopes around the objects (kube/objects.ts holds the objects
 * themselves), from the Kubernetes "API Concepts" page and `k8s.io/apimachinery`'s
 * `metav1` types: a list (`metav1.ListMeta` and `items`), a watch event (`type` and
 * `object`, one JSON object per line), a bookmark's object (its `resourceVersion`
 * alone) and `metav1.Status`, the body of every error and of a watch's `ERROR` event.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";

/** `metav1.Status`, the parts a client acts on. */
export const StatusSchema = z.object({
  status: z.optional(z.string()),
  message: z.optional(z.string()),
  /** `Expired`, `Gone`, `Unauthorized`, `Forbidden`, `NotFound`, `Timeout`, … */
  reason: z.optional(z.string()),
  /** The HTTP status it stands for (410 for an expired resourceVersion). */
  code: z.optional(z.number()),
});
/** An API error as the server describes it. */
export type Status = z.infer<typeof StatusSchema>;

/**
 * A list: `metadata.resourceVersion` (the point the list is consistent at, where a watch
 * starts), `metadata.continue` (the next page's token, absent on the last page) and the
 * items, each parsed afterwards by its kind's schema (one bad item is skipped, not the
 * page). Go encodes an empty slice as `null`, so `items` may be null.
 */
export const ListSchema = z.object({
  metadata: z._default(
    z.object({
      resourceVersion: z.optional(z.string()),
      continue: z.optional(z.string()),
    }),
    {},
  ),
  items: z.nullish(z.array(z.unknown())),
});
/** A list page. */
export type List = z.infer<typeof ListSchema>;

/** The watch event types (`metav1.WatchEvent`). */
export const WATCH_EVENT_TYPES = ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"] as const;

/** `metav1.WatchEvent`: the object is parsed by the event's type (an object, a bookmark, a Status). */
export const WatchEventSchema = z.object({
  type: z.enum(WATCH_EVENT_TYPES),
  object: z.record(z.string(), z.unknown()),
});
/** One line of a watch stream. */
export type WatchEvent = z.infer<typeof WatchEventSchema>;

/** A `BOOKMARK` event's object: only its `resourceVersion` is meaningful. */
export const BookmarkSchema = z.object({
  metadata: z.object({ resourceVersion: z.string().check(z.minLength(1)) }),
});
