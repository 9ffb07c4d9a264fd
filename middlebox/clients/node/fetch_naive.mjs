// `node-fetch-naive`: a hand-written fetch() reader that decodes each network read on its own.
//
// The loop many tutorials show: POST, check `response.ok`, `response.body.getReader()`, and
// `new TextDecoder().decode(value)` per read, **without `{stream: true}`**: a UTF-8 character
// split across two reads becomes two U+FFFD (the WHATWG Encoding standard's decode flushes
// at the end of each call), which is the mojibake the scorer looks for. Lines are split on
// the decoded text, each `data:` line's JSON is shown, `[DONE]` ends the read. No retry, no
// timeout (Node's fetch has none on the body), an RST or a cut chunked body throws
// `TypeError: terminated`, a clean close without `[DONE]` ends quietly.

import { applyChunk, chunkInfo, countingFetch, runClient } from "./contract.mjs";

runClient("node-fetch-naive", async (env) => {
  return async (spec, rec, signal) => {
    const response = await countingFetch(env.url(spec.endpoint), {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${env.apiKey}` },
      body: JSON.stringify(spec.body),
      signal,
    });
    if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 300)}`);
    if (!spec.streaming) {
      applyChunk(rec, chunkInfo(await response.json()));
      return;
    }
    const reader = response.body.getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += new TextDecoder().decode(value); // the bug under test: no {stream: true}
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") {
          rec.sawDone = true;
          await reader.cancel();
          return;
        }
        const info = chunkInfo(JSON.parse(data));
        if (info.error !== null) throw new Error(info.error);
        applyChunk(rec, info);
      }
    }
  };
});
