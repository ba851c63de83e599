/**
 * The agent's configuration: a JSONC file (default `/etc/enim/agent.jsonc`),
 * overridden by `ENIM_*` environment variables, overridden in turn by flags.
 *
 * The file is parsed with jsonc-parser (comments and trailing commas allowed;
 * syntax errors reported with line and column) and validated with zod; every
 * error names the field path and, for an override, where the value came from.
 * The provider's own section (`provider.<name>`) is validated afterwards by the
 * provider module's `configSchema` ({@linkcode validateProviderConfig}).
 *
 * See `deploy/agent.jsonc` for an example with every option.
 *
 * Why one file: the schema is the one list of the agent's options, read top to bottom
 * beside `deploy/agent.jsonc`; its loader and overrides only make sense with it.
 *
 * @module
 */
import { DEFAULT_SOCKET } from "../api/wire.ts";
import { MarkConfigSchema } from "../api/schema.ts";
import { DEFAULT_JUDGED_MARK } from "../policy/fence.ts";
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { parse as parseJsonc, type ParseError, printParseErrorCode } from "jsonc-parser";
import { LEVELS } from "../lib/log.ts";
import { clip, listOf } from "../lib/clip.ts";
import type { ProviderModule } from "../providers/contract.ts";
import { PROVIDER_NAMES, type ProviderName } from "../providers/registry.ts";
import { isIp } from "../lib/ip.ts";

/** The default config file. */
export const DEFAULT_CONFIG_PATH = "/etc/enim/agent.jsonc";
/** The default state database. */
export const DEFAULT_STATE_PATH = "/var/lib/enim/enim.db";
/**
 * kubelet's device-plugin folder (`DevicePluginPath` of kubernetes/kubelet
 * pkg/apis/deviceplugin/v1beta1/constants.go): kubelet's `kubelet.sock` and every
 * plugin's socket.
 */
export const DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins";
/** The TCP port of `GET /metrics` and `GET /healthz` (`metrics.port`). */
export const DEFAULT_METRICS_PORT = 9798;
/** Where the agent writes the CNI network configuration (`cniConfig.destination`). */
export const DEFAULT_CONFLIST_PATH = "/etc/cni/net.d/10-enim.conflist";

/** The extended resource the device plugin advertises: one per ENI a pod can get. */
export const DEVICE_PLUGIN_RESOURCE = "enim.dev/eni";

export { PROVIDER_NAMES };

/** Each provider's own section (`provider.<name>`), validated later by its module's schema. */
const providerSections = Object.fromEntries(
  PROVIDER_NAMES.map((n) => [n, z.optional(z.record(z.string(), z.unknown()))]),
) as Record<ProviderName, z.ZodMiniOptional<z.ZodMiniRecord<z.ZodMiniString, z.ZodMiniUnknown>>>;

const AbsolutePath = z.string().check(
  z.minLength(1),
  z.refine(
    (s) => s.startsWith("/") && !s.split("/").some((p) => p === ".."),
    "Expected an absolute path without '..'",
  ),
);

/** The agent configuration, as the file holds it (every field optional but `provider.name`). */
export const AgentConfigSchema = z.strictObject({
  /** The API's unix socket. */
  socket: z._default(AbsolutePath, DEFAULT_SOCKET),
  /** The SQLite state database. */
  statePath: z._default(AbsolutePath, DEFAULT_STATE_PATH),
  provider: z.strictObject({
    name: z.enum(PROVIDER_NAMES),
    ...providerSections,
  }),
  gc: z.prefault(
    z.strictObject({
      intervalSeconds: z._default(z.number().check(z.positive(), z.maximum(86_400)), 30),
      graceSeconds: z._default(z.number().check(z.minimum(0), z.maximum(86_400)), 30),
    }),
    {},
  ),
  log: z.prefault(
    z.strictObject({
      level: z._default(z.enum(LEVELS), "info"),
      format: z._default(z.literal("json"), "json"),
      /** A file to append log lines to; stderr when absent. */
      file: z.optional(AbsolutePath),
    }),
    {},
  ),
  timeouts: z.prefault(
    z.strictObject({
      /** How long the API waits for one ADD before answering `busy`. */
      addSeconds: z._default(z.number().check(z.positive(), z.maximum(3600)), 120),
      /** How long one provider call may take before it fails as `unavailable`. */
      providerSeconds: z._default(z.number().check(z.positive(), z.maximum(3600)), 60),
      /**
       * How long, in all, an ADD that finds no free ENI waits for DELs that have answered
       * and are still bringing their ENIs home, before it answers `no_eni_available`.
       */
      delWaitSeconds: z._default(z.number().check(z.minimum(0), z.maximum(600)), 10),
      /**
       * How long one child process (`ip`, `tc`, `nft`, `nsenter`, `stat`) may run before
       * it is killed (SIGTERM, then SIGKILL) and its operation fails.
       */
      commandSeconds: z._default(z.number().check(z.positive(), z.maximum(600)), 10),
    }),
    {},
  ),
  /** The API server's limits: what one client can hold. */
  api: z.prefault(
    z.strictObject({
      /** The most connections served at once; one more is answered 503 at once. */
      maxConnections: z._default(z.int().check(z.minimum(1), z.maximum(4096)), 64),
      /** How long a client has to send its whole request; then 408 and it is closed. */
      requestTimeoutSeconds: z._default(z.number().check(z.positive(), z.maximum(3600)), 10),
    }),
    {},
  ),
  /**
   * `GET /metrics` and `GET /healthz` over TCP, for Prometheus and kubelet's probes (the
   * API that changes the node stays on the socket). Off unless enabled: a node running the
   * agent under systemd opens no port it was not asked to.
   */
  metrics: z.prefault(
    z.strictObject({
      enabled: z._default(z.boolean(), false),
      /** The address to bind: the node's, or 0.0.0.0 / :: for every one. */
      address: z._default(
        z.string().check(z.refine(isIp, "Expected an IPv4 or IPv6 address")),
        "0.0.0.0",
      ),
      port: z._default(z.int().check(z.minimum(1), z.maximum(65_535)), DEFAULT_METRICS_PORT),
    }),
    {},
  ),
  /** Liveness (`agent/health.ts`): what counts as a wedged agent. */
  health: z.prefault(
    z.strictObject({
      /** How long the manager's held locks may go without one taken or released. */
      stallSeconds: z._default(z.number().check(z.minimum(1), z.maximum(86_400)), 300),
      /**
       * The agent's own probe socket (`agent/probe.ts`, `enim probe`): answered from start-up,
       * also while the agent waits as a standby for another one's lock (absent: none).
       */
      probeSocket: z.optional(AbsolutePath),
    }),
    {},
  ),
  /**
   * The CNI network configuration the agent writes onto the node once it answers on its
   * socket (absent: it writes none): `source` (the mounted ConfigMap's file) copied to
   * `destination`, atomically, mode 0644. Kept when the agent stops.
   */
  cniConfig: z.optional(z.strictObject({
    source: AbsolutePath,
    destination: z._default(AbsolutePath, DEFAULT_CONFLIST_PATH),
  })),
  /**
   * The host link's marks on the node (`netns/host_link.ts` `HostLinkMarks`): enim's own
   * bit, set and read only on what comes in from a node end, and the masquerade bit
   * kube-proxy uses (`--iptables-masquerade-bit`), read, never set.
   */
  hostLink: z.prefault(
    z.strictObject({
      nodeMark: z._default(MarkConfigSchema, 0x1000),
      kubeProxyMasqueradeMark: z._default(MarkConfigSchema, 0x4000),
      /**
       * How often the node's host-link table (`inet enim`) is checked (a missing or
       * changed one is loaded again); 0: only by the GC pass.
       */
      tableCheckSeconds: z._default(z.number().check(z.minimum(0), z.maximum(3600)), 2),
    }).check(z.refine((h) => h.nodeMark !== h.kubeProxyMasqueradeMark, {
      message: "hostLink.nodeMark and hostLink.kubeProxyMasqueradeMark need a bit each",
    })),
    {},
  ),
  /** Sticky pods (`enim.dev/sticky`): how long a deleted pod's ENI waits for it to come back. */
  sticky: z.prefault(
    z.strictObject({
      holdSeconds: z._default(z.number().check(z.positive(), z.maximum(7 * 86_400)), 300),
    }),
    {},
  ),
  /**
   * Whether an owned ENI's description in the cloud names its pod and node (set
   * after the ADD answered, restored when the ENI is freed; one provider call each).
   */
  cloudDescriptions: z._default(z.boolean(), true),
  /**
   * How long a starting agent waits for another agent on the node to release the
   * lock beside the state (a DaemonSet's rolling update), before it gives up.
   */
  lockWaitSeconds: z._default(z.number().check(z.minimum(0), z.maximum(3600)), 60),
  /**
   * The kubelet device plugin `enim.dev/eni`: the node's ENI capacity advertised to
   * kubelet, so the scheduler places a pod only where it can get an ENI.
   */
  devicePlugin: z.prefault(
    z.strictObject({
      /**
       * `auto`: serve it when kubelet's folder exists at start-up (a Kubernetes node);
       * `true`: serve it, waiting for the folder if need be; `false`: never.
       */
      enabled: z._default(z.union([z.boolean(), z.literal("auto")]), "auto"),
      /** kubelet's device-plugin folder (the enim permission set allows this one only). */
      dir: z._default(AbsolutePath, DEFAULT_DEVICE_PLUGIN_DIR),
      /** How often the provider's capacity is read (a new list goes to kubelet when it changed). */
      resyncSeconds: z._default(z.number().check(z.minimum(0.05), z.maximum(3600)), 5),
      /** How long the provider may fail before every device is advertised Unhealthy. */
      unreachableSeconds: z._default(z.number().check(z.minimum(0), z.maximum(86_400)), 60),
      /** How long kubelet has to answer a Register before it is tried again. */
      registerTimeoutSeconds: z._default(z.number().check(z.positive(), z.maximum(600)), 5),
    }),
    {},
  ),
  /**
   * The Kubernetes API, read by the agent alone (kube/). Without `kubeconfig` (or the
   * `KUBECONFIG` variable) the agent uses its pod's service account (in-cluster).
   */
  kubernetes: z.prefault(
    z.strictObject({
      /** A kubeconfig (JSON or YAML); the enim permission set reads /etc/enim. */
      kubeconfig: z.optional(AbsolutePath),
      /** The kubeconfig's context to use (default: its `current-context`). */
      context: z.optional(z.string().check(z.minLength(1), z.maxLength(253))),
      /** This node's name in Kubernetes (default: `NODE_NAME`, else the host name). */
      nodeName: z.optional(
        z.string().check(
          z.regex(
            /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/,
            "Expected a Kubernetes node name (lowercase letters, digits, '-' and '.')",
          ),
        ),
      ),
      /** Objects per list page (`limit`). */
      pageSize: z._default(z.int().check(z.minimum(1), z.maximum(10_000)), 500),
      /** How long one list page or one GET may take. */
      requestTimeoutSeconds: z._default(z.number().check(z.positive(), z.maximum(600)), 30),
      /** A watch ends on the server after a random [w, 2w) seconds and starts again. */
      watchTimeoutSeconds: z._default(z.int().check(z.minimum(10), z.maximum(3600)), 300),
      /**
       * How often the API server sends each watch a bookmark (kube-apiserver: every
       * minute); a watch that hears nothing for twice this is taken for dead.
       */
      watchBookmarkSeconds: z._default(z.number().check(z.positive(), z.maximum(600)), 60),
    }),
    {},
  ),
  /**
   * Kubernetes NetworkPolicy for the node's enim pods (with a host link), enforced by
   * the agent in each pod's namespace and at its host link's node end.
   */
  networkPolicy: z.prefault(
    z.strictObject({
      /**
       * `auto`: on when the Kubernetes API is configured (`kubernetes.kubeconfig`,
       * `KUBECONFIG`, or a pod's service account: `KUBERNETES_SERVICE_HOST`); `true`: on
       * (the agent does not start without API access); `false`: off.
       */
      enabled: z._default(z.union([z.boolean(), z.literal("auto")]), "auto"),
      /** How long an ADD waits for the first sync with the API server before it fails (11). */
      syncWaitSeconds: z._default(z.number().check(z.minimum(0), z.maximum(600)), 10),
      /** Dropped packets logged per second and chain (the kernel log); 0: none. */
      logDropsPerSecond: z._default(z.int().check(z.minimum(0), z.maximum(10_000)), 0),
      /**
       * How often the agent looks again for kube-proxy's IPVS mode (`kube-ipvs0`,
       * `/proc/net/ip_vs`), under which it refuses ADDs (`agent/ipvs.ts`).
       */
      ipvsCheckSeconds: z._default(z.number().check(z.minimum(0.1), z.maximum(3600)), 5),
      /** Where IPVS lists its virtual services (tests point it elsewhere). */
      ipvsProcFile: z._default(
        z.string().check(z.regex(/^\/[^\0]*$/, "Expected an absolute path")),
        "/proc/net/ip_vs",
      ),
      /**
       * The most a freed ENI waits before it goes back to the pool while the API still
       * shows its last pod holding its addresses; 0: no wait.
       */
      reuseWaitSeconds: z._default(z.number().check(z.minimum(0), z.maximum(600)), 30),
      // ---- raw sockets (issue 48) ----
      /**
       * `auto`: each isolated pod gets the raw-socket guard (an nftables `netdev` egress
       * chain on its ENI) where the kernel has it (probed at start); `false`: none, as on a
       * kernel without it (the pod must then lack `NET_RAW`).
       */
      rawSocketGuard: z._default(z.union([z.literal(false), z.literal("auto")]), "auto"),
      /**
       * What ADD does with a pod a policy isolates that can reach past it (`NET_ADMIN`;
       * `NET_RAW` without the guard): `flag` admits it and says so (status, metric, log),
       * `refuse` fails its ADD.
       */
      rawCapablePods: z._default(z.enum(["flag", "refuse"]), "flag"),
      /**
       * The capabilities the container runtime gives a container that neither adds nor
       * drops them (containerd's default set holds `NET_RAW`; CRI-O's does not: `[]`).
       */
      runtimeDefaultCapabilities: z._default(z.array(z.string().check(z.regex(/^[A-Za-z_]+$/))), [
        "NET_RAW",
      ]),
      /**
       * How often the policy tables are checked against what was loaded (a missing or
       * changed one is loaded again); 0: never.
       */
      tableCheckSeconds: z._default(z.number().check(z.minimum(0), z.maximum(3600)), 2),
      /**
       * The packet mark's bit the node's policy table sets on what it judged, which the
       * fence (`policy/fence.ts`) lets through node ends while that table is gone; 0: no
       * fence. A bit neither kube-proxy nor the host link uses.
       */
      judgedMark: z._default(z.union([z.literal(0), MarkConfigSchema]), DEFAULT_JUDGED_MARK),
    }),
    {},
  ),
  /** `ip`: the real device layer. `fake`: in-memory, for tests and dry demos only. */
  devices: z._default(z.enum(["ip", "fake"]), "ip"),
  /**
   * Test and demo only: makes the mock provider's attached ENIs appear as veth
   * devices whose peers sit on `bridge` in the `vpcNetns` namespace.
   */
  deviceSimulator: z.optional(z.strictObject({
    vpcNetns: z.string().check(
      z.minLength(1),
      z.maxLength(255),
      z.regex(/^[A-Za-z0-9_.-]+$/, "Expected a netns name"),
    ),
    bridge: z.string().check(
      z.minLength(1),
      z.maxLength(15),
      z.regex(/^[A-Za-z0-9_.-]+$/, "Expected a device name"),
    ),
  })),
}).check(z.refine(
  (c) =>
    c.networkPolicy.judgedMark !== c.hostLink.nodeMark &&
    c.networkPolicy.judgedMark !== c.hostLink.kubeProxyMasqueradeMark,
  {
    message:
      "networkPolicy.judgedMark needs a bit of its own (not hostLink.nodeMark's or hostLink.kubeProxyMasqueradeMark's)",
    path: ["networkPolicy", "judgedMark"],
  },
));
/** The validated agent configuration (defaults applied). */
export type AgentConfig = z.output<typeof AgentConfigSchema>;

/** Overrides from flags (`enim agent --socket …`); undefined means "not given". */
export interface ConfigFlags {
  config?: string;
  socket?: string;
  state?: string;
  provider?: string;
  logLevel?: string;
  gcInterval?: string | number;
  gcGrace?: string | number;
  lockWait?: string | number;
  probeSocket?: string;
}

/** One override: the flag or variable, the field it sets, and whether it is a number. */
interface Override {
  flag: keyof ConfigFlags;
  flagName: string;
  env: string;
  path: string[];
  numeric?: boolean;
}

/** The overridable fields: flag ↔ environment variable ↔ config path. */
export const OVERRIDES: readonly Override[] = [
  { flag: "socket", flagName: "--socket", env: "ENIM_SOCKET", path: ["socket"] },
  { flag: "state", flagName: "--state", env: "ENIM_STATE", path: ["statePath"] },
  { flag: "provider", flagName: "--provider", env: "ENIM_PROVIDER", path: ["provider", "name"] },
  { flag: "logLevel", flagName: "--log-level", env: "ENIM_LOG_LEVEL", path: ["log", "level"] },
  {
    flag: "gcInterval",
    flagName: "--gc-interval",
    env: "ENIM_GC_INTERVAL",
    path: ["gc", "intervalSeconds"],
    numeric: true,
  },
  {
    flag: "lockWait",
    flagName: "--lock-wait",
    env: "ENIM_LOCK_WAIT",
    path: ["lockWaitSeconds"],
    numeric: true,
  },
  {
    flag: "probeSocket",
    flagName: "--probe-socket",
    env: "ENIM_PROBE_SOCKET",
    path: ["health", "probeSocket"],
  },
  {
    flag: "gcGrace",
    flagName: "--gc-grace",
    env: "ENIM_GC_GRACE",
    path: ["gc", "graceSeconds"],
    numeric: true,
  },
];

/** The configuration could not be read or is invalid; `problems` lists each one. */
export class ConfigError extends Error {
  readonly problems: string[];
  constructor(source: string, problems: string[], options?: { cause?: unknown }) {
    super(`Invalid agent configuration in ${source}:\n  ${problems.join("\n  ")}`, options);
    this.name = "ConfigError";
    this.problems = problems;
  }
}

/** Where the raw values come from: the file's text, the environment and the flags. */
export interface ConfigSources {
  /** The file's path (for messages) and text; text undefined means "no file". */
  file?: { path: string; text: string };
  env?: Record<string, string | undefined>;
  flags?: ConfigFlags;
}

/** Line and column (1-based) of an offset in `text`. */
function lineCol(text: string, offset: number): { line: number; col: number } {
  const before = text.slice(0, offset).split("\n");
  return { line: before.length, col: before[before.length - 1].length + 1 };
}

/** Parses JSONC text into a value, or throws a {@linkcode ConfigError} with line/column. */
export function parseConfigText(path: string, text: string): unknown {
  const errors: ParseError[] = [];
  const value = parseJsonc(text, errors, { allowTrailingComma: true, disallowComments: false });
  if (errors.length > 0) {
    throw new ConfigError(
      `"${path}"`,
      errors.map((e) => {
        const { line, col } = lineCol(text, e.offset);
        return `line ${line}, column ${col}: ${printParseErrorCode(e.error)}`;
      }),
    );
  }
  if (value === undefined) return {};
  return value;
}

/** Formats a zod issue path as `a.b[0].c`. */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const p of path) {
    if (typeof p === "number") out += `[${p}]`;
    else out += out === "" ? String(p) : `.${String(p)}`;
  }
  return out;
}

/** Formats zod issues as `path: message` lines, prefixing each path with `prefix`. */
export function formatIssues(
  issues: readonly z.core.$ZodIssue[],
  prefix: readonly PropertyKey[] = [],
  sourceOf: (path: string) => string | undefined = () => undefined,
): string[] {
  return issues.map((i) => {
    const keys = i.code === "unrecognized_keys"
      ? ` (${listOf(i.keys.map((k) => clip(k, 100)))})`
      : "";
    const path = formatPath([...prefix, ...i.path]) || "(top level)";
    const from = sourceOf(path);
    return `${path}${from ? ` (from ${from})` : ""}: ${i.message}${keys}`;
  });
}

function setPath(obj: Record<string, unknown>, path: string[], value: unknown): void {
  let cur = obj;
  for (const key of path.slice(0, -1)) {
    const next = cur[key];
    if (next === null || typeof next !== "object" || Array.isArray(next)) cur[key] = {};
    cur = cur[key] as Record<string, unknown>;
  }
  cur[path[path.length - 1]] = value;
}

/**
 * Builds the configuration from its sources (no I/O): file, then env, then flags.
 * Throws {@linkcode ConfigError}.
 */
export function resolveConfig(sources: ConfigSources): AgentConfig {
  const fileLabel = sources.file ? `"${sources.file.path}"` : "the defaults";
  let raw: unknown = sources.file ? parseConfigText(sources.file.path, sources.file.text) : {};
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new ConfigError(fileLabel, ["(top level): Expected an object"]);
  }
  raw = structuredClone(raw);
  const origin = new Map<string, string>();
  for (const o of OVERRIDES) {
    const fromEnv = sources.env?.[o.env];
    const fromFlag = sources.flags?.[o.flag];
    let value: string | number | undefined;
    let label: string | undefined;
    if (fromEnv !== undefined && fromEnv !== "") [value, label] = [fromEnv, o.env];
    if (fromFlag !== undefined) [value, label] = [fromFlag, o.flagName];
    if (value === undefined || label === undefined) continue;
    let v: unknown = value;
    if (o.numeric && typeof value === "string" && value.trim() !== "") {
      const n = Number(value);
      if (!Number.isNaN(n)) v = n;
    }
    setPath(raw as Record<string, unknown>, o.path, v);
    origin.set(o.path.join("."), label);
  }
  const parsed = AgentConfigSchema.safeParse(raw);
  if (!parsed.success) {
    throw new ConfigError(
      fileLabel,
      formatIssues(parsed.error.issues, [], (p) => origin.get(p)),
    );
  }
  return parsed.data;
}

/**
 * Reads and resolves the configuration. The file is `flags.config`, else
 * `ENIM_CONFIG`, else {@linkcode DEFAULT_CONFIG_PATH}; a missing default file
 * is not an error (defaults, env and flags apply), a missing named one is.
 */
export async function loadConfig(
  flags: ConfigFlags,
  env: Record<string, string | undefined>,
): Promise<AgentConfig> {
  const named = flags.config ?? (env.ENIM_CONFIG || undefined);
  const path = named ?? DEFAULT_CONFIG_PATH;
  let text: string | undefined;
  try {
    text = await Deno.readTextFile(path);
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound) || named !== undefined) {
      const why = err instanceof Error ? err.message : String(err);
      throw new ConfigError(`"${path}"`, [`Cannot read the config file: ${why}`], { cause: err });
    }
  }
  return resolveConfig({ file: text === undefined ? undefined : { path, text }, env, flags });
}

/** The environment variables the agent reads (`ENIM_*` only). */
export function enimEnv(): Record<string, string | undefined> {
  const out: Record<string, string | undefined> = {};
  for (const name of ["ENIM_CONFIG", ...OVERRIDES.map((o) => o.env)]) {
    out[name] = Deno.env.get(name);
  }
  return out;
}

/**
 * Validates the provider's own section (`provider.<name>`, `{}` when absent) with
 * the provider module's schema; errors are prefixed with the section's path.
 */
export function validateProviderConfig<C>(cfg: AgentConfig, module: ProviderModule<C>): C {
  const name = cfg.provider.name;
  const section = cfg.provider[name] ?? {};
  const parsed = z.safeParse(module.configSchema, section);
  if (!parsed.success) {
    throw new ConfigError(
      `the "provider.${name}" section`,
      formatIssues(parsed.error.issues, ["provider", name]),
    );
  }
  return parsed.data;
}

/**
 * {@linkcode validateProviderConfig}, then the provider's own check of what the
 * section points at (`ProviderModule.check`: the BCE credentials, say), for
 * `enim agent --check-config`; a failure is a {@linkcode ConfigError}.
 */
export async function checkProviderConfig<C>(
  cfg: AgentConfig,
  module: ProviderModule<C>,
): Promise<C> {
  const parsed = validateProviderConfig(cfg, module);
  try {
    await module.check?.(parsed);
  } catch (e) {
    throw new ConfigError(`the "provider.${cfg.provider.name}" section`, [
      e instanceof Error ? e.message : String(e),
    ], { cause: e });
  }
  return parsed;
}
