// `node-anthropic`: `@anthropic-ai/sdk`'s `messages.stream`, as the SDK's helpers document it.
//
// `new Anthropic({baseURL, apiKey})` with the SDK's defaults (10 min timeout, 2 retries with
// backoff that honours `retry-after`, none once the stream started), pointed at the server's
// root: the SDK appends `/v1/messages` itself, so the contract's `OPENAI_BASE_URL` loses its
// `/v1`. Then
//
//     const stream = client.messages.stream({max_tokens, messages, model}).on("text", show);
//     const message = await stream.finalMessage();
//
// each `text` piece shown; `finish_reason` is the final message's `stop_reason` (`end_turn`,
// `max_tokens`, ...), usage its `usage`, as the Python `anthropic-messages` client reports
// them. What the SDK throws is surfaced as the error (`event: error` throws an `APIError`;
// an RST or a cut chunked body a connection error); then the stop reason is read from the
// message the stream had accumulated (`currentMessage`; null before its `message_delta`). A
// stream that closes cleanly before `message_stop` resolves `finalMessage()` with what had
// come, `stop_reason` null. The workload's chat request becomes a Messages request
// (api_requests.mjs); the SDK sends the params object as JSON, vLLM's extra fields included.

import Anthropic from "@anthropic-ai/sdk";

import { messagesRequest, rootUrl } from "./api_requests.mjs";
import { Abandoned, countingFetch, runClient } from "./contract.mjs";

function settle(rec, message) {
  rec.finishReason = message?.stop_reason ?? null;
  rec.usage = message?.usage ?? null;
}

runClient("node-anthropic", async (env) => {
  const client = new Anthropic({ baseURL: rootUrl(env.baseUrl), apiKey: env.apiKey, fetch: countingFetch });
  return async (spec, rec, signal) => {
    const request = messagesRequest(spec);
    if (!spec.streaming) {
      const message = await client.messages.create(request, { signal });
      rec.show(message.content.filter((block) => block.type === "text").map((block) => block.text).join(""));
      settle(rec, message);
      return;
    }
    const stream = client.messages.stream(request, { signal }).on("text", (text) => {
      try {
        rec.show(text);
      } catch (error) {
        // The user left: rec.show aborted the request already; a throw here would be the SDK's.
        if (!(error instanceof Abandoned)) throw error;
      }
    });
    try {
      settle(rec, await stream.finalMessage());
    } catch (error) {
      settle(rec, stream.currentMessage);
      throw error;
    }
  };
});
