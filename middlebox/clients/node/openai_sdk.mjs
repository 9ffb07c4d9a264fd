// `node-openai`: the official `openai` package for Node, as its README shows it.
//
// `new OpenAI({baseURL, apiKey})` with its defaults (10 min timeout, 2 retries with backoff
// that honours `retry-after`), `stream: true`, deltas reassembled with `for await`, whatever
// the SDK throws shown as the error. The request body goes as is: the SDK sends the params
// object as JSON, so vLLM fields it does not type (top_k, ignore_eos) travel unchanged. The
// only addition is the documented `fetch` option, set to the global fetch wrapped to count
// attempts. The SDK consumes `[DONE]` and never tells its caller, so `saw_done` stays false.

import OpenAI from "openai";

import { applyChunk, chunkInfo, countingFetch, runClient } from "./contract.mjs";

runClient("node-openai", async (env) => {
  const client = new OpenAI({ baseURL: env.baseUrl, apiKey: env.apiKey, fetch: countingFetch });
  return async (spec, rec, signal) => {
    const api = spec.endpoint === "chat" ? client.chat.completions : client.completions;
    const response = await api.create(spec.body, { signal });
    if (!spec.streaming) {
      applyChunk(rec, chunkInfo(response));
      return;
    }
    for await (const chunk of response) applyChunk(rec, chunkInfo(chunk));
  };
});
