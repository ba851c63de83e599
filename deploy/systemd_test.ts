/**
 * The systemd unit: `systemd-analyze verify` (strict: any warning about the unit fails) and
 * `systemd-analyze security --offline`, on the unit as `deno task install` stages it.
 *
 * systemd-analyze comes with Debian's `systemd` package (scripts/_deps.ts). When it is missing
 * the tests install it through apt if they run as root, and are skipped with a message
 * otherwise.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { join, ROOT } from "../scripts/_paths.ts";
import { install } from "../scripts/install.ts";
import { aptNeeds, ensureApt, isRoot } from "../scripts/_deps.ts";

const dec = new TextDecoder();
const UNIT = `${ROOT}/deploy/enim-agent.service`;

function isFile(p: string): boolean {
  try {
    return Deno.statSync(p).isFile;
  } catch {
    return false;
  }
}

const ANALYZE = "/usr/bin/systemd-analyze";
const found = isFile(ANALYZE);
const skip = !found && !isRoot();
if (skip) {
  console.error(
    "systemd_test: skipped: systemd-analyze is missing and installing Debian's systemd " +
      "package needs root (as root: apt-get install systemd)",
  );
}

async function sh(cmd: string, args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(cmd, {
    args,
    env: { NO_COLOR: "1", SYSTEMD_COLORS: "0", SYSTEMD_PAGER: "", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code: out.code, out: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

let ready: Promise<string> | undefined;
/**
 * The path of systemd-analyze, installing Debian's systemd package (scripts/_deps.ts) first
 * when this file runs alone: `deno task test` has installed it before the first test.
 */
function systemdAnalyze(): Promise<string> {
  ready ??= (async () => {
    const unmet = await ensureApt(aptNeeds("systemd"), (m) => console.error(`systemd_test: ${m}`));
    if (unmet.length > 0) throw new Error(`Cannot install ${unmet.join(", ")} through apt`);
    return ANALYZE;
  })();
  return ready;
}

/** Stages an install under a temp prefix; returns the unit with ExecStart pointing into it. */
async function stagedUnit(dir: string): Promise<string> {
  const prefix = join(dir, "root");
  await install({ prefix, launcher: true });
  const text = await Deno.readTextFile(join(prefix, "etc/systemd/system/enim-agent.service"));
  assert(text.includes("ExecStart=/opt/cni/bin/enim "));
  // verify checks that ExecStart's binary exists: point it at the staged copy.
  const unit = join(dir, "enim-agent.service");
  await Deno.writeTextFile(unit, text.replace("ExecStart=/opt/", `ExecStart=${prefix}/opt/`));
  return unit;
}

Deno.test({
  name: "the installed systemd unit passes systemd-analyze verify without a warning",
  ignore: skip,
}, async () => {
  const analyze = await systemdAnalyze();
  const dir = await Deno.makeTempDir({ prefix: "enim-systemd-" });
  try {
    const res = await sh(analyze, ["verify", "--man=no", await stagedUnit(dir)]);
    assertEquals(res.code, 0, res.out);
    assertEquals(res.out.split("\n").filter((l) => l.includes("enim-agent")), [], res.out);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "systemd-analyze verify would catch a missing ExecStart binary",
  ignore: skip,
}, async () => {
  const analyze = await systemdAnalyze();
  const dir = await Deno.makeTempDir({ prefix: "enim-systemd-" });
  try {
    const unit = join(dir, "enim-agent.service");
    await Deno.writeTextFile(unit, await Deno.readTextFile(UNIT)); // /opt/cni/bin/enim absent here
    if (isFile("/opt/cni/bin/enim")) return; // installed on this machine: nothing to show
    const res = await sh(analyze, ["verify", "--man=no", unit]);
    assert(res.code !== 0, res.out);
    assert(res.out.includes("/opt/cni/bin/enim"), res.out);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "the unit's sandbox rates as low exposure in systemd-analyze security",
  ignore: skip,
}, async () => {
  const analyze = await systemdAnalyze();
  const dir = await Deno.makeTempDir({ prefix: "enim-systemd-" });
  try {
    const res = await sh(analyze, ["security", "--offline=yes", await stagedUnit(dir)]);
    const level = Number(res.out.match(/Overall exposure level for [^:]+: ([\d.]+)/)?.[1]);
    assert(level > 0 && level <= 4.0, `exposure ${level}:\n${res.out}`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** The unit's `Key=value` lines as a map of key → values (a key may repeat). */
function unitSettings(text: string): Map<string, string[]> {
  const map = new Map<string, string[]>();
  for (const line of text.split("\n")) {
    const m = line.match(/^([A-Za-z]+)=(.*)$/);
    if (m) map.set(m[1], [...(map.get(m[1]) ?? []), m[2]]);
  }
  return map;
}

Deno.test("the unit grants what the agent needs and nothing V8 cannot live with", async () => {
  const s = unitSettings(await Deno.readTextFile(UNIT));
  const one = (k: string) => s.get(k)?.join(" ");
  assertEquals(one("ExecStart"), "/opt/cni/bin/enim agent --config /etc/enim/agent.jsonc");
  assertEquals(one("Type"), "simple");
  // The environment the tests and the bench run the agent with (tests/support/agent_proc.ts).
  assertEquals(one("Environment"), "MALLOC_ARENA_MAX=2");
  assertEquals(one("Restart"), "on-failure");
  assertEquals(
    one("CapabilityBoundingSet")?.split(" ").sort(),
    ["CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE"],
  );
  assertEquals(one("StateDirectory"), "enim");
  assertEquals(one("RuntimeDirectory"), "enim");
  assertEquals(one("RuntimeDirectoryMode"), "0700");
  assertEquals(one("LogsDirectory"), "enim");
  assertEquals(one("ProtectSystem"), "strict");
  assertEquals(one("NoNewPrivileges"), "yes");
  assertEquals(one("RestrictAddressFamilies"), "AF_UNIX AF_NETLINK AF_INET AF_INET6");
  assertEquals(one("RestrictNamespaces")?.split(" ").sort(), ["mnt", "net"]);
  assertEquals(one("SystemCallArchitectures"), "native");
  assertEquals(one("LockPersonality"), "yes");
  // V8's JIT maps memory writable and executable.
  assertEquals(s.has("MemoryDenyWriteExecute"), false);
  // The unix socket, netlink and namespaces must stay reachable.
  assertEquals(s.has("PrivateNetwork"), false);
  assertEquals(s.has("PrivateUsers"), false);
});
