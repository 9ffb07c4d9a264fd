// `node-eventsource`: the `eventsource` package (the WHATWG EventSource for Node) following a
// resumable server's stream, the pattern of the `browser-eventsource` client.
//
// EventSource only GETs, so the generation is started with a POST (fetch), whose
// `X-Stream-Id` names the stream; that response is dropped and `new EventSource(
// ${base}/streams/{id})` follows it. Its own reconnect (default 3 s, or the server's
// `retry:`) sends `Last-Event-ID`, so it resumes by itself after a network change; a
// server that is not resumable (no `X-Stream-Id`) is an error here, as in the browser page,
// and, as there, more than MAX_RECONNECTS reconnects in a row without an event give up.
// The bearer token travels through the package's documented `fetch` option (its README's
// header example), wrapped to count attempts. A non-2xx POST is an error; an in-band
// `{"error": ...}` frame is surfaced.

import { EventSource } from "eventsource";

import { Abandoned, applyChunk, chunkInfo, countingFetch, runClient } from "./contract.mjs";

const MAX_RECONNECTS = 5;

function follow(url, env, rec, signal) {
  return new Promise((resolve, reject) => {
    const source = new EventSource(url, {
      fetch: (input, init) =>
        countingFetch(input, { ...init, headers: { ...init.headers, Authorization: `Bearer ${env.apiKey}` } }),
    });
    let failures = 0;
    const finish = (error) => {
      source.close();
      if (error) reject(error);
      else resolve();
    };
    signal.addEventListener("abort", () => finish(), { once: true });
    source.addEventListener("message", (event) => {
      failures = 0;
      if (event.data === "[DONE]") {
        rec.sawDone = true;
        finish();
        return;
      }
      try {
        const info = chunkInfo(JSON.parse(event.data));
        if (info.error !== null) throw new Error(info.error);
        applyChunk(rec, info);
      } catch (error) {
        finish(error instanceof Abandoned ? null : error);
      }
    });
    source.addEventListener("error", (event) => {
      failures += 1;
      if (source.readyState === EventSource.CLOSED || failures > MAX_RECONNECTS) {
        const why = event.message ? `: ${event.message}` : "";
        finish(new Error(`EventSource gave up after ${failures} failed connection(s)${why}`));
      } else {
        rec.resumes += 1;
      }
    });
  });
}

runClient("node-eventsource", async (env) => {
  return async (spec, rec, signal) => {
    const start = new AbortController();
    signal.addEventListener("abort", () => start.abort(), { once: true });
    const response = await countingFetch(env.url(spec.endpoint), {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${env.apiKey}` },
      body: JSON.stringify(spec.body),
      signal: start.signal,
    });
    if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 300)}`);
    if (!spec.streaming) {
      applyChunk(rec, chunkInfo(await response.json()));
      return;
    }
    const id = response.headers.get("x-stream-id");
    start.abort(); // the EventSource reads the stream; a resumable server keeps generating
    if (!id) throw new Error("the server offers no resumable stream (no X-Stream-Id)");
    await follow(`${env.baseUrl}/streams/${encodeURIComponent(id)}`, env, rec, signal);
  };
});
