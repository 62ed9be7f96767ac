// idempotent-fetch.js: fetch() that runs a request on the server at most
// once, however often the network makes it retry. For servers protected by
// github.com/onceonly/idempotency; no dependencies, no build step.
//
//   import { idempotentFetch } from '/static/idempotent-fetch.js';
//   const res = await idempotentFetch('/payments', {
//     method: 'POST',
//     headers: { 'Content-Type': 'application/json' },
//     body: JSON.stringify({ amount: 500, currency: 'EUR' }),
//   });
//
// It asks the server for a one-time token (GET /idempotency/token, with the
// session cookie) and sends it as the Idempotency-Key header. When the
// request fails on the network, or is answered 409 or 503 with Retry-After
// (the first attempt is still running; the store was briefly down and
// nothing ran) that is not a replay, it sends the same request with the
// same key again, at most
// `attempts` times in all. A lost answer is thus never a second execution:
// the retry gets the first attempt's stored answer, marked
// Idempotent-Replayed: true.
//
// The body must be sendable twice: a string, Blob, ArrayBuffer, FormData or
// URLSearchParams, not a ReadableStream. Pass options.key to reuse a key
// across calls (the same payment sent again after a page reload must carry
// the key it was first sent with).

export const KEY_HEADER = 'Idempotency-Key';
export const REPLAYED_HEADER = 'Idempotent-Replayed';

const defaults = {
  tokenURL: '/idempotency/token',
  attempts: 5, // in all, the first one included
  baseDelay: 250, // ms before the first retry after a network error; doubles
  maxDelay: 5000, // ms, the longest pause, Retry-After included
};

// newKey fetches a one-time token to use as an idempotency key.
export async function newKey(options = {}) {
  const opts = { ...defaults, ...options };
  const res = await withRetries(
    () => fetch(opts.tokenURL, { credentials: 'same-origin', cache: 'no-store', signal: opts.signal }),
    opts,
  );
  if (!res.ok) {
    throw new Error(`idempotent-fetch: ${opts.tokenURL} answered ${res.status}`);
  }
  return (await res.json()).token;
}

// idempotentFetch is fetch(input, init) with an idempotency key and bounded
// retries. It resolves to the last response, or rejects with the last
// network error once every attempt failed (or at once when init.signal
// aborts).
export async function idempotentFetch(input, init = {}, options = {}) {
  const opts = { ...defaults, signal: init.signal, ...options };
  const key = opts.key ?? (await newKey(opts));
  const headers = new Headers(init.headers);
  headers.set(KEY_HEADER, key);
  return withRetries(() => fetch(input, { credentials: 'same-origin', ...init, headers }), opts);
}

async function withRetries(send, opts) {
  for (let attempt = 1; ; attempt++) {
    let res;
    try {
      res = await send();
    } catch (err) {
      // fetch rejects with a TypeError when the network failed; anything
      // else (an abort above all) is the caller's to handle.
      if (!(err instanceof TypeError) || attempt >= opts.attempts) throw err;
      await pause(backoff(attempt, opts), opts.signal);
      continue;
    }
    if (!retryable(res) || attempt >= opts.attempts) return res;
    res.body?.cancel(); // the answer is only "try again"
    await pause(retryAfter(res, attempt, opts), opts.signal);
  }
}

// retryable: the server says nothing ran yet or the first attempt is still
// running, and when to ask again. A 409 without Retry-After (the key was
// used for a different request, the answer was streamed) stays the same
// however often it is asked, and so does a replayed answer, whatever its
// status: it is the key's stored answer (a handler's own 503 with
// Retry-After, say), and every retry would fetch the same copy.
function retryable(res) {
  if (res.headers.get(REPLAYED_HEADER) === 'true') return false;
  return (res.status === 409 || res.status === 503) && res.headers.has('Retry-After');
}

function retryAfter(res, attempt, opts) {
  const value = res.headers.get('Retry-After');
  let ms = /^\d+$/.test(value) ? Number(value) * 1000 : Date.parse(value) - Date.now();
  if (!(ms >= 0)) ms = backoff(attempt, opts);
  return Math.min(ms, opts.maxDelay);
}

// backoff doubles per attempt, with jitter so that many clients that failed
// together do not retry together.
function backoff(attempt, opts) {
  const ceiling = Math.min(opts.maxDelay, opts.baseDelay * 2 ** (attempt - 1));
  return ceiling / 2 + (Math.random() * ceiling) / 2;
}

function pause(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
