/**
 * `ip` failing, or pausing, at one chosen step of the agent's work: the fault
 * matrix's injection point (issue 17).
 *
 * Inside a node's sandbox (its private mount namespace) `/usr/sbin/ip` is
 * bind-mounted over by a small shell script that runs the real `ip` (a copy in
 * the sandbox's directory) unless a one-shot rule matches the call. A rule
 * names where the call runs (`pod`: any namespace but the node's; `node`; or
 * `any`), how many calls it hits, and an extended regex matched against the arguments and, for
 * `ip -batch FILE` or `ip -batch -` (read whole first), the batch's lines. Its action is `fail` (exit 2 with an
 * RTNETLINK-like message, as a real failure prints) or `pause` (signal the test
 * and wait until it says go: the test then deletes or replaces the pod's
 * namespace at exactly that step), or `hang` (never answer, ignoring SIGTERM: the
 * agent's command deadline must kill it by its PID; {@linkcode IpFaults.hungPid}
 * names it). Nothing outside the sandbox sees the wrapper.
 *
 * `tc` gets the same wrapper with `IpFaults.install(node, "/usr/sbin/tc")` (its
 * batches are `tc -batch FILE` too).
 *
 * @module
 */
import { exists } from "../../lib/fs.ts";
import type { SimulatedNode } from "./node.ts";

const IP = "/usr/sbin/ip";

const SCRIPT = (dir: string, real: string) =>
  `#!/bin/sh
# enim test: ip with an injected fault (tests/support/ip_faults.ts)
D='${dir}'
# A batch on stdin (\`ip -batch -\`, fed after the process starts): read it whole
# first, so a rule sees its lines as it sees a batch file's, then run from that file.
in=""
prev=""
for a in "$@"; do
  [ "$prev" = "-batch" ] && [ "$a" = "-" ] && in="$D/stdin.$$"
  prev="$a"
done
if [ -n "$in" ]; then
  cat > "$in"
  n=$#
  prev=""
  for a in "$@"; do
    if [ "$prev" = "-batch" ] && [ "$a" = "-" ]; then set -- "$@" "$in"; else set -- "$@" "$a"; fi
    prev="$a"
  done
  shift "$n"
fi
if [ -f "$D/rule" ]; then
  text="$*"
  prev=""
  for a in "$@"; do
    if [ "$prev" = "-batch" ] && [ -f "$a" ]; then text="$text
$(cat "$a")"; fi
    prev="$a"
  done
  read -r action where count regex < "$D/rule"
  me=$(readlink /proc/self/ns/net)
  node=$(cat "$D/node-ns")
  here=pod
  [ "$me" = "$node" ] && here=node
  if { [ "$where" = any ] || [ "$where" = "$here" ]; } && printf '%s\\n' "$text" | grep -Eq -- "$regex"; then
    if [ "$count" -gt 1 ]; then
      printf '%s %s %s %s\n' "$action" "$where" "$((count - 1))" "$regex" > "$D/rule.next" &&
        mv "$D/rule.next" "$D/rule" && : > "$D/fired" && fired=1
    elif mv "$D/rule" "$D/fired" 2>/dev/null; then
      fired=1
    fi
    if [ "$fired" = 1 ]; then
      if [ "$action" = fail ]; then
        echo "RTNETLINK answers: Input/output error (injected by the test)" >&2
        exit 2
      fi
      if [ "$action" = hang ]; then
        # Never answers, and ignores SIGTERM (kept across the exec): only SIGKILL ends it.
        echo $$ > "$D/hung"
        : > "$D/hit"
        trap '' TERM
        exec sleep 3600
      fi
      : > "$D/hit"
      i=0
      while [ ! -f "$D/go" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
      rm -f "$D/go"
    fi
  fi
fi
if [ -n "$in" ]; then
  '${real}' "$@"
  rc=$?
  rm -f "$in"
  exit "$rc"
fi
exec '${real}' "$@"
`;

/** Where an injected fault applies. */
export type Where = "pod" | "node" | "any";

/** The `ip` wrapper of one node's sandbox. */
export class IpFaults {
  readonly #node: SimulatedNode;
  /** The control directory, as the test process sees it. */
  readonly #dir: string;
  /** The program wrapped. */
  readonly #bin: string;

  private constructor(node: SimulatedNode, dir: string, bin: string) {
    this.#node = node;
    this.#dir = dir;
    this.#bin = bin;
  }

  /**
   * Installs the wrapper over `bin` (default `ip`; `tc` works the same) in `node`'s
   * sandbox (before its agent starts, or at any time).
   */
  static async install(node: SimulatedNode, bin = IP): Promise<IpFaults> {
    const base = node.sandbox.base;
    const name = bin.split("/").at(-1)!;
    const dir = `${base}/${name}fault`;
    await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
    await Deno.copyFile(bin, `${base}/${name}.real`);
    await Deno.chmod(`${base}/${name}.real`, 0o755);
    await Deno.writeTextFile(`${base}/${name}.wrapper`, SCRIPT(dir, `${base}/${name}.real`), {
      mode: 0o755,
    });
    await sandboxRun(node, ["/usr/bin/mount", "--bind", `${base}/${name}.wrapper`, bin]);
    const ns = await sandboxRun(node, ["/usr/bin/readlink", "/proc/self/ns/net"]);
    await Deno.writeTextFile(`${dir}/node-ns`, ns.trim());
    return new IpFaults(node, dir, bin);
  }

  /** The next `times` `ip` calls in `where` matching `regex` fail. */
  async fail(where: Where, regex: string, times = 1): Promise<void> {
    await this.#arm("fail", where, regex, times);
  }

  /** The next `ip` call in `where` matching `regex` waits for {@linkcode go}; {@linkcode hit} tells when. */
  async pause(where: Where, regex: string): Promise<void> {
    await this.#arm("pause", where, regex, 1);
  }

  /**
   * The next `ip` call in `where` matching `regex` never answers (until SIGKILL);
   * {@linkcode hit} tells when it started, {@linkcode hungPid} names its process.
   */
  async hang(where: Where, regex: string): Promise<void> {
    await this.#arm("hang", where, regex, 1);
  }

  /** The PID of the call {@linkcode hang} made hang (null before it did). */
  async hungPid(): Promise<number | null> {
    const text = await Deno.readTextFile(`${this.#dir}/hung`).catch(() => "");
    return /^\d+\s*$/.test(text) ? Number(text) : null;
  }

  async #arm(action: string, where: Where, regex: string, times: number): Promise<void> {
    if (/\s/.test(regex)) throw new TypeError("Use \\s, not spaces, in a fault regex");
    for (const f of ["fired", "hit", "go", "hung"]) {
      await Deno.remove(`${this.#dir}/${f}`).catch(() => {});
    }
    await Deno.writeTextFile(`${this.#dir}/rule`, `${action} ${where} ${times} ${regex}\n`);
  }

  /** Whether the armed rule has fired. */
  async fired(): Promise<boolean> {
    return await exists(`${this.#dir}/fired`);
  }

  /** Waits until a paused call is waiting (up to `ms`). */
  async hit(ms = 15_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!(await exists(`${this.#dir}/hit`))) {
      if (Date.now() > deadline) throw new Error("The paused ip call never came");
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /** Lets the paused call go on. */
  async go(): Promise<void> {
    await Deno.writeTextFile(`${this.#dir}/go`, "");
  }

  /** Disarms any rule. */
  async clear(): Promise<void> {
    await Deno.remove(`${this.#dir}/rule`).catch(() => {});
  }

  /** Removes the wrapper (the sandbox's own teardown would drop it too). */
  async uninstall(): Promise<void> {
    await this.clear();
    await sandboxRun(this.#node, ["/usr/bin/umount", this.#bin]).catch(() => {});
  }
}

async function sandboxRun(node: SimulatedNode, argv: string[]): Promise<string> {
  const [cmd, ...args] = node.sandbox.wrap(argv);
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(
      `${argv.join(" ")} in the sandbox failed: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  return new TextDecoder().decode(out.stdout);
}
