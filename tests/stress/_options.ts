/**
 * The options of `deno task stress` (scripts/stress.ts), parsed from argv with
 * `node:util`'s parseArgs and validated with zod.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { z } from "zod";

/** The client operations and their default weights. */
export const DEFAULT_OP_WEIGHTS = {
  /** ADD the pod's current container (a retry when it was ADDed already). */
  add: 30,
  /** DEL the pod's current container or an older one. */
  del: 20,
  /** CHECK an intact attachment against its ADD result. */
  check: 10,
  /** The CNI GC verb, sometimes leaving one attachment out of the valid list. */
  cni_gc: 4,
  /** `enim gc` (plugin-side clients) or `POST /v1/gc` (API clients). */
  gc: 4,
  /** Delete the pod's namespace and create a new one at the same path. */
  replace: 8,
  /** Delete the pod's namespace (or an older sandbox's) without DEL. */
  delete_pod: 6,
  /** A new sandbox (new namespace, new container) while the old one still exists. */
  new_sandbox: 5,
  /** ADD into a fresh namespace that is replaced while the ADD runs (issue 17 point 4). */
  add_race: 3,
} as const;

/** An operation name. */
export type OpName = keyof typeof DEFAULT_OP_WEIGHTS;

const OpWeightsSchema = z.record(
  z.enum(Object.keys(DEFAULT_OP_WEIGHTS) as [OpName, ...OpName[]]),
  z.number().min(0),
);

/** Everything a stress run is told. */
export const StressOptionsSchema = z.object({
  seed: z.number().int().min(0).max(2 ** 32 - 1),
  /** Agent SIGKILLs (serving and start-up kills together). */
  kills: z.number().int().min(0),
  /** Plugin processes to SIGKILL mid-call (a target; reached when enough plugin calls run). */
  pluginKills: z.number().int().min(0),
  clients: z.number().int().min(1).max(64),
  pods: z.number().int().min(1).max(200),
  enis: z.number().int().min(1).max(200),
  /** Stop after this many minutes even if the kills are not done (0: no limit). */
  minutes: z.number().min(0),
  /** The agent's `gc.graceSeconds` during the run (the final pass runs with 0). */
  graceSeconds: z.number().int().min(0),
  /** Probability that a restart is followed by a kill during start-up. */
  startupKillRate: z.number().min(0).max(1),
  ops: OpWeightsSchema,
  /**
   * Give each new pod namespace a new path (as containerd does) instead of re-creating
   * it at the pod's one path (the default: a stale path then names a newer namespace).
   */
  freshPaths: z.boolean(),
  /**
   * The stale-GC schedule: CNI GC is sent beside ADDs and DELs with a valid list taken a
   * while before (a runtime that breaks the spec's exclusivity rule, or a second tool);
   * needs a grace period, which is what protects a young attachment from such a list.
   */
  staleGc: z.boolean(),
  /** Run the planted violations (the checker must catch each). */
  plant: z.boolean(),
  /** Stop at the first violation. */
  stopOnViolation: z.boolean(),
  /** Also run the fuzz (full size) after the stress. */
  fuzz: z.boolean(),
  /** Only the fuzz. */
  fuzzOnly: z.boolean(),
  fuzzPlugin: z.number().int().min(0),
  fuzzApi: z.number().int().min(0),
  /** Run every fuzz class, also those issue 17 lists as failing today. */
  fuzzAll: z.boolean(),
  /**
   * The zone mode (issue 26): two nodes on the BCE provider, zone-sticky pods moving
   * between them, either agent killed mid-park and mid-claim (`_zone.ts`).
   */
  zone: z.boolean(),
  /** Zone mode: pods without stickiness beside the sticky ones (`pods`). */
  plainPods: z.number().int().min(0).max(50),
  /** Zone mode: the sticky hold (s): how long a parked ENI waits for its pod. */
  holdSeconds: z.number().int().min(1).max(3600),
  /** Zone mode: how long each attach and detach takes in the fake cloud (ms). */
  cloudDelayMs: z.number().int().min(0).max(10_000),
  /** Write the whole report as JSON here. */
  out: z.string().optional(),
  verbose: z.boolean(),
}).refine((o) => !o.staleGc || o.graceSeconds > 0, {
  path: ["grace-seconds"],
  message: "The stale-GC schedule needs a grace period above 0: it is what keeps a stale " +
    "list from taking an attachment that was just made",
});
/** Everything a stress run is told. */
export type StressOptions = z.infer<typeof StressOptionsSchema>;

/** The defaults: a CI-sized run of a few minutes. */
export function defaultOptions(
  seed = crypto.getRandomValues(new Uint32Array(1))[0],
): StressOptions {
  return {
    seed,
    kills: 100,
    pluginKills: 40,
    clients: 6,
    pods: 10,
    enis: 6,
    minutes: 0,
    graceSeconds: 0,
    startupKillRate: 0.3,
    ops: { ...DEFAULT_OP_WEIGHTS },
    freshPaths: false,
    staleGc: false,
    plant: true,
    stopOnViolation: false,
    fuzz: false,
    fuzzOnly: false,
    fuzzPlugin: 5000,
    fuzzApi: 2000,
    fuzzAll: true,
    zone: false,
    plainPods: 2,
    holdSeconds: 15,
    cloudDelayMs: 500,
    verbose: false,
  };
}

/** The defaults of the zone mode: a run of about a minute or two. */
export function zoneDefaults(seed?: number): StressOptions {
  return { ...defaultOptions(seed), zone: true, kills: 12, clients: 2, pods: 3, plainPods: 2 };
}

/** The usage text. */
export const USAGE = `deno task stress [options]   (root)

A simulated node under concurrent clients (plugin processes and API calls) doing random
ADD / DEL / CHECK / CNI GC / GC / pod replacement / pod deletion without DEL, the agent
SIGKILLed at random moments (also during start-up and reconcile) and plugin processes
SIGKILLed mid-call; after every restart the state, the provider and the kernel are checked.

  --seed N            seed (default: random, printed)
  --kills N           agent SIGKILLs (default 100)
  --plugin-kills N    plugin SIGKILLs mid-call (default 40)
  --clients N         concurrent clients, half through the plugin, half the API (default 6)
  --pods N            pods (default 10)
  --enis N            ENIs of the mock cloud, fewer than pods so allocation contends (default 6)
  --minutes M         stop after M minutes even if the kills are not done (default: no limit)
  --grace-seconds N   the agent's gc.graceSeconds during the run (default 0)
  --startup-kill-rate P  probability of a kill during start-up after a restart (default 0.3)
  --ops a=N,b=N       operation weights (${
  Object.entries(DEFAULT_OP_WEIGHTS).map(([k, v]) => `${k}=${v}`).join(",")
})
  --fresh-paths       a new path for each new pod namespace (default: re-created at the same path)
  --stale-gc          send CNI GC beside ADDs and DELs with a list taken a while before (as a
                      runtime breaking the spec's rule would); --grace-seconds defaults to 2 then
  --no-plant          skip the planted violations the checker must catch
  --stop-on-violation stop at the first violation
  --fuzz              also run the full fuzz after the stress
  --fuzz-only         run only the fuzz
  --fuzz-plugin N     fuzzed plugin inputs (default 5000)
  --fuzz-api N        fuzzed API requests (default 2000)
  --fuzz-known-good   fuzz only the classes that pass today (default: every class)
  --out FILE          write the whole report as JSON
  --verbose           print every round

deno task stress --zone [options]   (root)

Two nodes of one zone on one simulated VPC, each agent on the BCE provider with its sticky
pods kept zone-wide, one fake BCE cloud whose attaches and detaches take a while: clients move
pods between the nodes (a sticky pod's DEL parks its ENI, its ADD on the other node claims it;
DELs retried until they succeed, failed ADDs DELeted and retried, as a runtime does), either
agent SIGKILLed, most often while the cloud shows an ENI attaching or detaching (mid-claim,
mid-park); after every restart both nodes and the cloud are checked, and at the end every pod
is deleted, GC runs, every hold expires and nothing may be left.

  --seed N            seed (default: random, printed)
  --kills N           agent SIGKILLs (default 12)
  --pods N            sticky pods (default 3)
  --plain-pods N      pods without stickiness (default 2)
  --clients N         concurrent moves (default 2)
  --hold-seconds N    the sticky hold of a parked ENI (default 15)
  --cloud-delay-ms N  how long an attach and a detach take in the cloud (default 500)
  --minutes M, --no-plant, --stop-on-violation, --out FILE, --verbose: as above
`;

/** Parses argv into options; throws a TypeError naming a bad flag. */
export function parseOptions(argv: string[]): StressOptions | "help" {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      seed: { type: "string" },
      kills: { type: "string" },
      "plugin-kills": { type: "string" },
      clients: { type: "string" },
      pods: { type: "string" },
      enis: { type: "string" },
      minutes: { type: "string" },
      "grace-seconds": { type: "string" },
      "startup-kill-rate": { type: "string" },
      ops: { type: "string" },
      "no-plant": { type: "boolean" },
      "fresh-paths": { type: "boolean" },
      "stale-gc": { type: "boolean" },
      "stop-on-violation": { type: "boolean" },
      fuzz: { type: "boolean" },
      "fuzz-only": { type: "boolean" },
      "fuzz-plugin": { type: "string" },
      "fuzz-api": { type: "string" },
      "fuzz-known-good": { type: "boolean" },
      out: { type: "string" },
      verbose: { type: "boolean" },
      zone: { type: "boolean" },
      "plain-pods": { type: "string" },
      "hold-seconds": { type: "string" },
      "cloud-delay-ms": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) return "help";
  const num = (name: string, v: string | undefined) => {
    if (v === undefined) return undefined;
    const n = Number(v);
    if (v.trim() === "" || !Number.isFinite(n)) {
      throw new TypeError(`--${name} "${v}" is not a number`);
    }
    return n;
  };
  const d = values.zone
    ? zoneDefaults(num("seed", values.seed))
    : defaultOptions(num("seed", values.seed));
  const ops = { ...d.ops };
  if (values.ops !== undefined) {
    for (const part of values.ops.split(",")) {
      const [k, v] = part.split("=");
      if (!(k in DEFAULT_OP_WEIGHTS)) throw new TypeError(`--ops: unknown operation "${k}"`);
      ops[k as OpName] = num(`ops ${k}`, v) ?? 0;
    }
  }
  const kills = num("kills", values.kills) ?? d.kills;
  const parsed = StressOptionsSchema.safeParse({
    ...d,
    kills,
    pluginKills: num("plugin-kills", values["plugin-kills"]) ??
      (values.kills !== undefined && !values.zone ? Math.ceil(kills / 3) : d.pluginKills),
    clients: num("clients", values.clients) ?? d.clients,
    pods: num("pods", values.pods) ?? d.pods,
    enis: num("enis", values.enis) ?? d.enis,
    minutes: num("minutes", values.minutes) ?? d.minutes,
    graceSeconds: num("grace-seconds", values["grace-seconds"]) ??
      (values["stale-gc"] ? 2 : d.graceSeconds),
    startupKillRate: num("startup-kill-rate", values["startup-kill-rate"]) ?? d.startupKillRate,
    ops,
    plant: !values["no-plant"],
    freshPaths: values["fresh-paths"] ?? false,
    staleGc: values["stale-gc"] ?? false,
    stopOnViolation: values["stop-on-violation"] ?? false,
    fuzz: values.fuzz ?? false,
    fuzzOnly: values["fuzz-only"] ?? false,
    fuzzPlugin: num("fuzz-plugin", values["fuzz-plugin"]) ?? d.fuzzPlugin,
    fuzzApi: num("fuzz-api", values["fuzz-api"]) ?? d.fuzzApi,
    fuzzAll: !values["fuzz-known-good"],
    out: values.out,
    verbose: values.verbose ?? false,
    zone: values.zone ?? false,
    plainPods: num("plain-pods", values["plain-pods"]) ?? d.plainPods,
    holdSeconds: num("hold-seconds", values["hold-seconds"]) ?? d.holdSeconds,
    cloudDelayMs: num("cloud-delay-ms", values["cloud-delay-ms"]) ?? d.cloudDelayMs,
  });
  if (!parsed.success) {
    throw new TypeError(
      parsed.error.issues.map((i) => `--${i.path.join(".")}: ${i.message}`).join("; "),
    );
  }
  return parsed.data;
}

/**
 * When a run must stop before its kills are done: `signal` aborted, or `minutes` gone
 * since the call (0: no time limit).
 */
export function runLimits(signal: AbortSignal | undefined, minutes: number): {
  aborted: () => boolean;
  /** Why the run must stop now, or null while it may go on. */
  stop: () => "signal" | "time" | null;
} {
  const deadline = minutes > 0 ? Date.now() + minutes * 60_000 : Infinity;
  const aborted = () => signal?.aborted ?? false;
  return {
    aborted,
    stop: () => (aborted() ? "signal" : Date.now() > deadline ? "time" : null),
  };
}
