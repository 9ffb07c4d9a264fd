// `node-eventsource`: the `eventsource` package (the WHATWG EventSource for Node) reading an
// OpenAI-compatible stream, the way an app does with it.
//
// An EventSource only GETs; this package's documented `fetch` option ("can also be used to
// alter the request/response behaviour", its README's header example) is how a Node app
// makes it POST the chat request itself: the wrapper adds the method, the JSON body and the
// bearer token to the package's own init (Accept: text/event-stream, and Last-Event-ID once
// an event carried an id). The app closes the source on `data: [DONE]`: an EventSource treats
// the end of a response as a dropped connection and reconnects (default 3 s, or the server's
// `retry:`), which re-sends the POST. So a stream that ends without [DONE], or breaks, is
// re-requested and the new answer is appended to what was shown: the library's own
// behaviour, scored as such. When the first response named a resumable stream
// (`X-Stream-Id`, the gateway pattern), the wrapper sends it back on the reconnect beside
// the package's Last-Event-ID, so such a server resumes instead of starting again.
// A non-200 answer or a wrong content type fails the connection (no reconnect, the spec's
// rule): an error here, as is more than MAX_RECONNECTS reconnects in a row without an event.
// An in-band `{"error": ...}` frame is surfaced.

import { EventSource } from "eventsource";

import { Abandoned, applyChunk, chunkInfo, countingFetch, runClient } from "./contract.mjs";

const MAX_RECONNECTS = 5;

function stream(url, spec, env, rec, signal) {
  return new Promise((resolve, reject) => {
    let streamId = null;
    const source = new EventSource(url, {
      fetch: async (input, init) => {
        const headers = {
          ...init.headers,
          "Content-Type": "application/json",
          Authorization: `Bearer ${env.apiKey}`,
          ...(streamId ? { "X-Stream-Id": streamId } : {}),
        };
        const response = await countingFetch(input, {
          ...init,
          method: "POST",
          headers,
          body: JSON.stringify(spec.body),
        });
        streamId = response.headers.get("x-stream-id") ?? streamId;
        return response;
      },
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
        finish(); // else the EventSource reconnects and asks again
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
      } else if (streamId) {
        rec.resumes += 1; // a resumable server continues; any other starts the answer again
      }
    });
  });
}

runClient("node-eventsource", async (env) => {
  return async (spec, rec, signal) => {
    if (spec.streaming) {
      await stream(env.url(spec.endpoint), spec, env, rec, signal);
      return;
    }
    // Nothing to stream: the app's plain fetch.
    const response = await countingFetch(env.url(spec.endpoint), {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${env.apiKey}` },
      body: JSON.stringify(spec.body),
      signal,
    });
    if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 300)}`);
    applyChunk(rec, chunkInfo(await response.json()));
  };
});
