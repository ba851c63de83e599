/**
 * A byte stream cut into lines: the watch wire format is one JSON object per line
 * (`\n`-terminated). A line may span many chunks, and a chunk may hold many lines or
 * end inside a multi-byte character; the text is decoded as a stream so neither
 * breaks a line. A last line without its newline is yielded too.
 *
 * `signal` cancels the read itself: with Deno 2.9.6 a fetch's AbortSignal does not
 * reach its body once the Response object is unreferenced (a pending read then never
 * settles), so the reader is cancelled here rather than trusting the fetch to do it.
 *
 * @module
 */

/**
 * The lines of `body`, without their `\n` (and a `\r` before it), empty lines skipped.
 * When `signal` aborts, the body is cancelled and the generator throws its reason.
 */
export async function* lines(
  body: ReadableStream<Uint8Array>,
  signal?: AbortSignal,
): AsyncGenerator<string> {
  const reader = body.getReader();
  const onAbort = () => reader.cancel(signal?.reason).catch(() => {});
  signal?.addEventListener("abort", onAbort, { once: true });
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      if (signal?.aborted) throw signal.reason;
      const { value, done } = await reader.read();
      if (signal?.aborted) throw signal.reason;
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
    signal?.removeEventListener("abort", onAbort);
    // Releases the body whether the reader finished, failed or was left early.
    await reader.cancel().catch(() => {});
  }
}
