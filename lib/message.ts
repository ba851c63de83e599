/**
 * The message of a thrown value, fit for a user: Deno's permission errors
 * (`NotCapable`: 'Requires read access to "/x", run again with the --allow-read
 * flag') become a sentence about enim's permission set; users of a CNI plugin
 * cannot "run it again with a flag", and the hint would mislead them.
 *
 * @module
 */

/** What a thrown value says, without Deno's runtime hints. */
export function userMessage(err: unknown): string {
  let text: string;
  try {
    text = err instanceof Error ? err.message : String(err);
  } catch {
    text = Object.prototype.toString.call(err);
  }
  const m = /^Requires (\w+) access to (".*?"|\S+), run again with the --[\w-]+ flag$/.exec(text);
  if (m) return `enim's permission set does not allow ${m[1]} access to ${m[2]}`;
  return text.replace(/, run again with the --[\w-]+ flag/g, "");
}
