/** The CNI plugin's process entry (stub until the CNI layer lands). @module */

/** Runs the plugin against the real process environment, stdin and stdout. */
export function runPluginFromProcess(): Promise<number> {
  return Promise.resolve(1);
}
