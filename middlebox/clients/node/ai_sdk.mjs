// `node-ai-sdk`: the Vercel AI SDK (`ai`) with `@ai-sdk/openai-compatible`, as their docs show.
//
// `createOpenAICompatible({name, baseURL, apiKey})` and `streamText({model, messages})`, read
// through `fullStream`, the documented way to see a stream's errors (`textStream` alone
// hands them to `onError`, which only logs): `text-delta` parts are shown, an `error` part is
// surfaced, the `finish` part carries the finish reason (ai_sdk_stream.mjs). Defaults kept:
// `maxRetries: 2` with backoff that honours `retry-after` (retrying only until the stream
// starts), no timeout. The SDK itself treats a stream that ends without a `finish_reason` as
// an error ("Response stream ended without a finish reason."). The workload body maps onto
// the SDK's settings (max_tokens -> maxOutputTokens, ...); fields the SDK has no setting for
// (vLLM's top_k, ignore_eos) go through `providerOptions`, which the provider copies into the body.
// `[DONE]` is consumed by the SDK's parser, so `saw_done` stays false.

import { createOpenAICompatible } from "@ai-sdk/openai-compatible";

import { streamAnswer } from "./ai_sdk_stream.mjs";
import { countingFetch, runClient } from "./contract.mjs";

const PROVIDER = "vllm";

// Body fields with an AI SDK setting of their own; `model`, the prompt and `stream` are
// consumed by the call itself.
const SETTINGS = {
  max_tokens: "maxOutputTokens",
  temperature: "temperature",
  top_p: "topP",
  presence_penalty: "presencePenalty",
  frequency_penalty: "frequencyPenalty",
  seed: "seed",
};
const CONSUMED = new Set(["model", "messages", "prompt", "stream", "stream_options"]);

/** The SDK's unified finish reason back in the OpenAI vocabulary the contract uses. */
const FINISH = { stop: "stop", length: "length", "content-filter": "content_filter", "tool-calls": "tool_calls" };

const usage = (u) => ({ prompt_tokens: u.inputTokens, completion_tokens: u.outputTokens, total_tokens: u.totalTokens });

function callSettings(body) {
  const settings = {};
  const extra = {};
  for (const [key, value] of Object.entries(body)) {
    if (key in SETTINGS) settings[SETTINGS[key]] = value;
    else if (key === "stop") settings.stopSequences = Array.isArray(value) ? value : [value];
    else if (!CONSUMED.has(key)) extra[key] = value;
  }
  if (Object.keys(extra).length) settings.providerOptions = { [PROVIDER]: extra };
  return settings;
}

runClient("node-ai-sdk", async (env) => {
  const providers = new Map();
  const provider = (includeUsage) => {
    if (!providers.has(includeUsage)) {
      const options = { name: PROVIDER, baseURL: env.baseUrl, apiKey: env.apiKey, includeUsage, fetch: countingFetch };
      providers.set(includeUsage, createOpenAICompatible(options));
    }
    return providers.get(includeUsage);
  };
  return async (spec, rec, signal) => {
    const vllm = provider(Boolean(spec.body.stream_options?.include_usage));
    const prompt =
      spec.endpoint === "chat"
        ? { model: vllm.chatModel(spec.body.model), messages: spec.body.messages }
        : { model: vllm.completionModel(spec.body.model), prompt: spec.body.prompt };
    // streamText streams whatever `stream` says; the SDK has generateText for the other case,
    // but every workload the scorer sends here streams.
    await streamAnswer(rec, { ...prompt, ...callSettings(spec.body), abortSignal: signal }, FINISH, usage);
  };
});
