import { assertEquals } from "../../lib/assert.ts";
import {
  canonicalQuery,
  canonicalUri,
  parseAuthorization,
  sign,
  uriEncode,
  wireQuery,
} from "./signer.ts";

Deno.test("uriEncode() encodes UTF-8 bytes with upper-case hex and keeps unreserved characters", () => {
  assertEquals(uriEncode("a-Z_0.~"), "a-Z_0.~");
  assertEquals(uriEncode("a b:/,=;+"), "a%20b%3A%2F%2C%3D%3B%2B");
  assertEquals(uriEncode("测试"), "%E6%B5%8B%E8%AF%95");
  assertEquals(canonicalUri("/example/测试"), "/example/%E6%B5%8B%E8%AF%95");
  assertEquals(canonicalUri(""), "/");
});

Deno.test("canonicalQuery() sorts whole key=value strings and gives bare keys an '='", () => {
  assertEquals(
    canonicalQuery([["text", null], ["text1", "测试"], ["text10", "test"]]),
    "text10=test&text1=%E6%B5%8B%E8%AF%95&text=",
  );
  assertEquals(canonicalQuery([["authorization", "x"], ["attach", ""]]), "attach=");
  assertEquals(wireQuery([["attach", null], ["clientToken", "ct-1"]]), "attach&clientToken=ct-1");
});

Deno.test("sign() reproduces vector V0 (the official example)", () => {
  const out = sign({
    method: "PUT",
    path: "/v1/test/myfolder/readme.txt",
    query: [["partNumber", "9"], ["uploadId", "a44cc9bab11cbd156984767aad637851"]],
    headers: {
      Host: "bj.bcebos.com",
      Date: "Mon, 27 Apr 2015 16:23:49 +0800",
      "Content-Type": "text/plain",
      "Content-Length": "8",
      "Content-Md5": "NFzcPqhviddjRNnSOGo4rw==",
      "x-bce-date": "2015-04-27T08:23:49Z",
    },
    accessKeyId: "a".repeat(32),
    secretAccessKey: "b".repeat(32),
    timestamp: "2015-04-27T08:23:49Z",
    expirationSeconds: 1800,
  });
  assertEquals(out.signingKey, "1d5ce5f464064cbee060330d973218821825ac6952368a482a592e6615aef479");
  assertEquals(out.signature, "d74a04362e6a848f5b39b15421cb449427f419c95a480fd6b8cf9fc783e2999e");
});

Deno.test("sign() reproduces vector V1 (list with '/' and ',' in values)", () => {
  const out = sign({
    method: "GET",
    path: "/v1/eni",
    query: [
      ["vpcId", "vpc-2pa2x0bjt26i"],
      ["instanceId", "i-YufwpQAe"],
      ["name", "c-k8sdemo/i-YufwpQAe/"],
      ["maxKeys", "100"],
      ["privateIpAddress", "10.0.1.5,10.0.1.6"],
    ],
    headers: {
      Host: "bcc.bj.baidubce.com",
      "Content-Type": "application/json;charset=utf-8",
      "x-bce-date": "2024-05-20T08:30:00Z",
    },
    accessKeyId: "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6",
    secretAccessKey: "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    timestamp: "2024-05-20T08:30:00Z",
  });
  assertEquals(
    out.canonicalRequest,
    [
      "GET",
      "/v1/eni",
      "instanceId=i-YufwpQAe&maxKeys=100&name=c-k8sdemo%2Fi-YufwpQAe%2F&privateIpAddress=10.0.1.5%2C10.0.1.6&vpcId=vpc-2pa2x0bjt26i",
      "content-type:application%2Fjson%3Bcharset%3Dutf-8",
      "host:bcc.bj.baidubce.com",
      "x-bce-date:2024-05-20T08%3A30%3A00Z",
    ].join("\n"),
  );
  assertEquals(out.signingKey, "f34bf8277dfe34c3a49235f3239026f951472662e8962b5d6e3d3b9febd8b8f6");
  assertEquals(
    out.authorization,
    "bce-auth-v1/a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6/2024-05-20T08:30:00Z/1800/content-type;host;x-bce-date/5f879babdf3553d5e5a41203bd7c9377e377a47a5a0df646f38aeee1b1137328",
  );
});

Deno.test("sign() reproduces vector V2 (attach with the bare flag and a JSON body)", () => {
  const out = sign({
    method: "PUT",
    path: "/v1/eni/eni-w2d4kgc3x0y1",
    query: [["attach", null], ["clientToken", "be31b98c-5e41-4838-9830-9be700de5a20"]],
    headers: {
      Host: "bcc.bj.baidubce.com",
      "Content-Type": "application/json;charset=utf-8",
      "Content-Length": "27",
      "Content-Md5": "7ZsEKHp4PUEYrA692OxGmw==",
      "x-bce-date": "2024-05-20T08:30:05Z",
    },
    accessKeyId: "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6",
    secretAccessKey: "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    timestamp: "2024-05-20T08:30:05Z",
    expirationSeconds: 1800,
  });
  assertEquals(
    out.canonicalRequest,
    [
      "PUT",
      "/v1/eni/eni-w2d4kgc3x0y1",
      "attach=&clientToken=be31b98c-5e41-4838-9830-9be700de5a20",
      "content-length:27",
      "content-md5:7ZsEKHp4PUEYrA692OxGmw%3D%3D",
      "content-type:application%2Fjson%3Bcharset%3Dutf-8",
      "host:bcc.bj.baidubce.com",
      "x-bce-date:2024-05-20T08%3A30%3A05Z",
    ].join("\n"),
  );
  assertEquals(out.signingKey, "c6bc3121ff07e0d90ce8c50358b16a4060849b83c0c28d48ae7a4cd3a8ef1543");
  assertEquals(
    out.authorization,
    "bce-auth-v1/a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6/2024-05-20T08:30:05Z/1800/content-length;content-md5;content-type;host;x-bce-date/74ec9dd7e3f05ddbbfa1a3e9268f6923cdc832110fab6b105d1f116bc5a844c0",
  );
});

Deno.test("sign() reproduces vector V3 (create with STS credentials and 3600 s expiry)", () => {
  const out = sign({
    method: "POST",
    path: "/v1/eni",
    query: [["clientToken", "7f3c2a10-0d4e-4b8e-9a51-3c2f1e0d9b77"]],
    headers: {
      Host: "bcc.gz.baidubce.com",
      "Content-Type": "application/json;charset=utf-8",
      "Content-Length": "256",
      "Content-Md5": "P/Hqxq6uNiXXpbZQqfqRoQ==",
      "x-bce-date": "2025-01-02T03:04:05Z",
      "x-bce-security-token": "ZjQ4YmNmM2Q+Example/SessionToken==",
    },
    accessKeyId: "ALTAKexampleTemporaryKey0001",
    secretAccessKey: "stsSecretExample/With+Chars=",
    timestamp: "2025-01-02T03:04:05Z",
    expirationSeconds: 3600,
  });
  assertEquals(
    out.canonicalRequest,
    [
      "POST",
      "/v1/eni",
      "clientToken=7f3c2a10-0d4e-4b8e-9a51-3c2f1e0d9b77",
      "content-length:256",
      "content-md5:P%2FHqxq6uNiXXpbZQqfqRoQ%3D%3D",
      "content-type:application%2Fjson%3Bcharset%3Dutf-8",
      "host:bcc.gz.baidubce.com",
      "x-bce-date:2025-01-02T03%3A04%3A05Z",
      "x-bce-security-token:ZjQ4YmNmM2Q%2BExample%2FSessionToken%3D%3D",
    ].join("\n"),
  );
  assertEquals(out.signingKey, "36277eb044072d23ed04c24c0360324560750679b97c8bc20e34173f5dd49eca");
  assertEquals(
    out.authorization,
    "bce-auth-v1/ALTAKexampleTemporaryKey0001/2025-01-02T03:04:05Z/3600/content-length;content-md5;content-type;host;x-bce-date;x-bce-security-token/783c54f9e18cecd51ffdedbbf7234b8ae98904fbb5076fb03d1ddcc7200d63d8",
  );
});

Deno.test("sign() reproduces vector V4 (an empty-valued header is left out, as bce-sdk-go v0.9.279 does)", () => {
  // Computed with bce-sdk-go v0.9.279 (auth.BceV1Signer, Go module proxy) from the same
  // inputs, headersToSign naming the empty x-bce-security-token too; that SDK leaves a
  // header whose trimmed value is empty out of the canonical headers and the list
  // (auth/signer.go getCanonicalHeaders). Before it (v0.9.253) the same inputs gave
  // ".../content-type;host;x-bce-date;x-bce-security-token/7d53aac9…".
  const out = sign({
    method: "PUT",
    path: "/v1/eni/eni-w2d4kgc3x0y1",
    query: [["attach", null], ["clientToken", "9f1c2e3a-0b4d-4c5e-8f6a-7b8c9d0e1f2a"]],
    headers: {
      host: "bcc.bj.baidubce.com",
      "content-type": "application/json;charset=utf-8",
      "x-bce-date": "2024-05-20T08:30:00Z",
      "x-bce-security-token": "",
    },
    accessKeyId: "AKIDexample0001",
    secretAccessKey: "SKexampleSecret0001",
    timestamp: "2024-05-20T08:30:00Z",
    expirationSeconds: 1800,
    headersToSign: ["host", "content-type", "x-bce-date", "x-bce-security-token"],
  });
  assertEquals(
    out.authorization,
    "bce-auth-v1/AKIDexample0001/2024-05-20T08:30:00Z/1800/content-type;host;x-bce-date/210ffe9b54a3659f67d439294ecd54f071d0fd8d27660c6e11180477a029cd36",
  );
});

Deno.test("parseAuthorization() splits a bce-auth-v1 header and rejects others", () => {
  const p = parseAuthorization(
    "bce-auth-v1/ak/2024-05-20T08:30:00Z/1800/host;x-bce-date/" + "0".repeat(64),
  );
  assertEquals(p?.accessKeyId, "ak");
  assertEquals(p?.signedHeaders, ["host", "x-bce-date"]);
  assertEquals(parseAuthorization("Bearer x"), null);
});
