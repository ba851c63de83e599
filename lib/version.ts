/** enim's version, reported by `enim version`, the agent's status and the logs. */
export const VERSION = "0.1.0";
