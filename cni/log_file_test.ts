import { assert, assertEquals } from "../lib/assert.ts";
import { appendLine, fileSink } from "./log_file.ts";

Deno.test("appendLine() creates the directory and appends JSON lines", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const path = `${dir}/sub/cni.log`;
    appendLine(path, '{"a":1}');
    appendLine(path, '{"a":2}');
    assertEquals(Deno.readTextFileSync(path), '{"a":1}\n{"a":2}\n');
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("appendLine() rotates to .1 once the file passes the bound", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const path = `${dir}/cni.log`;
    for (let i = 0; i < 10; i++) appendLine(path, `{"i":${i}}`, 20);
    const cur = Deno.readTextFileSync(path);
    const old = Deno.readTextFileSync(`${path}.1`);
    assert(cur.length <= 40, cur);
    assert(old.length > 0);
    assertEquals(Deno.readDirSync(dir).toArray().length, 2);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("fileSink() swallows failures", () => {
  const dir = Deno.makeTempDirSync();
  try {
    Deno.writeTextFileSync(`${dir}/file`, "");
    // A path under a regular file cannot be created.
    fileSink(`${dir}/file/cni.log`)("x");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});
