// `node-fetch-event-source`: `@microsoft/fetch-event-source`, as its README shows it.
//
// `fetchEventSource(url, {method: "POST", headers, body, onmessage, signal})` with the
// library's defaults: its `onopen` refuses a response that is not `text/event-stream` (a 429's
// JSON body) by throwing, and with no `onerror` given every error (that one, an RST, a cut
// body) is retried after its retry interval (1 s, or the server's `retry:`), for ever,
// resending `Last-Event-ID` when the events had ids; a clean close ends it quietly. The
// page keeps what it showed across retries, as a chat UI appending `onmessage` data does.
// `[DONE]` ends the request (its signal aborts the stream).
//
// The library is written for browsers: it calls `document.addEventListener`/`removeEventListener`
// and `window.setTimeout`. In Node, as its users do, the driver passes `openWhenHidden: true`
// (there is no page visibility) and gives it the two globals it touches.

import { Abandoned, applyChunk, chunkInfo, countingFetch, runClient } from "./contract.mjs";

globalThis.window ??= globalThis;
globalThis.document ??= { hidden: false, addEventListener() {}, removeEventListener() {} };

const { fetchEventSource } = await import("@microsoft/fetch-event-source");

runClient("node-fetch-event-source", async (env) => {
  return async (spec, rec, signal) => {
    // One signal the library sees for both ends: the user left, or [DONE] came.
    const done = new AbortController();
    signal.addEventListener("abort", () => done.abort(), { once: true });
    let failure = null;
    await fetchEventSource(env.url(spec.endpoint), {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${env.apiKey}` },
      body: JSON.stringify(spec.body),
      signal: done.signal,
      openWhenHidden: true,
      fetch: countingFetch,
      onmessage(event) {
        // The library dispatches a message at every blank line, even one that ends a
        // `: keep-alive` comment with no data (the WHATWG parser dispatches none then).
        if (event.data === "") return;
        if (event.data === "[DONE]") {
          rec.sawDone = true;
          done.abort();
          return;
        }
        try {
          const info = chunkInfo(JSON.parse(event.data));
          if (info.error !== null) throw new Error(info.error);
          applyChunk(rec, info);
        } catch (error) {
          // Thrown here, the library would treat it as a broken connection and retry.
          if (!(error instanceof Abandoned)) failure = error;
          done.abort();
        }
      },
    });
    if (failure !== null) throw failure;
  };
});
