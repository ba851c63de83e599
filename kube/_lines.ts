/**
 * A byte stream cut into lines: the watch wire format is one JSON object per line
 * (`\n`-terminated). A line may span many chunks, and a chunk may hold many lines or
 * end inside a multi-byte character; the text is decoded as a stream so neither
 * breaks a line. A last line without its newline is yielded too.
 *
 * @module
 */

/** The lines of `body`, without their `\n` (and a `\r` before it), empty lines skipped. */
export async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let start = 0;
      for (let nl = buffer.indexOf("\n"); nl >= 0; nl = buffer.indexOf("\n", start)) {
        const line = buffer.slice(start, nl).replace(/\r$/, "");
        start = nl + 1;
        if (line.trim() !== "") yield line;
      }
      buffer = buffer.slice(start);
    }
    buffer += decoder.decode();
    if (buffer.trim() !== "") yield buffer.replace(/\r$/, "");
  } finally {
    // Releases the body whether the reader finished, failed or was left early.
    await reader.cancel().catch(() => {});
  }
}
