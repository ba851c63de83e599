/**
 * The provider registry, as data: name → lazy import with a literal specifier,
 * so `deno compile` embeds every provider and only the chosen one is loaded.
 *
 * Each module's default export is a {@linkcode ProviderModule}.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import type { ProviderModule } from "./contract.ts";

/** Every provider, by name. */
export const PROVIDERS = {
  mock: () => import("./mock/mod.ts"),
  bce: () => import("./bce/mod.ts"),
} as const;

/** A provider name. */
export type ProviderName = keyof typeof PROVIDERS;
/** Every provider's name: the registry is the one list (the config schema reads it). */
export const PROVIDER_NAMES = Object.keys(PROVIDERS) as [ProviderName, ...ProviderName[]];
/** A provider name. */
export const ProviderNameSchema = z.enum(PROVIDER_NAMES);

/**
 * Loads a provider's module by name.
 *
 * @example
 * ```ts ignore
 * const mod = await loadProvider("mock");
 * const provider = await mod.create(z.parse(mod.configSchema, { enis: 4 }), { db, log });
 * ```
 */
export async function loadProvider(name: ProviderName): Promise<ProviderModule> {
  const parsed = ProviderNameSchema.safeParse(name);
  if (!parsed.success) {
    throw new Error(
      `Unknown provider "${name}": expected one of ${ProviderNameSchema.options.join(", ")}`,
    );
  }
  const mod: unknown = await PROVIDERS[parsed.data]();
  // The default export, or the module itself when it exports configSchema and create by name.
  return ((mod as { default?: ProviderModule }).default ?? mod) as ProviderModule;
}
