import { assert, assertEquals } from "../../lib/assert.ts";
import { BceApiError, type BceOp, classifyError, codeForEmptyBody } from "./errors.ts";
import {
  clientWith,
  INSTANCE,
  LOG_LINES,
  startFake,
  testClient,
  testLogger,
} from "../../tests/support/bce_harness.ts";

type Row = [status: number, code: string, message: string, op: BceOp, want: {
  reason: string;
  missing?: string | null;
  retryable?: boolean;
  throttled?: boolean;
}];

Deno.test("classifyError() classes each real BCE code as its source says", async (t) => {
  const rows: Row[] = [
    // Throttling, retried with backoff.
    [429, "", "", "ListEni", { reason: "throttled", retryable: true, throttled: true }],
    [429, "TooManyRequests", "", "CreateEni", { reason: "throttled", throttled: true }],
    [400, "Throttling.RateLimitExceeded", "", "AttachEni", { reason: "throttled" }],
    [400, "BadRequest", "Request RateLimit exceeded", "ListEni", { reason: "throttled" }],
    [429, "RATE_LIMIT_TOTAL_QPS", "Total API QPS limit exceeded", "ListEni", {
      reason: "throttled",
    }],
    [400, "RequestLimitExceeded", "", "GetEniDetail", { reason: "throttled", retryable: true }],
    [503, "QpsLimitExceeded", "", "GetEniDetail", { reason: "throttled" }],
    [400, "Throttling", "", "DeleteEni", { reason: "throttled" }],
    // Quotas: never retried (waiting does not raise a quota).
    [400, "QuotaLimitExceeded", "", "AttachEni", { reason: "quota_exceeded", retryable: false }],
    [400, "EniQuotaLimitExceeded", "", "AttachEni", { reason: "quota_exceeded" }],
    [400, "ExceedLimitException", "", "CreateEni", { reason: "quota_exceeded" }],
    [400, "VmMemoryCanNotAttachMoreIpException", "", "CreateEni", { reason: "quota_exceeded" }],
    [400, "SubnetHasNoMoreIpException", "", "CreateEni", { reason: "subnet_full" }],
    [400, "PrivateIpInUseException", "", "CreateEni", { reason: "requested_ip_unavailable" }],
    // Not found: what is missing depends on the code and on what the call addressed.
    [404, "EniNotFoundException", "eni:eni-x resource not exist", "GetEniDetail", {
      reason: "not_found",
      missing: "eni",
    }],
    [400, "EniIdException", "The param eniId is invalid", "DeleteEni", {
      missing: "eni",
      reason: "not_found",
    }],
    [404, "NoSuchObject", "", "GetEniDetail", { reason: "not_found", missing: "eni" }],
    [404, "NoSuchObject", "", "DeleteEni", { reason: "not_found", missing: "eni" }],
    [404, "NoSuchObject", "instanceId i-x does not exist", "AttachEni", {
      reason: "not_found",
      missing: "ambiguous",
    }],
    [404, "NoSuchObject", "", "GetInstance", { reason: "not_found", missing: "instance" }],
    [400, "NoSuchObject", "", "GetSubnet", { reason: "not_found", missing: "subnet" }],
    // The instance gone, in the codes Baidu's Terraform provider reads as not found
    // (baiducloud/error.go), 403 included.
    [404, "InstanceNotExist", "", "GetInstance", { reason: "not_found", missing: "instance" }],
    [404, "InstanceNotFound", "", "GetInstance", { reason: "not_found", missing: "instance" }],
    [400, "InvalidInstanceId.NotFound", "", "DetachEni", {
      reason: "not_found",
      missing: "instance",
    }],
    [403, "Forbidden.InstanceNotFound", "", "GetInstance", {
      reason: "not_found",
      missing: "instance",
    }],
    // BCE's wrong state (cce-network-v2/pkg/bce/vpceni/node_bcc.go, branch v2.11).
    [400, "EniStatusException", "The eni status is not allowed to operate", "AttachEni", {
      reason: "wrong_state",
      retryable: false,
    }],
    // A 404 that says nothing is gone.
    [404, "InvalidVersion", "", "DeleteEni", { reason: "other", missing: null }],
    [400, "InvalidURI", "", "GetEniDetail", { reason: "other", missing: null }],
    [404, "InvalidURI", "", "DeleteEni", { reason: "other", missing: null }],
    [404, "NotFound", "", "DeleteEni", { reason: "other", missing: null }],
    // Auth: a fresh signature cures an expired one.
    [403, "AccessDenied", "", "ListEni", { reason: "auth_failed", retryable: false }],
    [403, "SignatureDoesNotMatch", "", "ListEni", { reason: "auth_failed", retryable: false }],
    // Resent once by the client with its clock corrected, never retried as such.
    [400, "RequestExpired", "", "ListEni", { reason: "auth_failed", retryable: false }],
    [403, "RequestTimeTooSkewed", "", "ListEni", { reason: "auth_failed", retryable: false }],
    // Server and network.
    [500, "InternalError", "", "ListEni", { reason: "unavailable", retryable: true }],
    [502, "", "", "ListEni", { reason: "unavailable", retryable: true }],
    [504, "GatewayTimeout", "", "ListEni", { reason: "unavailable", retryable: true }],
    [0, "", "connection refused", "ListEni", { reason: "unavailable", retryable: true }],
    // A wrong state has no documented code: a plain 400 stays "other" (the provider re-reads).
    [400, "BadRequest", "The eni eni-x status is attaching", "DeleteEni", {
      reason: "other",
      retryable: false,
      missing: null,
    }],
    [409, "Conflict", "", "AttachEni", { reason: "wrong_state" }],
  ];
  for (const [status, code, message, op, want] of rows) {
    await t.step(`${status} ${code || "(no code)"} ${message} on ${op} → ${want.reason}`, () => {
      const c = classifyError({ status, code, message, op });
      const got: Record<string, unknown> = { reason: c.reason };
      for (const k of ["missing", "retryable", "throttled"] as const) {
        if (k in want) got[k] = c[k];
      }
      assertEquals(got, want);
    });
  }
});

Deno.test("codeForEmptyBody() names codes as bce-sdk-go does for an empty error body", () => {
  assertEquals(codeForEmptyBody(400, "Bad Request"), "InvalidHTTPRequest");
  assertEquals(codeForEmptyBody(403, ""), "AccessDenied");
  assertEquals(codeForEmptyBody(429, "Too Many Requests"), "TooManyRequests");
  assertEquals(codeForEmptyBody(429, ""), "TooManyRequests");
  assertEquals(codeForEmptyBody(404, ""), "NotFound");
  assertEquals(codeForEmptyBody(418, ""), "Http418");
});

Deno.test("throttled calls are retried with a doubling, jittered backoff; quota errors are not", async () => {
  const fake = startFake();
  const log = testLogger();
  const client = clientWith(fake.url, {
    log: log.child({ test: "backoff" }),
    retry: { maxAttempts: 6, baseDelayMs: 4, maxDelayMs: 1000, totalTimeoutMs: 10_000 },
    // Jitter factor 0.5 + 0.5/2 = 0.75 of the ceiling, every time.
    random: () => 0.5,
  });
  try {
    const before = LOG_LINES.length;
    fake.inject({ kind: "throttle" }, 1); // 429, empty body
    fake.inject({ kind: "throttle", status: 400, code: "RequestLimitExceeded" }, 1);
    fake.inject({ kind: "throttle", status: 400, message: "Request RateLimit exceeded" }, 1);
    fake.inject({ kind: "throttle", status: 429, code: "QpsLimitExceeded" }, 1);
    const list = await client.listEnis({ vpcId: "vpc-fake0001" });
    assertEquals(list, []);
    assertEquals(fake.requests.length, 5);
    const delays = LOG_LINES.slice(before)
      .filter((l) => l.includes("BCE call throttled, backing off"))
      .map((l) => Number(JSON.parse(l).delayMs));
    // Throttling doubles the base (2 × 4 ms), then doubles per attempt: 8, 16, 32, 64 × 0.75.
    assertEquals(delays, [6, 12, 24, 48]);

    fake.inject({
      kind: "status",
      status: 400,
      code: "QuotaLimitExceeded",
      match: { action: "attach" },
    }, 1);
    const n = fake.requests.length;
    const e = await client.attachEni("eni-abcdefabcdef", INSTANCE, "t").then(() => null, (e) => e);
    assert(e instanceof BceApiError);
    assertEquals([e.reason, e.retryable], ["quota_exceeded", false]);
    assertEquals(fake.requests.length - n, 1, "a quota error is sent once");
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("a Retry-After header stretches the backoff", async () => {
  const fake = startFake();
  const client = clientWith(fake.url, {
    retry: { maxAttempts: 3, baseDelayMs: 1, maxDelayMs: 1500, totalTimeoutMs: 10_000 },
    random: () => 0,
  });
  try {
    const before = LOG_LINES.length;
    fake.inject({ kind: "throttle", retryAfterSeconds: 1 }, 1);
    await client.listEnis({ vpcId: "vpc-fake0001" });
    const delays = LOG_LINES.slice(before)
      .filter((l) => l.includes("BCE call throttled"))
      .map((l) => Number(JSON.parse(l).delayMs));
    assertEquals(delays, [1000]);
  } finally {
    client.close();
    await fake.close();
  }
});

Deno.test("404s from the fake are classified by code and operation", async (t) => {
  const fake = startFake();
  const c = testClient(fake, { maxAttempts: 1 });
  const err = (p: Promise<unknown>) =>
    p.then(() => {
      throw new Error("expected a failure");
    }, (e) => {
      assert(e instanceof BceApiError, String(e));
      return e;
    });
  try {
    const id = await c.createEni({
      name: "enim/x/1",
      subnetId: "sbn-fake0001",
      securityGroupIds: [],
      enterpriseSecurityGroupIds: [],
    }, "t1");
    await t.step("a missing ENI on detail and delete → the ENI is gone", async () => {
      for (
        const e of [
          await err(c.getEni("eni-000000000000")),
          await err(c.deleteEni("eni-000000000000", "d")),
        ]
      ) {
        assertEquals([e.status, e.missing], [404, "eni"]);
      }
    });
    await t.step(
      "attach to an unknown instance → NoSuchObject, ambiguous, not 'ENI gone'",
      async () => {
        const e = await err(c.attachEni(id, "i-nobody", "a"));
        assertEquals([e.status, e.code, e.missing], [404, "NoSuchObject", "ambiguous"]);
      },
    );
    await t.step("an unknown instance's detail → the instance is missing", async () => {
      const e = await err(c.getInstance("i-nobody"));
      assertEquals(e.missing, "instance");
    });
    await t.step(
      "404 InvalidVersion, 404 with no body, 400 InvalidURI → nothing is gone",
      async () => {
        fake.inject({
          kind: "status",
          status: 404,
          code: "InvalidVersion",
          match: { method: "DELETE" },
        });
        assertEquals((await err(c.deleteEni(id, "d1"))).missing, null);
        fake.inject({ kind: "status", status: 404, emptyBody: true, match: { method: "DELETE" } });
        const bare = await err(c.deleteEni(id, "d2"));
        assertEquals([bare.code, bare.missing], ["NotFound", null]);
        const uri = await err(c.getEni("eni-abc/extra"));
        assertEquals([uri.code, uri.missing], ["InvalidURI", null]);
        assert(fake.enis.has(id), "the ENI is still there");
      },
    );
  } finally {
    c.close();
    await fake.close();
  }
});
