import { assertEquals } from "./assert.ts";
import { userMessage } from "./message.ts";

Deno.test("userMessage() turns Deno's permission hints into a sentence about enim", () => {
  assertEquals(
    userMessage(
      new Deno.errors.NotCapable(
        'Requires read access to "/etc/passwd", run again with the --allow-read flag',
      ),
    ),
    `enim's permission set does not allow read access to "/etc/passwd"`,
  );
  assertEquals(
    userMessage(
      new Error('Requires all access to "/proc/self/ns/mnt", run again with the --allow-all flag'),
    ),
    `enim's permission set does not allow all access to "/proc/self/ns/mnt"`,
  );
  assertEquals(userMessage(new Error("plain")), "plain");
  assertEquals(userMessage("text"), "text");
});
