// `node-openai-responses`: the `openai` package's Responses streaming, as its README shows it.
//
// `new OpenAI({baseURL, apiKey})` with its defaults (10 min timeout, 2 retries with backoff
// that honours `retry-after`, none once the stream started), `await
// client.responses.create({..., stream: true})`, then `for await (const event of stream)`,
// each `response.output_text.delta` shown. How the answer ended is read from the terminal
// event with api_requests.mjs's `readEvent` (core/dialects.py's rule, as the Python
// `openai-responses` client reads it): `finish_reason` is the response's status (`completed`,
// `cancelled`) or its `incomplete_details.reason` (`max_output_tokens`), usage the response's.
// An `error` event or `response.failed` is surfaced as `ResponseFailed: <message>` (the SDK
// itself throws only for data with an `error` field). An RST or a cut chunked body makes the
// SDK throw; a stream that closes cleanly before its terminal event simply ends the loop,
// and the client reports what it had. Responses streams have no `[DONE]`: `saw_done` stays
// false. The workload's chat request becomes a Responses request (api_requests.mjs).

import OpenAI from "openai";

import { RESPONSES, readEvent, responsesRequest } from "./api_requests.mjs";
import { countingFetch, runClient } from "./contract.mjs";

class ResponseFailed extends Error {
  name = "ResponseFailed";
}

function failure(event) {
  const error = event.error ?? event.response?.error;
  return String(error?.message || event.message || "the response failed");
}

/** The text of a response body's output messages (`output_text` is the SDK's own sum). */
function outputText(answer) {
  if (typeof answer.output_text === "string" && answer.output_text) return answer.output_text;
  const parts = (answer.output ?? []).flatMap((item) => item?.content ?? []);
  return parts.filter((part) => part?.type === "output_text").map((part) => part.text ?? "").join("");
}

runClient("node-openai-responses", async (env) => {
  const client = new OpenAI({ baseURL: env.baseUrl, apiKey: env.apiKey, fetch: countingFetch });
  return async (spec, rec, signal) => {
    const request = responsesRequest(spec);
    if (!spec.streaming) {
      const answer = await client.responses.create(request, { signal });
      rec.show(outputText(answer));
      rec.finishReason = answer.incomplete_details?.reason || answer.status || null;
      rec.usage = answer.usage ?? null;
      return;
    }
    const stream = await client.responses.create({ ...request, stream: true }, { signal });
    for await (const event of stream) {
      const seen = readEvent(event, RESPONSES);
      if (seen.end !== null) {
        rec.finishReason = seen.reason;
        if (event.response?.usage) rec.usage = event.response.usage;
        if (event.type === "error" || event.type === "response.failed") throw new ResponseFailed(failure(event));
      }
      if (seen.token === "answer") rec.show(seen.text);
    }
  };
});
