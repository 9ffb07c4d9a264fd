// `node-ai-sdk-anthropic`: the AI SDK's `streamText` with `@ai-sdk/anthropic`.
//
// `createAnthropic({baseURL, apiKey})(model)` (the provider appends `/messages` to a baseURL
// that ends in `/v1`, its default being `https://api.anthropic.com/v1`) and `streamText({model,
// messages, maxOutputTokens, abortSignal})`, read through `fullStream` (ai_sdk_stream.mjs):
// `text-delta` parts shown, an `error` part surfaced, the `finish` part's reason kept.
// Defaults kept: `maxRetries: 2` with backoff that honours `retry-after` (until the stream
// starts), no timeout. Anthropic requires `max_tokens`: a workload without one gets 1024, as
// the Python `anthropic-messages` client sends. The provider's raw finish reason is the
// `message_delta`'s `stop_reason` (`end_turn`, `max_tokens`, ...), reported as it is, as the
// Python client reports it; a stream that ends before its `message_delta` finishes as
// `other` without one: null.
// `streamText` streams even where the workload says `stream: false`, as in node-ai-sdk.

import { createAnthropic } from "@ai-sdk/anthropic";

import { DEFAULT_MAX_TOKENS, aiSdkSettings } from "./api_requests.mjs";
import { streamAnswer } from "./ai_sdk_stream.mjs";
import { countingFetch, runClient } from "./contract.mjs";

const WORDS = { stop: "end_turn", length: "max_tokens", "tool-calls": "tool_use", "content-filter": "refusal" };

const usage = (u) => ({ input_tokens: u.inputTokens, output_tokens: u.outputTokens });

runClient("node-ai-sdk-anthropic", async (env) => {
  const anthropic = createAnthropic({ baseURL: env.baseUrl, apiKey: env.apiKey, fetch: countingFetch });
  return async (spec, rec, signal) => {
    const settings = aiSdkSettings(spec, DEFAULT_MAX_TOKENS);
    await streamAnswer(rec, { model: anthropic(spec.body.model), ...settings, abortSignal: signal }, WORDS, usage);
  };
});
