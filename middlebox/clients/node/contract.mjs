// The client contract (docs/clients.md) for middlebox's Node clients, shared by every driver.
//
// The same rules as middlebox/clients/contract.py: the four environment variables, the
// workload file (checked as strictly: a violation exits 2 without a result), requests started
// no earlier than `start_after` with at most `concurrency` in flight, the simulated user who
// leaves after `abandon_after_tokens` pieces or `abandon_after_seconds` (closing the
// connection through an AbortSignal), choice 0 only, and the result written atomically (temp
// file in the same directory, fsync, rename) before exiting 0.
//
// A driver exports nothing; it calls `runClient(name, session)` where `session(env)` returns a
// handler `async (spec, rec, signal) => {...}` that runs one logical request, shows pieces
// with `rec.show(text)` and throws what its library surfaced to the user.

import { AsyncLocalStorage } from "node:async_hooks";
import fs from "node:fs";
import path from "node:path";

export const ENDPOINT_PATHS = { chat: "/chat/completions", completions: "/completions" };

export class ContractError extends Error {
  name = "ContractError";
}

/** Thrown by `rec.show` once the user has read enough; never reported as an error. */
export class Abandoned extends Error {
  name = "Abandoned";
}

/** Seconds since the epoch, like Python's time.time(), with sub-millisecond resolution. */
export const now = () => (performance.timeOrigin + performance.now()) / 1000;

export function readEnv(environ = process.env) {
  const missing = ["OPENAI_BASE_URL", "MIDDLEBOX_WORKLOAD", "MIDDLEBOX_RESULT"].filter(
    (name) => !environ[name],
  );
  if (missing.length) {
    throw new ContractError(`missing environment variable(s): ${missing.join(", ")}`);
  }
  const baseUrl = environ.OPENAI_BASE_URL.replace(/\/+$/, "");
  return {
    baseUrl,
    // vLLM without --api-key ignores the key; the openai package refuses to start without one.
    apiKey: environ.OPENAI_API_KEY || "EMPTY",
    workloadPath: environ.MIDDLEBOX_WORKLOAD,
    resultPath: environ.MIDDLEBOX_RESULT,
    url: (endpoint) => baseUrl + ENDPOINT_PATHS[endpoint],
  };
}

const isPositiveInt = (v) => Number.isInteger(v) && v >= 1;
const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);

function requestSpec(raw) {
  if (!isObject(raw)) throw new ContractError(`a request must be an object, got ${JSON.stringify(raw)}`);
  const endpoint = raw.endpoint ?? "chat";
  if (!(endpoint in ENDPOINT_PATHS)) {
    throw new ContractError(`endpoint must be 'chat' or 'completions', got ${JSON.stringify(endpoint)}`);
  }
  if (!Number.isInteger(raw.index)) throw new ContractError(`index must be an int, got ${JSON.stringify(raw.index)}`);
  if (!isObject(raw.body)) throw new ContractError(`request ${raw.index}: body must be an object`);
  const tokens = raw.abandon_after_tokens ?? null;
  const seconds = raw.abandon_after_seconds ?? null;
  if (tokens !== null && !isPositiveInt(tokens)) {
    throw new ContractError(`abandon_after_tokens must be a positive int, got ${JSON.stringify(tokens)}`);
  }
  if (seconds !== null && !(typeof seconds === "number" && seconds > 0)) {
    throw new ContractError(`abandon_after_seconds must be positive, got ${JSON.stringify(seconds)}`);
  }
  return {
    index: raw.index,
    endpoint,
    body: raw.body,
    streaming: Boolean(raw.body.stream),
    startAfter: Number(raw.start_after || 0),
    abandonAfterTokens: tokens,
    abandonAfterSeconds: seconds,
  };
}

export function parseWorkload(raw) {
  if (!isObject(raw) || !Array.isArray(raw.requests)) {
    throw new ContractError("a workload is an object with a 'requests' list");
  }
  const concurrency = raw.concurrency ?? 1;
  if (!isPositiveInt(concurrency)) throw new ContractError(`concurrency must be >= 1, got ${concurrency}`);
  const requests = raw.requests.map(requestSpec);
  if (new Set(requests.map((r) => r.index)).size !== requests.length) {
    throw new ContractError("request indexes must be unique");
  }
  return { scenario: String(raw.scenario ?? ""), concurrency, requests };
}

/** What one logical request showed the user, and when: one result entry. */
export class Recorder {
  constructor(spec) {
    this.spec = spec;
    this.chunks = [];
    this.finishReason = null;
    this.error = null;
    this.usage = null;
    this.attempts = 0;
    this.resumes = 0;
    this.sawDone = false;
    this.abandoned = false;
    this.startedAt = 0;
    this.endedAt = 0;
    this.leave = () => {};
  }

  get text() {
    return this.chunks.map(([, piece]) => piece).join("");
  }

  /** Display a piece now; once the user has read enough, leave (closing the connection). */
  show(piece) {
    // Once the user has left nothing more reaches the screen, whatever the library delivers.
    if (!piece || this.abandoned) return;
    this.chunks.push([now(), piece]);
    const limit = this.spec.abandonAfterTokens;
    if (limit !== null && this.chunks.length >= limit) {
      this.leave();
      throw new Abandoned();
    }
  }

  toJSON() {
    return {
      index: this.spec.index,
      text: this.text,
      finish_reason: this.finishReason,
      error: this.error,
      usage: this.usage,
      chunks: this.chunks,
      started_at: this.startedAt,
      ended_at: this.endedAt,
      attempts: this.attempts,
      resumes: this.resumes,
      saw_done: this.sawDone,
      abandoned: this.abandoned,
    };
  }
}

/** The contract's error string, "Type: message"; Node's fetch hides the socket's reason in
 * `cause` (undici: "TypeError: terminated", cause "SocketError: other side closed"). */
export function describeError(error) {
  if (!(error instanceof Error)) {
    // A library may hand on the server's error object as is (the AI SDK's error part).
    const message = typeof error?.message === "string" ? error.message : JSON.stringify(error);
    return `Error: ${message}`;
  }
  const type = error.constructor?.name && error.constructor.name !== "Error" ? error.constructor.name : error.name;
  let text = error.message ? `${type}: ${error.message}` : type;
  const cause = error.cause;
  if (cause instanceof Error && cause.message && !text.includes(cause.message)) {
    text += ` (${cause.constructor?.name || cause.name}: ${cause.message})`;
  }
  return text;
}

export function writeResult(resultPath, client, records) {
  const payload = {
    client,
    results: [...records].sort((a, b) => a.spec.index - b.spec.index).map((r) => r.toJSON()),
  };
  const dir = path.dirname(path.resolve(resultPath));
  const tmp = path.join(dir, `.${path.basename(resultPath)}.${process.pid}.tmp`);
  const fd = fs.openSync(tmp, "w");
  try {
    fs.writeSync(fd, JSON.stringify(payload));
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, resultPath);
}

// The request whose code is running, so that a library's fetch can count attempts (its own
// retries included) for the right logical request without changing what it sends.
const current = new AsyncLocalStorage();

/** `fetch` as the library would call it, counting each HTTP request for the current one. */
export function countingFetch(input, init) {
  const rec = current.getStore();
  if (rec) rec.attempts += 1;
  return fetch(input, init);
}

/** OpenAI chunk -> what is shown (choice 0), as contract.py's chunk_info. */
export function chunkInfo(obj) {
  const info = { text: "", finishReason: null, usage: null, error: null };
  if (!isObject(obj)) return info;
  if (obj.error) {
    info.error = isObject(obj.error)
      ? String(obj.error.message || "An error occurred during streaming")
      : String(obj.error);
    return info;
  }
  if (isObject(obj.usage)) info.usage = obj.usage;
  for (const choice of Array.isArray(obj.choices) ? obj.choices : []) {
    if (!isObject(choice) || (choice.index ?? 0) !== 0) continue;
    const piece = isObject(choice.delta)
      ? choice.delta.content
      : isObject(choice.message)
        ? choice.message.content
        : choice.text;
    if (typeof piece === "string") info.text += piece;
    if (typeof choice.finish_reason === "string") info.finishReason = choice.finish_reason;
  }
  return info;
}

/** Keep a chunk's finish_reason and usage, then show its text. */
export function applyChunk(rec, info) {
  if (info.finishReason !== null) rec.finishReason = info.finishReason;
  if (info.usage !== null) rec.usage = info.usage;
  rec.show(info.text);
}

async function runOne(spec, rec, handler) {
  const controller = new AbortController();
  let left;
  const gone = new Promise((resolve) => {
    left = resolve;
  });
  rec.leave = () => {
    rec.abandoned = true;
    controller.abort(new Abandoned());
    left();
  };
  const timer = spec.abandonAfterSeconds === null ? null : setTimeout(rec.leave, spec.abandonAfterSeconds * 1000);
  rec.startedAt = now();
  try {
    // Once the user has left, the request is over whatever the library still does with it.
    const running = current.run(rec, () => handler(spec, rec, controller.signal));
    // What the library throws after the user left is nobody's error (and, unawaited, an
    // unhandled rejection would end the process).
    running.catch(() => {});
    await Promise.race([running, gone]);
  } catch (error) {
    if (rec.abandoned || error instanceof Abandoned) rec.abandoned = true;
    else rec.error = describeError(error);
  } finally {
    if (timer !== null) clearTimeout(timer);
    rec.endedAt = now();
  }
}

/** Every request, no earlier than `start_after`, at most `concurrency` in flight, taking free
 * slots in start order. */
export async function runWorkload(workload, handler) {
  const t0 = performance.now();
  const records = workload.requests.map((spec) => new Recorder(spec));
  const queue = [...records].sort((a, b) => a.spec.startAfter - b.spec.startAfter || a.spec.index - b.spec.index);
  let free = workload.concurrency;
  const waiting = [];
  const acquire = () => (free > 0 ? (free--, Promise.resolve()) : new Promise((r) => waiting.push(r)));
  const release = () => (waiting.length ? waiting.shift()() : free++);
  const sleepUntil = (ms) => new Promise((r) => setTimeout(r, Math.max(0, t0 + ms - performance.now())));
  await Promise.all(
    queue.map(async (rec) => {
      await sleepUntil(rec.spec.startAfter * 1000);
      await acquire();
      try {
        await runOne(rec.spec, rec, handler);
      } finally {
        release();
      }
    }),
  );
  return records;
}

/** A driver's main: read the contract, run, write the result, exit (0 once written, 2 on a
 * contract violation, 1 on a crash). Exiting explicitly matters: a library's reconnect timer
 * or a kept-alive socket must not keep the process alive after the result is written. */
export async function runClient(name, session) {
  let env;
  let workload;
  try {
    env = readEnv();
    workload = parseWorkload(JSON.parse(fs.readFileSync(env.workloadPath, "utf8")));
  } catch (error) {
    process.stderr.write(`${name}: ${describeError(error)}\n`);
    process.exit(2);
  }
  try {
    const handler = await session(env);
    const records = await runWorkload(workload, handler);
    writeResult(env.resultPath, name, records);
  } catch (error) {
    process.stderr.write(`${name}: crashed: ${error?.stack ?? error}\n`);
    process.exit(1);
  }
  process.exit(0);
}
