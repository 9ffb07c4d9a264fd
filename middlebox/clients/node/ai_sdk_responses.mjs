// `node-ai-sdk-responses`: the AI SDK's `streamText` with `@ai-sdk/openai`'s Responses model.
//
// `createOpenAI({baseURL, apiKey}).responses(model)` (the provider's Responses API model, as
// its docs show) and `streamText({model, messages, maxOutputTokens, abortSignal})`, read
// through `fullStream` (ai_sdk_stream.mjs): `text-delta` parts shown, an `error` part
// surfaced, the `finish` part's reason kept. Defaults kept: `maxRetries: 2` with backoff that
// honours `retry-after` (retrying only until the stream starts), no timeout. The finish
// reason is put back in the Responses API's words, as the Python `openai-responses` client
// reports it: the provider's raw reason is `incomplete_details.reason` (`max_output_tokens`),
// absent for a `completed` response, whose unified `stop` reads `completed`; a stream that
// ends before its terminal event finishes as `other` without a raw reason: null. The
// workload's chat request becomes `streamText` settings (api_requests.mjs `aiSdkSettings`).
// `streamText` streams even where the workload says `stream: false`, as in node-ai-sdk.

import { createOpenAI } from "@ai-sdk/openai";

import { aiSdkSettings } from "./api_requests.mjs";
import { streamAnswer } from "./ai_sdk_stream.mjs";
import { countingFetch, runClient } from "./contract.mjs";

const WORDS = { stop: "completed", length: "max_output_tokens", "content-filter": "content_filter" };

const usage = (u) => ({ input_tokens: u.inputTokens, output_tokens: u.outputTokens, total_tokens: u.totalTokens });

runClient("node-ai-sdk-responses", async (env) => {
  const openai = createOpenAI({ baseURL: env.baseUrl, apiKey: env.apiKey, fetch: countingFetch });
  return async (spec, rec, signal) => {
    const model = openai.responses(spec.body.model);
    await streamAnswer(rec, { model, ...aiSdkSettings(spec), abortSignal: signal }, WORDS, usage);
  };
});
