/**
 * Plugin benchmarks: the in-process cost of one ADD (fake agent) and the cost
 * of one real plugin process answering VERSION (startup included).
 *
 * `deno bench -A --config tests/deno.json bench/plugin_bench.ts`
 */
import { nullLogger } from "../lib/log.ts";
import { runEnim } from "../tests/support/enim.ts";
import { FakeAgent } from "../tests/support/fake_agent.ts";
import { dispatchCall } from "../cni/dispatch.ts";

const agent = new FakeAgent();
const stdin = JSON.stringify({ cniVersion: "1.1.0", name: "enimnet", type: "enim" });
const env = {
  CNI_COMMAND: "ADD",
  CNI_CONTAINERID: "c0ffee01",
  CNI_NETNS: "/run/netns/pod1",
  CNI_IFNAME: "eth0",
  CNI_ARGS: "K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web-0",
};

Deno.bench("dispatchCall() ADD in process (fake agent)", async () => {
  await dispatchCall({ env, stdin, stdout: () => {}, agent, log: nullLogger });
});

Deno.bench("plugin process: VERSION (startup included)", { n: 20, warmup: 2 }, async () => {
  const res = await runEnim([], {
    env: { CNI_COMMAND: "VERSION", ENIM_LOG_FILE: "/nonexistent/enim/cni.log" },
    stdin: '{"cniVersion":"1.1.0"}',
  });
  if (res.code !== 0) throw new Error(res.stderr);
});
