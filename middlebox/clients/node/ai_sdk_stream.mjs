// `streamText` read as the AI SDK's docs show it, shared by the AI SDK drivers (ai_sdk.mjs,
// ai_sdk_responses.mjs, ai_sdk_anthropic.mjs).
//
// Read through `fullStream`, the documented way to see a stream's errors (`textStream` alone
// hands them to `onError`, which only logs): `text-delta` parts are shown, an `error` part is
// thrown (surfaced), the `finish` part carries the finish reason and the usage. The reason is
// reported in the driver's API's words: the provider's raw reason when it gives one, else the
// SDK's unified reason looked up in the driver's `words` (null when it has none: `other`,
// `unknown`); the usage in that API's field names (`usage(totalUsage)`).

import { streamText } from "ai";

export async function streamAnswer(rec, options, words, usage) {
  const result = streamText(options);
  for await (const part of result.fullStream) {
    if (part.type === "text-delta") rec.show(part.text);
    else if (part.type === "error") throw part.error;
    else if (part.type === "finish") {
      rec.finishReason = part.rawFinishReason ?? words[part.finishReason] ?? null;
      if (part.totalUsage && part.totalUsage.inputTokens !== undefined) rec.usage = usage(part.totalUsage);
    }
  }
}
