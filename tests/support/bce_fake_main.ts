/**
 * The fake BCE server ({@linkcode FakeBce}: API and metadata service) as a
 * process of its own, for end-to-end tests.
 *
 * The agent runs inside the node's network namespace, so it reaches only that
 * namespace's loopback: the fake has to listen there too. The test starts this
 * file inside the node namespace (`ip netns exec <node> deno run …`) through
 * {@linkcode FakeBceProcess}; the process then
 *
 * - listens on 127.0.0.1 of the node namespace and prints
 *   `{"event":"listening","url":…,"metadataUrl":…}` as its first stdout line;
 * - on attach, plugs a veth device with the ENI's MAC into the node namespace
 *   ({@linkcode VethDeviceSimulator}, the simulated VPC's bridge on the other
 *   end); on detach, unplugs it;
 * - keeps the device of every ENI attached to the node present, as a host does
 *   with a physical NIC: a veth dies with the pod namespace it was moved into,
 *   where a real ENI would come back to the node, so a device that vanished
 *   while its ENI stays attached is plugged again;
 * - answers `state` on stdin with `{"event":"state","enis":[…],"requests":[…]}`
 *   (what a test asserts on: which ENIs exist, which calls were made);
 * - on `oob-delete <eniId>` / `oob-detach <eniId>`, deletes or detaches an ENI
 *   out of band (someone else did it, in the console), answering `{"event":"done"}`;
 *   on `oob-attach-new <instanceId>`, creates an ENI (not enim's) attached to that
 *   instance, answering `{"event":"done","eniId":…}`;
 *   on `instance-status <instanceId> <Status>`, reports that instance so from now
 *   on (`Stopped`: its node went down); on `delays <attachMs> <detachMs>`, makes
 *   attaches and detaches take that long (a kill can then land in the middle); on
 *   `device-delay <ms>`, makes each device plug and unplug that follows an attach or
 *   a detach start that late (a slow hot-plug on a busy host);
 * - an attach or detach changes the ENI's status first and its device after (as
 *   `onAttach`/`onDetach` run): `state` reports `devicesPending`, how many of those
 *   device changes are still to happen, so a test can wait until the kernel
 *   matches the cloud;
 * - with `otherNodes`, serves several nodes: each instance's ENIs plug into its
 *   own node namespace, and the other nodes' agents reach the API through
 *   `unixSocket` (a file, reachable from every namespace) and a loopback relay
 *   in their namespace (`loopback_relay.ts`);
 * - shuts down and exits when stdin closes.
 *
 * Settings come as one JSON argument ({@linkcode FakeBceProcessSettings});
 * credentials come in the environment (`ENIM_FAKE_BCE_CREDENTIALS`, JSON), never
 * on the command line. Nothing it prints holds a secret.
 *
 * @module
 */
import { z } from "zod";
import { FakeBce, type FakeEni, FakeEniSchema, toContractEni } from "./bce_fake.ts";
import { VethDeviceSimulator } from "../../netns/sim.ts";
import type { Credentials } from "../../providers/bce/signer.ts";
import { ROOT } from "../../scripts/_paths.ts";
import { awaitOrKill, spawnDenoInNetns } from "./command.ts";

/**
 * The provider timeouts of an agent on the fake BCE process: real-sized requests and
 * attaches, short backoffs, a 20 ms poll (tests add their pass intervals).
 */
export const FAKE_BCE_AGENT_TIMEOUTS = {
  requestMs: 5000,
  totalMs: 20_000,
  baseDelayMs: 50,
  maxDelayMs: 500,
  attachMs: 20_000,
  deviceMs: 20_000,
  pollMs: 20,
} as const;

/** What the process needs besides the credentials. */
export const FakeBceProcessSettingsSchema = z.object({
  /** The node namespace (a name under /run/netns), where devices appear. */
  nodeNetns: z.string(),
  /** The VPC namespace and the bridge there that the other veth ends join. */
  vpcNetns: z.string(),
  bridge: z.string(),
  /** The subnet ENIs are created in (`sbn-e2e0001`), its CIDRs and zone. */
  subnet: z.object({
    subnetId: z.string(),
    cidr: z.string(),
    ipv6Cidr: z.string().optional(),
    zoneName: z.string().optional(),
  }),
  /** More subnets of the VPC (other profiles'), each with its CIDRs. */
  otherSubnets: z.array(z.object({
    subnetId: z.string(),
    cidr: z.string(),
    ipv6Cidr: z.string().optional(),
    zoneName: z.string().optional(),
  })).optional(),
  /** The regular and enterprise security groups that exist (default: any well-formed id). */
  securityGroups: z.array(z.string()).optional(),
  enterpriseSecurityGroups: z.array(z.string()).optional(),
  vpcId: z.string().optional(),
  /** The node's instance (the metadata describes it) and its ENI quota. */
  instanceId: z.string(),
  eniQuota: z.number().int(),
  attachDelayMs: z.number().optional(),
  detachDelayMs: z.number().optional(),
  /** How often attached ENIs' devices are checked (default 200 ms). */
  devicePeriodMs: z.number().optional(),
  /** The zone of the node's instance (default: the subnet's). */
  zoneName: z.string().optional(),
  /**
   * More nodes of the VPC: each instance's attached ENIs plug into its own node
   * namespace (its agent reaches the fake through `unixSocket` and a loopback relay).
   */
  otherNodes: z.array(z.object({
    instanceId: z.string(),
    nodeNetns: z.string(),
    eniQuota: z.number().int(),
    zoneName: z.string().optional(),
  })).optional(),
  /** Also serve the API on this unix socket (a file: reachable from every namespace). */
  unixSocket: z.string().optional(),
  /** How the list's `name` filter matches (default exact). */
  nameFilter: z.enum(["exact", "prefix", "ignore"]).optional(),
});
/** What the process needs besides the credentials. */
export type FakeBceProcessSettings = z.infer<typeof FakeBceProcessSettingsSchema>;

const CredentialsListSchema = z.array(z.object({
  accessKeyId: z.string(),
  secretAccessKey: z.string(),
  sessionToken: z.string().optional(),
}));

/** One request as the `state` answer reports it (no headers: they carry the signature). */
export const FakeRequestSummarySchema = z.object({
  method: z.string(),
  path: z.string(),
  query: z.record(z.string(), z.string()),
  rawQuery: z.string(),
  body: z.unknown().optional(),
  at: z.number(),
  status: z.number(),
  code: z.string().optional(),
});
/** One request as the `state` answer reports it. */
export type FakeRequestSummary = z.infer<typeof FakeRequestSummarySchema>;

/** The `state` answer. */
export const FakeBceStateSchema = z.object({
  enis: z.array(FakeEniSchema),
  requests: z.array(FakeRequestSummarySchema),
  /** Device plugs and unplugs of attaches and detaches not done yet. */
  devicesPending: z.number().int(),
});
/** The `state` answer. */
export type FakeBceState = z.infer<typeof FakeBceStateSchema>;

const CREDENTIALS_ENV = "ENIM_FAKE_BCE_CREDENTIALS";

// ---- the process ------------------------------------------------------------------

async function main(): Promise<void> {
  const settings = FakeBceProcessSettingsSchema.parse(JSON.parse(Deno.args[0]));
  const credentials = CredentialsListSchema.parse(
    JSON.parse(Deno.env.get(CREDENTIALS_ENV) ?? "[]"),
  );
  const print = (event: Record<string, unknown>) => console.log(JSON.stringify(event));
  // One device simulator per node: an ENI's device appears in its instance's node.
  const nodes = [
    { instanceId: settings.instanceId, nodeNetns: settings.nodeNetns },
    ...settings.otherNodes ?? [],
  ];
  const sims = new Map(nodes.map((n) => [
    n.instanceId,
    new VethDeviceSimulator({
      vpcNetns: settings.vpcNetns,
      bridge: settings.bridge,
      nodeNetns: n.nodeNetns,
    }),
  ]));
  const sim = (instanceId: string) => sims.get(instanceId) ?? sims.get(settings.instanceId)!;
  // Device operations run one at a time, so a re-plug never races an unplug.
  let chain: Promise<void> = Promise.resolve();
  const serial = (what: string, fn: () => Promise<void>): Promise<void> => {
    chain = chain.then(fn).catch((e) => {
      print({ event: "device-error", what, error: String((e as Error)?.message ?? e) });
    });
    return chain;
  };
  const attachedToANode = (e: FakeEni) => sims.has(e.instanceId) && e.status === "inuse";
  let deviceDelayMs = 0;
  const deviceDelay = () =>
    deviceDelayMs > 0 ? new Promise((r) => setTimeout(r, deviceDelayMs)) : Promise.resolve();
  const fake: FakeBce = FakeBce.start({
    credentials,
    vpcId: settings.vpcId ?? "vpc-e2e0001",
    subnets: [settings.subnet, ...settings.otherSubnets ?? []],
    securityGroups: settings.securityGroups,
    enterpriseSecurityGroups: settings.enterpriseSecurityGroups,
    instances: Object.fromEntries([
      [settings.instanceId, { eniQuota: settings.eniQuota, zoneName: settings.zoneName }],
      ...(settings.otherNodes ?? []).map((n) => [n.instanceId, {
        eniQuota: n.eniQuota,
        zoneName: n.zoneName,
      }]),
    ]),
    ...(settings.unixSocket ? { unixSocket: settings.unixSocket } : {}),
    ...(settings.nameFilter ? { nameFilter: settings.nameFilter } : {}),
    ...(settings.subnet.zoneName ? { azone: settings.subnet.zoneName } : {}),
    metadataInstanceId: settings.instanceId,
    attachDelayMs: settings.attachDelayMs ?? 30,
    detachDelayMs: settings.detachDelayMs ?? 30,
    onAttach: (eni) =>
      serial(`plug ${eni.eniId}`, async () => {
        await deviceDelay();
        await sim(eni.instanceId).plug(toContractEni(fake.opts.subnets, eni));
        print({
          event: "plugged",
          eniId: eni.eniId,
          mac: eni.macAddress,
          instanceId: eni.instanceId,
        });
      }),
    onDetach: (eni) =>
      serial(`unplug ${eni.eniId}`, async () => {
        await deviceDelay();
        await sim(eni.instanceId).unplug(toContractEni(fake.opts.subnets, eni));
        print({ event: "unplugged", eniId: eni.eniId, mac: eni.macAddress });
      }),
  });
  print({ event: "listening", url: fake.url, metadataUrl: fake.metadataUrl });

  let stopping = false;
  const period = settings.devicePeriodMs ?? 200;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const keepDevices = () => {
    timer = setTimeout(() => {
      serial("keep devices", async () => {
        for (const eni of fake.enis.values()) {
          if (stopping || !attachedToANode(eni)) continue;
          await sim(eni.instanceId).plug(toContractEni(fake.opts.subnets, eni));
        }
      }).finally(() => {
        if (!stopping) keepDevices();
      });
    }, period);
  };
  keepDevices();

  // Commands on stdin, one a line; EOF ends the process.
  let buffer = "";
  for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    let nl: number;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const command = buffer.slice(0, nl).trim();
      buffer = buffer.slice(nl + 1);
      if (command === "state") {
        print({
          event: "state",
          enis: [...fake.enis.values()],
          requests: fake.requests.map(({ headers: _, ...r }) => r),
          devicesPending: fake.pendingHooks,
        });
      } else if (/^oob-(delete|detach) eni-[a-z0-9]+$/.test(command)) {
        const [verb, eniId] = command.split(" ");
        if (verb === "oob-delete") fake.deleteOutOfBand(eniId);
        else fake.detachOutOfBand(eniId);
        print({ event: "done", command });
      } else if (/^oob-attach-new i-[A-Za-z0-9]+$/.test(command)) {
        const eni = fake.attachNewOutOfBand("planted-foreign", command.split(" ")[1]);
        print({ event: "done", command, eniId: eni.eniId });
      } else if (/^instance-status i-[A-Za-z0-9]+ [A-Za-z]+$/.test(command)) {
        const [, instanceId, status] = command.split(" ");
        fake.setInstanceStatus(instanceId, status);
        print({ event: "done", command });
      } else if (/^delays \d+ \d+$/.test(command)) {
        const [, attach, detach] = command.split(" ");
        fake.opts.attachDelayMs = Number(attach);
        fake.opts.detachDelayMs = Number(detach);
        print({ event: "done", command });
      } else if (/^device-delay \d+$/.test(command)) {
        deviceDelayMs = Number(command.split(" ")[1]);
        print({ event: "done", command });
      } else if (command !== "") {
        print({ event: "error", error: `Unknown command "${command}"` });
      }
    }
  }
  stopping = true;
  clearTimeout(timer);
  await fake.close();
  await chain;
  print({ event: "closed" });
}

if (import.meta.main) await main();

// ---- the test side --------------------------------------------------------------------

/** Options of {@linkcode FakeBceProcess.start}. */
export interface FakeBceProcessOptions extends FakeBceProcessSettings {
  /** The credentials the fake accepts (passed in its environment). */
  credentials: Credentials[];
}

/** The fake BCE server running inside the node namespace, driven from the test process. */
export class FakeBceProcess implements AsyncDisposable {
  /** The API endpoint, as the node namespace sees it. */
  readonly url: string;
  readonly metadataUrl: string;
  readonly #child: Deno.ChildProcess;
  readonly #stdin: WritableStreamDefaultWriter<Uint8Array>;
  readonly #lines: string[];
  readonly #events: EventQueue;
  readonly #done: Promise<unknown>;
  #stderr = "";
  #closed = false;
  #pending: Promise<unknown> = Promise.resolve();

  private constructor(
    child: Deno.ChildProcess,
    url: string,
    metadataUrl: string,
    lines: string[],
    events: EventQueue,
    done: Promise<unknown>,
  ) {
    this.#child = child;
    this.url = url;
    this.metadataUrl = metadataUrl;
    this.#stdin = child.stdin.getWriter();
    this.#lines = lines;
    this.#events = events;
    this.#done = done;
  }

  /** Starts the fake inside `opts.nodeNetns` and waits until it listens. */
  static async start(opts: FakeBceProcessOptions): Promise<FakeBceProcess> {
    const { credentials, ...settings } = opts;
    const child = spawnDenoInNetns(
      settings.nodeNetns,
      `${ROOT}/tests/support/bce_fake_main.ts`,
      [JSON.stringify(settings)],
      { [CREDENTIALS_ENV]: JSON.stringify(credentials) },
    );
    const lines: string[] = [];
    const events = new EventQueue();
    const stdoutDone = (async () => {
      let buffer = "";
      for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
        buffer += chunk;
        let nl: number;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + 1);
          lines.push(line);
          try {
            events.push(JSON.parse(line));
          } catch { /* not an event: kept in the output only */ }
        }
      }
      events.end();
    })();
    let stderr = "";
    const stderrDone = (async () => {
      for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) stderr += chunk;
    })();
    const done = Promise.all([stdoutDone, stderrDone, child.status]);
    const ready = await events.next("listening");
    if (!ready) {
      await done.catch(() => {});
      throw new Error(`The fake BCE server did not start:\n${lines.join("\n")}\n${stderr}`);
    }
    const p = new FakeBceProcess(
      child,
      String(ready.url),
      String(ready.metadataUrl),
      lines,
      events,
      done,
    );
    stderrDone.then(() => p.#stderr = stderr);
    return p;
  }

  /** The process's PID. */
  get pid(): number {
    return this.#child.pid;
  }

  /** Every line the process has printed (stdout, then stderr once it ended). */
  output(): string[] {
    return [...this.#lines, ...this.#stderr.split("\n").filter((l) => l !== "")];
  }

  /** The fake's ENIs and the requests it has answered so far. */
  state(): Promise<FakeBceState> {
    const run = this.#pending.then(async () => {
      await this.#stdin.write(new TextEncoder().encode("state\n"));
      const ev = await this.#events.next("state");
      if (!ev) throw new Error(`The fake BCE server ended:\n${this.output().join("\n")}`);
      return FakeBceStateSchema.parse(ev);
    });
    this.#pending = run.catch(() => {});
    return run;
  }

  /** Deletes (or detaches) an ENI behind enim's back, as someone in the console would. */
  async outOfBand(verb: "delete" | "detach", eniId: string): Promise<void> {
    await this.#command(`oob-${verb} ${eniId}`);
  }

  /**
   * Creates an ENI behind enim's back, attached to `instanceId` (a stress plant: an
   * ENI attached to a node whose agent has no record of it); returns its id.
   */
  async attachNewOutOfBand(instanceId: string): Promise<string> {
    const ev = await this.#command(`oob-attach-new ${instanceId}`);
    return String(ev.eniId);
  }

  /** Sets an instance's status as BCE reports it (`Stopped`, `Running`, …). */
  async instanceStatus(instanceId: string, status: string): Promise<void> {
    await this.#command(`instance-status ${instanceId} ${status}`);
  }

  /**
   * Makes each device plug and unplug that follows an attach or a detach start `ms`
   * late from now on (the cloud's status has changed, the kernel not yet).
   */
  async deviceDelay(ms: number): Promise<void> {
    await this.#command(`device-delay ${ms}`);
  }

  /** Sets how long an attach and a detach take from now on. */
  async delays(attachMs: number, detachMs: number): Promise<void> {
    await this.#command(`delays ${attachMs} ${detachMs}`);
  }

  #command(line: string): Promise<Record<string, unknown>> {
    const run = this.#pending.then(async () => {
      await this.#stdin.write(new TextEncoder().encode(`${line}\n`));
      const ev = await this.#events.next("done");
      if (!ev) throw new Error(`The fake BCE server ended:\n${this.output().join("\n")}`);
      return ev;
    });
    this.#pending = run.catch(() => {});
    return run;
  }

  /** Closes its stdin (it shuts down and exits); kills it by PID if it does not. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#pending;
    await this.#stdin.close().catch(() => {});
    await awaitOrKill(this.#child, this.#done);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** Parsed stdout events, waited for by kind. */
class EventQueue {
  #events: Record<string, unknown>[] = [];
  #waiters: { kind: string; resolve: (e: Record<string, unknown> | null) => void }[] = [];
  #ended = false;

  push(e: Record<string, unknown>): void {
    const i = this.#waiters.findIndex((w) => w.kind === e.event);
    if (i >= 0) this.#waiters.splice(i, 1)[0].resolve(e);
    else this.#events.push(e);
  }

  end(): void {
    this.#ended = true;
    for (const w of this.#waiters.splice(0)) w.resolve(null);
  }

  /** The next event of `kind` (null once the process has ended). */
  next(kind: string): Promise<Record<string, unknown> | null> {
    const i = this.#events.findIndex((e) => e.event === kind);
    if (i >= 0) return Promise.resolve(this.#events.splice(i, 1)[0]);
    if (this.#ended) return Promise.resolve(null);
    return new Promise((resolve) => this.#waiters.push({ kind, resolve }));
  }
}
