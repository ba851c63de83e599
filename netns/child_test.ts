/**
 * Every child of `./child.ts` has a deadline (issue 33 item 3): one that never answers
 * is killed by its PID (SIGTERM, then SIGKILL) and the call fails naming the command
 * and the deadline, instead of holding its caller forever. The children here are
 * small shell scripts that write their PID to a file, so each test can show the
 * process is gone, and (should the deadline not work) end it itself, by that PID.
 */
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import {
  commandLabel,
  commandTimeout,
  CommandTimeoutError,
  DEFAULT_COMMAND_TIMEOUT_MS,
  exec,
  setCommandTimeout,
  startFed,
} from "./child.ts";

const SH = "/bin/sh";
/** How long a test waits for the deadline to act before it calls it missing. */
const GUARD_MS = 8_000;

/** Whether a process with this PID exists (a reaped child no longer does). */
function alive(pid: number): boolean {
  try {
    Deno.statSync(`/proc/${pid}`);
    return true;
  } catch {
    return false;
  }
}

/** Reads the PID a test script wrote (waiting for it to appear). */
async function pidIn(file: string): Promise<number> {
  for (let i = 0; i < 200; i++) {
    const text = await Deno.readTextFile(file).catch(() => "");
    if (/^\d+\s*$/.test(text)) return Number(text);
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`No PID in "${file}"`);
}

/**
 * What `p` settled with, or a failure when it has not settled within {@linkcode GUARD_MS}
 * (no deadline): then the test's own process is ended by the PID in `pidFile` first.
 */
async function guarded<T>(p: Promise<T>, pidFile: string): Promise<unknown> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const guard = new Promise<"late">((r) => (timer = setTimeout(() => r("late"), GUARD_MS)));
  const settled = p.then((v) => ({ value: v }), (err) => ({ error: err as unknown }));
  const first = await Promise.race([settled, guard]);
  clearTimeout(timer);
  if (first !== "late") {
    if ("error" in first) return first.error;
    throw new Error(`Expected a failure, got ${JSON.stringify(first.value)}`);
  }
  try {
    Deno.kill(await pidIn(pidFile), "SIGKILL");
  } catch { /* gone meanwhile */ }
  await settled;
  throw new Error(`The child was still running after ${GUARD_MS} ms: it has no deadline`);
}

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "enim-deadline-" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("exec() returns a child's code and output when it answers within its deadline", async () => {
  const out = await exec([SH, "-c", "echo out; echo err >&2; exit 3"], { timeoutMs: 5_000 });
  assertEquals(out, { code: 3, stdout: "out\n", stderr: "err\n" });
});

Deno.test(
  "exec() kills a child that misses its deadline by its PID, SIGTERM then SIGKILL, and names the command and the deadline",
  () =>
    withDir(async (dir) => {
      const pidFile = `${dir}/pid`;
      // Ignores SIGTERM (inherited across the exec): only the SIGKILL ends it.
      const script = `echo $$ > ${pidFile}; trap '' TERM; exec sleep 1000`;
      const started = performance.now();
      const err = await guarded(
        exec([SH, "-c", script], { timeoutMs: 300, graceMs: 200 }),
        pidFile,
      );
      const took = performance.now() - started;
      assert(err instanceof CommandTimeoutError, String(err));
      assertEquals(err.outcome, "killed");
      assertEquals(err.timeoutMs, 300);
      assertEquals(err.code, 128 + 9, "it died of SIGKILL");
      assertMatch(
        err.message,
        /^Cannot run "sh -c echo \$\$ > .*": no answer within 0\.3 s; killed$/,
      );
      assert(!alive(await pidIn(pidFile)), "the process is gone");
      // Not a timing assertion of performance: the deadline and the grace were waited for.
      assert(took >= 300 + 200, `it was given its deadline and the grace (${took} ms)`);
    }),
);

Deno.test("a child that honours SIGTERM is not sent SIGKILL", () =>
  withDir(async (dir) => {
    const pidFile = `${dir}/pid`;
    const err = await guarded(
      exec([SH, "-c", `echo $$ > ${pidFile}; exec sleep 1000`], { timeoutMs: 200, graceMs: 5_000 }),
      pidFile,
    );
    assert(err instanceof CommandTimeoutError, String(err));
    assertEquals(err.code, 128 + 15, "it died of SIGTERM");
    assert(!alive(await pidIn(pidFile)), "the process is gone");
  }));

Deno.test(
  "a fed process that never exits after its input is killed at its deadline, counted from the feed",
  () =>
    withDir(async (dir) => {
      const pidFile = `${dir}/pid`;
      const proc = startFed(
        [SH, "-c", `echo $$ > ${pidFile}; cat > ${dir}/got; exec sleep 1000`],
        { timeoutMs: 300, graceMs: 200 },
      );
      const pid = await pidIn(pidFile);
      // Longer than its deadline before the feed: still waiting for its input, untouched.
      await new Promise((r) => setTimeout(r, 500));
      assert(alive(pid), "a process not fed yet is not killed");
      const err = await guarded(proc.feed("link show\n"), pidFile);
      assert(err instanceof CommandTimeoutError, String(err));
      assertEquals(err.outcome, "killed");
      assertMatch(err.message, /no answer within 0\.3 s; killed$/);
      assertEquals(await Deno.readTextFile(`${dir}/got`), "link show\n", "it got its input");
      assert(!alive(pid), "the process is gone");
      // A second feed returns the first one's outcome.
      assertEquals(await proc.feed("again").catch((e) => e), err);
    }),
);

Deno.test(
  "a child that exits but leaves its output held open by a process it started fails at its deadline instead of hanging",
  () =>
    withDir(async (dir) => {
      const pidFile = `${dir}/pid`;
      // The background sleep keeps the script's stdout: its reader would wait for it.
      const script = `sleep 1000 & echo $! > ${pidFile}; exit 0`;
      try {
        const err = await guarded(exec([SH, "-c", script], { timeoutMs: 300 }), pidFile);
        assert(err instanceof CommandTimeoutError, String(err));
        assertEquals(err.outcome, "output_open");
        assertMatch(err.message, /no answer within 0\.3 s; it exited, but a process it started/);
      } finally {
        // The test's own leftover, by its PID.
        try {
          Deno.kill(await pidIn(pidFile), "SIGKILL");
        } catch { /* gone */ }
      }
    }),
);

Deno.test("setCommandTimeout() sets every later child's deadline and refuses a bad one", () =>
  withDir(async (dir) => {
    assertEquals(commandTimeout(), DEFAULT_COMMAND_TIMEOUT_MS);
    const pidFile = `${dir}/pid`;
    setCommandTimeout(250);
    try {
      const err = await guarded(
        exec([SH, "-c", `echo $$ > ${pidFile}; exec sleep 1000`]),
        pidFile,
      );
      assert(err instanceof CommandTimeoutError, String(err));
      assertEquals(err.timeoutMs, 250);
    } finally {
      setCommandTimeout(DEFAULT_COMMAND_TIMEOUT_MS);
    }
    for (const bad of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
      let thrown: unknown;
      try {
        setCommandTimeout(bad);
      } catch (e) {
        thrown = e;
      }
      assert(thrown instanceof RangeError, `refuses ${bad}`);
    }
    assertEquals(commandTimeout(), DEFAULT_COMMAND_TIMEOUT_MS);
  }));

Deno.test("commandLabel() names the known binaries and clips a script", () => {
  assertEquals(commandLabel(["/usr/sbin/ip", "-batch", "-"]), "ip -batch -");
  assertEquals(
    commandLabel(["/usr/bin/nsenter", "--net=/proc/7/fd/20", "/usr/sbin/ip", "-j", "link"]),
    "nsenter --net=/proc/7/fd/20 ip -j link",
  );
  const label = commandLabel(["/bin/sh", "-c", "a=1\nb=2\n".repeat(40), "x"]);
  assert(label.startsWith("sh -c a=1 b=2"), label);
  assert(label.length < 120, label);
  assert(!label.includes("\n"), label);
});
