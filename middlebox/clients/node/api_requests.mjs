// A workload request in the Responses and Anthropic Messages APIs, and what their events mean:
// middlebox/clients/api_requests.py and middlebox/core/dialects.py for the Node drivers.
//
// The workload is written in OpenAI's chat (or completions) terms: a client that speaks
// another API sends the same conversation in that API's own request, as its user would.
// Responses: `messages` (or `prompt`) become `input`, `max_tokens` `max_output_tokens`.
// Messages: system messages become `system`, `max_tokens` stays (Anthropic requires it; 1024
// when the workload has none), `stop` becomes `stop_sequences`. Fields neither API names
// (vLLM's `ignore_eos`, `top_k`, `seed`) travel in the body as they are (both SDKs send the
// params object as JSON; Python's SDKs need `extra_body` for that); `stream_options` is chat's
// own (both APIs report usage at their end) and is left out. The AI SDK drivers get the same
// conversation as `streamText` settings (`aiSdkSettings`).
//
// `readEvent` is core/dialects.py's `read` for the Responses and Messages dialects, on an
// event's JSON data: the Node side cannot import the Python rule, so it is written again here
// and tests/clients/test_node_dialect_clients.py checks both give the same meaning to every
// event of the recorded vLLM streams (tests/core/streams/).

export const DEFAULT_MAX_TOKENS = 1024;

const RESPONSES_NAMED = new Set(["model", "temperature", "top_p", "user", "metadata"]);
const MESSAGES_NAMED = new Set(["model", "temperature", "top_p", "top_k", "metadata"]);
const CONSUMED = new Set([
  "messages",
  "prompt",
  "max_tokens",
  "max_completion_tokens",
  "stream",
  "stream_options",
  "stop",
  "n",
]);

function maxTokens(body) {
  const value = body.max_tokens || body.max_completion_tokens;
  return Number.isInteger(value) ? value : null;
}

function pick(body, keep) {
  return Object.fromEntries(Object.entries(body).filter(([key]) => keep(key)));
}

const extra = (body, named) => pick(body, (key) => !named.has(key) && !CONSUMED.has(key));

function stopSequences(body) {
  const stop = body.stop;
  if (!stop) return null;
  return Array.isArray(stop) ? [...stop] : [stop];
}

/** The body of `client.responses.create` for a workload request (without `stream`). */
export function responsesRequest(spec) {
  const body = spec.body;
  const request = pick(body, (key) => RESPONSES_NAMED.has(key));
  request.input = spec.endpoint === "chat" ? body.messages : body.prompt;
  const limit = maxTokens(body);
  if (limit !== null) request.max_output_tokens = limit;
  return { ...request, ...extra(body, RESPONSES_NAMED) };
}

const isSystem = (message) => message.role === "system" || message.role === "developer";

/** The body of `client.messages.stream` for a workload request. */
export function messagesRequest(spec) {
  const body = spec.body;
  const request = pick(body, (key) => MESSAGES_NAMED.has(key));
  if (spec.endpoint === "chat") {
    const chat = body.messages;
    const system = chat.filter(isSystem).map((m) => String(m.content));
    request.messages = chat.filter((m) => !isSystem(m)).map((m) => ({ role: m.role, content: m.content }));
    if (system.length) request.system = system.join("\n\n");
  } else {
    request.messages = [{ role: "user", content: body.prompt }];
  }
  request.max_tokens = maxTokens(body) ?? DEFAULT_MAX_TOKENS;
  const stop = stopSequences(body);
  if (stop) request.stop_sequences = stop;
  return { ...request, ...extra(body, MESSAGES_NAMED) };
}

/** `streamText` settings for a workload request: the conversation (chat messages are the AI
 * SDK's own shape for text content; a prompt stays a prompt) and the sampling fields the SDK
 * names (`max_tokens` -> `maxOutputTokens`, ...). `limitDefault` fills a missing limit where
 * the API requires one (Messages). The providers check their `providerOptions` against a
 * schema of their own options, so vLLM's extra fields have no way into these requests. */
export function aiSdkSettings(spec, limitDefault = null) {
  const body = spec.body;
  const settings = spec.endpoint === "chat" ? { messages: body.messages } : { prompt: body.prompt };
  const limit = maxTokens(body) ?? limitDefault;
  if (limit !== null) settings.maxOutputTokens = limit;
  if (typeof body.temperature === "number") settings.temperature = body.temperature;
  if (typeof body.top_p === "number") settings.topP = body.top_p;
  if (Number.isInteger(body.seed)) settings.seed = body.seed;
  const stop = stopSequences(body);
  if (stop) settings.stopSequences = stop;
  return settings;
}

/** The server root the Anthropic SDK wants (it appends `/v1/messages` itself). */
export function rootUrl(baseUrl) {
  return baseUrl.replace(/\/+$/, "").replace(/\/v1$/, "");
}

// --- what an event means (core/dialects.py) ------------------------------------------------

export const RESPONSES = "responses";
export const MESSAGES = "messages";

const RESPONSES_TOKENS = {
  "response.output_text.delta": "answer",
  "response.refusal.delta": "answer",
  "response.reasoning_text.delta": "reasoning",
  "response.reasoning_summary_text.delta": "reasoning",
  "response.function_call_arguments.delta": "tool_arguments",
  "response.custom_tool_call_input.delta": "tool_arguments",
  "response.mcp_call_arguments.delta": "tool_arguments",
};
const RESPONSES_TERMINAL = new Set(["response.completed", "response.incomplete", "response.failed"]);
const STATUS_ENDS = { completed: "complete", failed: "error", cancelled: "cancelled" };
const LENGTH_REASONS = new Set(["max_output_tokens", "max_tokens"]);

const MESSAGES_DELTAS = {
  text_delta: ["answer", "text"],
  thinking_delta: ["reasoning", "thinking"],
  input_json_delta: ["tool_arguments", "partial_json"],
};
const STOP_ENDS = { max_tokens: "length", model_context_window_exceeded: "length" };

const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
const textOf = (v) => (typeof v === "string" ? v : "");

function meaning(fields = {}) {
  return { token: null, text: "", end: null, reason: null, last: false, sequence: null, ...fields };
}

function responsesEvent(payload) {
  const kind = payload.type;
  const number = payload.sequence_number;
  const sequence = Number.isInteger(number) ? number : null;
  const token = typeof kind === "string" ? RESPONSES_TOKENS[kind] : undefined;
  if (token !== undefined) {
    const text = textOf(payload.delta);
    return meaning({ token: text ? token : null, text, sequence });
  }
  if (kind === "error") return meaning({ end: "error", reason: "error", last: true, sequence });
  if (!RESPONSES_TERMINAL.has(kind)) return meaning({ sequence });
  const response = isObject(payload.response) ? payload.response : {};
  const status = response.status;
  const why = isObject(response.incomplete_details) ? response.incomplete_details.reason : undefined;
  let end;
  let reason;
  if (status === "incomplete") {
    // Only a token limit is a length cut; any other reason is not the answer the model meant.
    end = LENGTH_REASONS.has(why) ? "length" : "error";
    reason = typeof why === "string" ? why : "incomplete";
  } else {
    const fallback = kind === "response.failed" ? "error" : "complete";
    end = typeof status === "string" ? (STATUS_ENDS[status] ?? fallback) : fallback;
    reason = typeof status === "string" ? status : kind.slice("response.".length);
  }
  return meaning({ end, reason, last: true, sequence });
}

function messagesEvent(payload, name) {
  const kind = payload.type ?? name;
  const delta = payload.delta;
  if (kind === "content_block_delta" && isObject(delta)) {
    const found = MESSAGES_DELTAS[delta.type];
    if (found === undefined) return meaning(); // signature_delta, citations_delta
    const [token, field] = found;
    const text = textOf(delta[field]);
    return meaning({ token: text ? token : null, text });
  }
  if (kind === "message_delta" && isObject(delta)) {
    const stop = delta.stop_reason;
    if (typeof stop === "string") return meaning({ end: STOP_ENDS[stop] ?? "complete", reason: stop });
    return meaning();
  }
  if (kind === "message_stop") return meaning({ last: true });
  if (kind === "error") return meaning({ end: "error", reason: "error", last: true });
  return meaning();
}

/** What one event means in `dialect`: `payload` is its data parsed as JSON (an SDK's event
 * object is that), `name` its SSE `event:` field where the data has no `type`. */
export function readEvent(payload, dialect, name = null) {
  if (!isObject(payload)) return meaning();
  return dialect === RESPONSES ? responsesEvent(payload) : messagesEvent(payload, name);
}
