/**
 * Shared test set-up for the BCE provider: a fake BCE server, an in-memory
 * database, and a logger whose lines are all collected (to prove that no
 * secret is ever logged).
 *
 * @module
 */
import { DatabaseSync } from "node:sqlite";
import { Logger } from "../../lib/log.ts";
import { FakeBce, type FakeBceOptions, type FakeEni } from "./bce_fake.ts";
import { BceClient, type BceClientOptions, type RetryOptions } from "../../providers/bce/client.ts";
import type { Owner } from "../../providers/contract.ts";
import { configSchema } from "../../providers/bce/config.ts";
import { createBce } from "../../providers/bce/mod.ts";
import type { BceProvider } from "../../providers/bce/provider.ts";

/** Test credentials; the secret and the token must never appear in a log line or error. */
export const AK = "AKIDenimTest0001";
/** The test secret key. */
export const SECRET = "SK-secret-DO-NOT-LOG-7f3c2a100d4e";
/** The test session token. */
export const SESSION_TOKEN = "ST-token-DO-NOT-LOG+Example/Session==";
/** The instance the fake metadata describes. */
export const INSTANCE = "i-fake0001";

/** Every log line written by loggers from {@linkcode testLogger}, and every error message seen. */
export const LOG_LINES: string[] = [];

/** A logger collecting its lines into {@linkcode LOG_LINES}. */
export function testLogger(): Logger {
  return new Logger((line) => LOG_LINES.push(line), "debug");
}

/** Records an error's message and cause chain as if it were logged. */
export function recordError(e: unknown): void {
  let cur: unknown = e;
  for (let i = 0; cur && i < 5; i++) {
    LOG_LINES.push(String((cur as Error).message ?? cur));
    cur = (cur as Error).cause;
  }
}

/** Fast retries for tests. */
export const FAST_RETRY: RetryOptions = {
  maxAttempts: 5,
  baseDelayMs: 5,
  maxDelayMs: 40,
  totalTimeoutMs: 10_000,
  requestTimeoutMs: 2_000,
};

/**
 * The fake's cloud-like behaviours, on in the provider's tests (docs/testing.md, "The
 * fake BCE cloud", gives the source of each): a new ENI refuses an attach for a while,
 * an attaching ENI shows no instanceId, clientTokens are remembered globally and forever.
 */
export const CLOUD_LIKE: Partial<FakeBceOptions> = {
  youngEniRefusesAttachMs: 30,
  instanceIdWhileAttaching: "empty",
  tokenScope: "global",
};

/** Starts a fake that accepts the test credentials (with the session token), cloud-like. */
export function startFake(opts: Partial<FakeBceOptions> = {}): FakeBce {
  return FakeBce.start({
    credentials: [{ accessKeyId: AK, secretAccessKey: SECRET, sessionToken: SESSION_TOKEN }],
    instances: { [INSTANCE]: { eniQuota: 16 } },
    attachDelayMs: 15,
    detachDelayMs: 15,
    maxKeysCap: 3,
    ...CLOUD_LIKE,
    ...opts,
  });
}

/** A client against a fake with the test credentials. */
export function testClient(fake: FakeBce, retry: Partial<RetryOptions> = {}): BceClient {
  return clientWith(fake.url, { retry: { ...FAST_RETRY, ...retry } });
}

/**
 * A client on `endpoint` with the test credentials (session token included) and a
 * {@linkcode testLogger}, unless `opts` says otherwise; retries are the client's
 * defaults unless `opts.retry` sets them.
 */
export function clientWith(
  endpoint: string,
  opts: Partial<Omit<BceClientOptions, "endpoint">> = {},
): BceClient {
  return new BceClient({
    endpoint,
    credentials: { accessKeyId: AK, secretAccessKey: SECRET, sessionToken: SESSION_TOKEN },
    log: testLogger(),
    ...opts,
  });
}

/** The owner of test pod `i`: container `c<i>`, interface eth0, pod `default/p-<i>` by default. */
export const owner = (i: number, pod = `default/p-${i}`): Owner => ({
  pod,
  containerId: `c${i}`,
  ifName: "eth0",
});

/** An allocation request that asks for no particular address or range. */
export const ANY_ADDRESS = { ips: [], ranges: [] };

/** What {@linkcode setup} returns. */
export interface TestEnv {
  fake: FakeBce;
  db: DatabaseSync;
  provider: BceProvider;
  /** MACs whose device "appeared" (the fake's onAttach hook). */
  devices: Set<string>;
  /** Zone-wide sticky events the providers counted, as `<event>:<profile>`. */
  events: string[];
  /** A second provider on the same database (a restart). */
  restart(config?: Record<string, unknown>): Promise<BceProvider>;
  close(): Promise<void>;
}

/** Options of {@linkcode setup}. */
export interface SetupOptions {
  maxEnisPerNode?: number;
  warmPool?: { minIdle: number; maxIdle: number };
  fake?: Partial<FakeBceOptions>;
  timeouts?: Record<string, number>;
  config?: Record<string, unknown>;
  /** Reuse a running fake instead of starting one. */
  withFake?: FakeBce;
  /** The agent's database (default: a fresh in-memory one); closed by `close()`. */
  db?: DatabaseSync;
}

/** The provider timeouts the harness runs with: fast, so failures and retries take milliseconds. */
export const HARNESS_TIMEOUTS = {
  requestMs: 2000,
  totalMs: 10_000,
  maxAttempts: 5,
  baseDelayMs: 5,
  maxDelayMs: 40,
  attachMs: 5000,
  detachMs: 2000,
  escalateMs: 300,
  createVisibilityMs: 2000,
  deviceMs: 2000,
  pollMs: 5,
  poolIntervalMs: 50,
  idleIntervalMs: 400,
  orphanScanIntervalMs: 60_000,
  quarantineRetryMs: 60_000,
  minPassGapMs: 10,
  jitter: 0.2,
};

/** Starts a fake BCE and a provider wired to it (metadata included). */
export async function setup(opts: SetupOptions = {}): Promise<TestEnv> {
  const devices = new Set<string>();
  // This node's instance: a device "appears" for the ENIs attached to it only, so
  // several providers (nodes) can share one fake.
  const node = String(opts.config?.instanceId ?? INSTANCE);
  const onAttach = (eni: FakeEni) => {
    if (eni.instanceId === node) devices.add(eni.macAddress);
  };
  const onDetach = (eni: FakeEni) => {
    if (eni.instanceId === node) devices.delete(eni.macAddress);
  };
  const fake = opts.withFake ?? startFake({ onAttach, onDetach, ...opts.fake });
  if (opts.withFake) {
    // Chained: the providers already on this fake keep their devices.
    const [prevAttach, prevDetach] = [fake.opts.onAttach, fake.opts.onDetach];
    fake.opts.onAttach = async (eni) => {
      await prevAttach?.(eni);
      onAttach(eni);
    };
    fake.opts.onDetach = async (eni) => {
      await prevDetach?.(eni);
      onDetach(eni);
    };
  }
  const db = opts.db ?? new DatabaseSync(":memory:");
  const events: string[] = [];
  const providers: BceProvider[] = [];
  const env = (n: string) =>
    ({
      ENIM_BCE_ACCESS_KEY_ID: AK,
      ENIM_BCE_SECRET_ACCESS_KEY: SECRET,
      ENIM_BCE_SESSION_TOKEN: SESSION_TOKEN,
    })[n];
  const make = async (extra: Record<string, unknown> = {}) => {
    const config = configSchema.parse({
      endpoint: fake.url,
      metadataUrl: fake.metadataUrl,
      maxEnisPerNode: opts.maxEnisPerNode,
      warmPool: opts.warmPool ?? { minIdle: 0, maxIdle: 100 },
      securityGroupIds: ["g-test0001"],
      timeouts: { ...HARNESS_TIMEOUTS, ...opts.timeouts },
      ...opts.config,
      ...extra,
    });
    const p = await createBce(config, {
      db,
      log: testLogger(),
      stickyEvent: (event, profile) => events.push(`${event}:${profile}`),
      waitForDevice: async (mac, timeoutMs) => {
        const deadline = Date.now() + timeoutMs;
        while (!devices.has(mac)) {
          if (Date.now() > deadline) throw new Error(`Device "${mac}" did not appear`);
          await new Promise((r) => setTimeout(r, 5));
        }
      },
    }, { env });
    providers.push(p);
    return p;
  };
  const provider = await make();
  return {
    fake,
    db,
    provider,
    devices,
    events,
    restart: make,
    async close() {
      for (const p of providers) await p.close();
      if (!opts.withFake) await fake.close();
      db.close();
    },
  };
}

/** Asserts that no collected line contains the secret key or the session token. */
export function assertNoSecretsLogged(): void {
  for (const line of LOG_LINES) {
    if (line.includes(SECRET) || line.includes(SESSION_TOKEN) || line.includes("bce-auth-v1/")) {
      throw new Error(
        `A secret leaked into a log line: ${
          line.replaceAll(SECRET, "<SECRET>").replaceAll(SESSION_TOKEN, "<TOKEN>")
        }`,
      );
    }
  }
}
