/**
 * English error messages for `zod/mini`.
 *
 * Classic zod installs its English locale when it builds its first schema;
 * `zod/mini` installs none, so without this module every default message would
 * be "Invalid input". Every module that uses zod/mini at run time imports it
 * for its side effect (`import "./zod_locale.ts";`), so the messages are
 * the same whichever module a process loads first, and whether classic zod (the
 * BCE provider, the tests) is loaded too.
 *
 * `en` comes from `zod/locales` by name, so the bundle holds only English: a
 * run-time `z.locales` or `z.core` (namespace objects) would keep every
 * language and all of zod's core in the agent's chunks (~380 KB minified).
 *
 * @module
 */
import { config } from "zod/mini";
import { en } from "zod/locales";

config(en());
