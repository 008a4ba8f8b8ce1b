/**
 * The arithmetic of pacing calls to a provider, with no I/O: the state one scope (a provider's model behind one
 * address) keeps in the shared store, and what a reservation, an answer and a refusal do to it. The store
 * (rate-limit-store.ts) runs each of these inside one transaction on the store's clock, so every worker of a
 * fleet draws on the same buckets.
 *
 * Each limit is paced as a generic cell rate (GCRA): a limit of L a minute is a bucket refilling at L/60,000 a
 * millisecond, kept as the time its debt clears (`tat`). A call may start once the debt is paid: providers enforce
 * a per-minute limit over shorter stretches ("60 a minute" may be "1 a second"), so calls are spread evenly at the
 * rate instead of spent in a burst the provider refuses.
 */

/** Limits set by the operator (MODEL_RPM, MODEL_TPM, MODEL_MAX_CONCURRENT); unset: learned, or none. */
export interface LimitSettings {
  requestsPerMinute?: number | undefined;
  tokensPerMinute?: number | undefined;
  maxConcurrent?: number | undefined;
}

/** What one answer (or refusal) of the provider said about its limits, read from its headers. */
export interface ProviderLimits {
  requests?: HeardLimit | undefined;
  tokens?: HeardLimit | undefined;
}

/** One limit as an answer's headers give it: its size a minute, what is left, and how long until it is full. */
export interface HeardLimit {
  limit?: number | undefined;
  remaining?: number | undefined;
  resetMs?: number | undefined;
}

/** The state of one scope, kept as JSON in the shared store; times are epoch ms of the store's clock. */
export interface LimitState {
  /** When the requests bucket's debt clears (GCRA's theoretical arrival time). */
  requestsTat: number;
  tokensTat: number;
  /**
   * The same for the calls actually sent, stamped when each is sent (admit): the turns above are a plan, and a
   * worker held up past its turn sends late, perhaps together with the calls after it.
   */
  sentRequestsTat: number;
  sentTokensTat: number;
  /** No call starts before this: a refusal's Retry-After, for the whole fleet. */
  blockedUntil: number;
  /** Limits the provider announced in its headers. */
  learned: { requestsPerMinute?: number | undefined; tokensPerMinute?: number | undefined };
  /**
   * A provider that announces no limits refused calls: the rate they showed (a little under the calls that got
   * through in the minute before), and when. It climbs back while no refusal comes (inferredRate); an operator's
   * MODEL_RPM replaces it.
   */
  inferred?: { requestsPerMinute: number; at: number } | null;
  /** Whether the provider's answers carry limit headers: null until the first answer. */
  headersSeen: boolean | null;
  /** While nothing is known of the limits, one call at a time goes first to learn them (until this time). */
  probeUntil: number;
  /** After an "overloaded" answer: the rate starts at `factor` of the limit at `from` and climbs back over RAMP_MS. */
  ramp: { from: number; factor: number } | null;
  /**
   * The calls of the fleet sent and not yet ended (each until its hold's lease, should its worker die): the calls
   * in flight that MODEL_MAX_CONCURRENT caps, counted as each is sent (admit).
   */
  inFlight?: { nonce: string; until: number }[];
  /** Start times of the calls granted in the last minute: the calls a minute shown beside the limit. */
  recent: number[];
  /** Refusals (429) and "overloaded" answers since the scope was first used. */
  refusals: number;
  overloads: number;
  /** Characters of prompt per input token, learned from the answers' usage. */
  charsPerToken: number;
}

/** A call's cost as reserved: one request and its estimated tokens (the prompt's and the most it may answer). */
export interface CallCost {
  tokens: number;
}

export type Reservation =
  /** Start at `startAt` (store clock); `probe` when it goes first to learn the limits. */
  | { kind: 'granted'; startAt: number; probe: boolean; state: LimitState }
  /** Nothing reserved: look again in `retryInMs` (another call is learning the limits, or the fleet is at its cap). */
  | { kind: 'busy'; retryInMs: number; why: 'probe' | 'concurrency' };

/** A probe that never reports (its worker died) stops holding the others back after this. */
export const PROBE_LEASE_MS = 30_000;
/** How long the fleet takes to climb back to the full rate after an "overloaded" answer. */
export const RAMP_MS = 30_000;
/** The first rate after an "overloaded" answer, as a fraction of the limit. */
const RAMP_START = 0.25;
/** The wait after a refusal or an overload that named none. */
const DEFAULT_BACKOFF_MS = 1_000;
/** How fast a rate refusals showed climbs back while no refusal comes: it doubles this often, ... */
const INFERRED_DOUBLING_MS = 10_000;
/** ... and is gone after this many doublings (a minute). */
const INFERRED_DOUBLINGS = 6;
/**
 * The calls of the last minute a refusal must follow to show a rate: one refusal of the first calls says the
 * provider was busy then, not that it allows one call a minute; it is waited out (its Retry-After) and no more.
 */
const INFERRED_MIN_CALLS = 5;
/** Prompt characters a token until answers say otherwise (OpenAI's rule of thumb for English; code runs fewer). */
export const INITIAL_CHARS_PER_TOKEN = 4;
const RECENT_WINDOW_MS = 60_000;
const RECENT_MAX = 5_000;

export function freshState(now: number): LimitState {
  return {
    requestsTat: now,
    tokensTat: now,
    sentRequestsTat: now,
    sentTokensTat: now,
    blockedUntil: 0,
    learned: {},
    headersSeen: null,
    probeUntil: 0,
    ramp: null,
    recent: [],
    refusals: 0,
    overloads: 0,
    charsPerToken: INITIAL_CHARS_PER_TOKEN,
  };
}

/**
 * The limits in force at `at`: the lower of the operator's and the provider's announced ones, each where known;
 * with neither for requests, the rate refusals showed, as it has climbed back by then.
 */
export function effectiveLimits(
  state: LimitState,
  settings: LimitSettings,
  at: number,
): { requestsPerMinute?: number; tokensPerMinute?: number } {
  const lower = (a: number | undefined, b: number | undefined): number | undefined =>
    a === undefined ? b : b === undefined ? a : Math.min(a, b);
  const requestsPerMinute =
    lower(settings.requestsPerMinute, state.learned.requestsPerMinute) ?? inferredRate(state, at);
  const tokensPerMinute = lower(settings.tokensPerMinute, state.learned.tokensPerMinute);
  return {
    ...(requestsPerMinute === undefined ? {} : { requestsPerMinute }),
    ...(tokensPerMinute === undefined ? {} : { tokensPerMinute }),
  };
}

/**
 * A rate refusals showed, as it stands at `at`: it doubles every INFERRED_DOUBLING_MS without a refusal (the fleet
 * probes upward), and is gone after INFERRED_DOUBLINGS of them, the provider unpaced again until it refuses.
 */
function inferredRate(state: LimitState, at: number): number | undefined {
  const inferred = state.inferred;
  if (inferred === null || inferred === undefined) return undefined;
  const climbed = Math.max(0, at - inferred.at) / INFERRED_DOUBLING_MS;
  return climbed >= INFERRED_DOUBLINGS ? undefined : inferred.requestsPerMinute * 2 ** climbed;
}

/**
 * A stored state as this code reads it: before `inferred`, a rate refusals showed was kept with the announced ones,
 * for good; it is taken as inferred long ago, so it has climbed back.
 */
export function upgradedState(state: LimitState): LimitState {
  if (state.inferred !== undefined || state.headersSeen !== false) return state;
  const { requestsPerMinute, ...announced } = state.learned;
  if (requestsPerMinute === undefined) return { ...state, inferred: null };
  return { ...state, learned: announced, inferred: { requestsPerMinute, at: 0 } };
}

/** The fraction of the limit the fleet may use at `now`: below 1 while it climbs back after an overload. */
function rampFactor(state: LimitState, now: number): number {
  if (state.ramp === null) return 1;
  const climbed = Math.max(0, now - state.ramp.from) / RAMP_MS;
  return Math.min(1, state.ramp.factor + (1 - state.ramp.factor) * climbed);
}

/**
 * Reserves a start time for one call of `cost`, `inFlight` calls of the fleet being under way. Calls queue: each
 * reservation moves the buckets' debt on, so the next call is given the next free time, and waiters never return
 * together. The caller waits until `startAt` (on its own clock: the difference from `now` is what counts).
 */
export function reserve(
  previous: LimitState,
  now: number,
  cost: CallCost,
  settings: LimitSettings,
  inFlight: number,
): Reservation {
  const state = structuredClone(previous);
  const { maxConcurrent } = settings;
  if (maxConcurrent !== undefined && inFlight >= maxConcurrent) {
    return { kind: 'busy', retryInMs: 250, why: 'concurrency' };
  }
  // A rate still climbing back is taken as it will be where this turn falls, after the turns already given.
  const limits = effectiveLimits(state, settings, Math.max(now, state.blockedUntil, state.requestsTat));
  const unknown =
    limits.requestsPerMinute === undefined &&
    limits.tokensPerMinute === undefined &&
    state.headersSeen !== false;
  // Nothing known of the limits yet (or again, after an overload with no limits known): one call goes first and
  // its answer's headers tell the rest, instead of a window's worth of calls meeting a limit nobody knows.
  if (unknown && (state.headersSeen === null || state.ramp !== null)) {
    if (state.probeUntil > now) return { kind: 'busy', retryInMs: 500, why: 'probe' };
    state.probeUntil = now + PROBE_LEASE_MS;
  }
  let startAt = Math.max(now, state.blockedUntil);
  const factor = rampFactor(state, startAt);
  const paced = (perMinute: number | undefined, tat: number, units: number): number => {
    if (perMinute === undefined) return tat;
    const perMs = (perMinute * factor) / 60_000;
    // A call may go while the debt leaves room for it in half of one second's worth of the limit: providers hold a
    // per-minute limit over shorter stretches ("60 a minute" may be "1 a second"), so calls are spread out, and the
    // other half is slack for calls that leave later than their turn (a busy worker, a slow store).
    const room = Math.max(0, (perMs * 1_000) / 2 - units);
    startAt = Math.max(startAt, tat - room / perMs);
    return perMs;
  };
  const tokens = pacedTokens(cost, limits.tokensPerMinute);
  const requestRate = paced(limits.requestsPerMinute, state.requestsTat, 1);
  const tokenRate = paced(limits.tokensPerMinute, state.tokensTat, tokens);
  if (limits.requestsPerMinute !== undefined)
    state.requestsTat = Math.max(state.requestsTat, startAt) + 1 / requestRate;
  if (limits.tokensPerMinute !== undefined)
    state.tokensTat = Math.max(state.tokensTat, startAt) + tokens / tokenRate;
  // The ramp ends when its 30 s have passed, not when some turn falls past them: a call queued again behind many
  // others gets a late turn, and the sends in between are still held to the ramp (admit).
  if (state.ramp !== null && rampFactor(state, now) >= 1) state.ramp = null;
  state.recent = [...state.recent.filter((t) => t > now - RECENT_WINDOW_MS), startAt].slice(-RECENT_MAX);
  return { kind: 'granted', startAt, probe: unknown && state.probeUntil > now, state };
}

/**
 * The tokens a call is paced at. One estimated above the whole tokens-a-minute limit is one a provider enforcing it
 * refuses outright (OpenAI's "Request too large") or admits only with a full bucket: it waits for a full second's
 * bucket but moves the queue by that second alone, so a call that fails at once does not push every call behind
 * it a minute or more out. Where the provider takes it, its answer's count moves the queue by what it really cost.
 */
function pacedTokens(cost: CallCost, tokensPerMinute: number | undefined): number {
  return tokensPerMinute !== undefined && cost.tokens > tokensPerMinute ? tokensPerMinute / 60 : cost.tokens;
}

/** How soon a call held back by the cap on calls in flight looks again. */
const CONCURRENCY_RETRY_MS = 250;

/** The seconds' worth of a limit the provider's buckets are taken to hold (a per-minute limit held a second). */
const GRAIN_MS = 1_000;

/**
 * Whether a call may be sent now, its turn come: the fleet's sends so far, stamped on the store's clock when each
 * went, must leave room for it in a bucket holding one second's worth of each limit (a larger call needs the full
 * bucket), as the provider's own short buckets are held. The queue of turns plans the calls apart; this checks the
 * plan was kept, since a worker held up past its turn (a long pause, a slow store) sends late, together with the
 * calls whose turns fell in the delay. `wait` says how long until the call would fit.
 */
export function admit(
  previous: LimitState,
  now: number,
  cost: CallCost,
  settings: LimitSettings,
  call?: { nonce: string; until: number },
): { kind: 'send'; state: LimitState } | { kind: 'wait'; waitMs: number } {
  const state = structuredClone(previous);
  const inFlight = (state.inFlight ?? []).filter((c) => c.until > now && c.nonce !== call?.nonce);
  // The cap on calls in flight is checked here, as the call is sent: turns are a plan, and calls whose turns came
  // while others were still under way would all go at once.
  if (settings.maxConcurrent !== undefined && inFlight.length >= settings.maxConcurrent)
    return { kind: 'wait', waitMs: CONCURRENCY_RETRY_MS };
  const limits = effectiveLimits(state, settings, now);
  const factor = rampFactor(state, now);
  let sendAt = Math.max(now, state.blockedUntil);
  const fit = (perMinute: number | undefined, tat: number, units: number): number | undefined => {
    if (perMinute === undefined) return undefined;
    const perMs = (perMinute * factor) / 60_000;
    const capacity = perMs * GRAIN_MS;
    // Full when the debt is paid (tat <= now); the call fits once the debt leaves min(units, capacity) free.
    sendAt = Math.max(sendAt, tat - (capacity - Math.min(units, capacity)) / perMs);
    return perMs;
  };
  const tokens = pacedTokens(cost, limits.tokensPerMinute);
  const requestRate = fit(limits.requestsPerMinute, state.sentRequestsTat, 1);
  const tokenRate = fit(limits.tokensPerMinute, state.sentTokensTat, tokens);
  if (sendAt > now) return { kind: 'wait', waitMs: Math.ceil(sendAt - now) };
  if (requestRate !== undefined)
    state.sentRequestsTat = Math.max(state.sentRequestsTat, now) + 1 / requestRate;
  if (tokenRate !== undefined) state.sentTokensTat = Math.max(state.sentTokensTat, now) + tokens / tokenRate;
  state.inFlight = call === undefined ? inFlight : [...inFlight, call];
  return { kind: 'send', state };
}

/** The state with the call `nonce` no longer in flight (it ended). */
export function landed(state: LimitState, nonce: string): LimitState {
  if (state.inFlight === undefined) return state;
  return { ...state, inFlight: state.inFlight.filter((c) => c.nonce !== nonce) };
}

/** A granted call that ended: with the provider's answer (paid), its refusal, or no word at all (failed, cut off). */
export type CallEnd =
  | {
      kind: 'answered';
      reservedTokens: number;
      usedTokens: number;
      limits: ProviderLimits;
      elapsedMs: number;
    }
  | {
      kind: 'refused';
      overloaded: boolean;
      retryAfterMs: number | undefined;
      limits: ProviderLimits;
      /** From sending the call to its answer, on the caller's clock (only durations cross between clocks). */
      elapsedMs: number;
    }
  | { kind: 'unanswered' };

/**
 * What an ended call teaches the scope: the limits the headers announce, and the provider's own count of what is
 * left. The turns already given (the queue, from `queueStart` on) keep their spacing and move together by `shift`:
 * to the time the provider's count says the first of them may go (its debt when the call arrived, less what has
 * refilled since, plus what this fleet has sent since: `sentSince`), earlier or later, which takes in whatever the
 * provider counts differently (the answer's cap kept or refunded, its own token count, another client on the key).
 * Without a count, the tokens reserved are settled against those the answer used (both ways: a provider that
 * counts usage gives back the unused cap). A refusal holds every caller of the fleet back for its Retry-After; an
 * "overloaded" answer also makes the fleet climb back to its rate instead of returning at once.
 */
export function settle(
  previous: LimitState,
  now: number,
  end: CallEnd,
  settings: LimitSettings,
  sentSince: SentSince = { requests: 0, tokens: 0 },
  queueStart?: number,
): { state: LimitState; shift: number } {
  const state = structuredClone(previous);
  state.probeUntil = 0;
  if (end.kind === 'unanswered') return { state, shift: 0 };
  learn(state, end.limits);
  const limits = effectiveLimits(state, settings, now);
  const elapsed = Math.max(0, end.elapsedMs);
  const drained = (
    heard: HeardLimit | undefined,
    perMinute: number | undefined,
    sent: number,
  ): number | undefined => {
    if (perMinute === undefined || heard === undefined) return undefined;
    const perMs = perMinute / 60_000;
    const owed = owedOf(heard, perMinute);
    if (owed === undefined) return undefined;
    const debt = Math.max(0, owed - elapsed * perMs);
    return now + (debt + sent) / perMs;
  };
  const requests = drained(end.limits.requests, limits.requestsPerMinute, sentSince.requests);
  const tokens = drained(end.limits.tokens, limits.tokensPerMinute, sentSince.tokens);
  const settled =
    end.kind === 'answered' && tokens === undefined && limits.tokensPerMinute !== undefined
      ? (end.usedTokens - end.reservedTokens) / (limits.tokensPerMinute / 60_000)
      : 0;
  // The sends' bucket takes the provider's count where it gave one, else the answer's own tokens.
  if (requests !== undefined) state.sentRequestsTat = requests;
  if (tokens !== undefined) state.sentTokensTat = tokens;
  else state.sentTokensTat += settled;
  let shift = 0;
  if (queueStart === undefined) {
    if (requests !== undefined) state.requestsTat = requests;
    if (tokens !== undefined) state.tokensTat = tokens;
    state.tokensTat += settled;
  } else {
    const earliest = Math.max(requests ?? -Infinity, tokens ?? -Infinity);
    shift = Number.isFinite(earliest) ? earliest - queueStart : settled;
  }
  if (end.kind === 'refused') {
    const wait = end.retryAfterMs ?? DEFAULT_BACKOFF_MS;
    state.blockedUntil = Math.max(state.blockedUntil, now + wait);
    if (queueStart !== undefined) shift = Math.max(shift, state.blockedUntil - queueStart);
    if (end.overloaded) {
      state.overloads++;
      state.ramp = { from: now + wait, factor: RAMP_START };
    } else {
      state.refusals++;
      // A provider that announces no limits has just shown one: pace at a little under what got through, once
      // enough went through to show a rate (then climbing back while no refusal comes).
      const announced =
        settings.requestsPerMinute ??
        settings.tokensPerMinute ??
        state.learned.requestsPerMinute ??
        state.learned.tokensPerMinute;
      const lastMinute = state.recent.filter((t) => t > now - RECENT_WINDOW_MS).length;
      if (announced === undefined && lastMinute >= INFERRED_MIN_CALLS) {
        state.inferred = { requestsPerMinute: Math.max(1, Math.floor(lastMinute * 0.8)), at: now };
      }
    }
  }
  if (queueStart !== undefined) {
    // The queue never moves to before now; turns given from here on come after it, wherever it went.
    shift = Math.max(shift, now - queueStart);
    state.requestsTat += shift;
    state.tokensTat += shift;
  }
  return { state, shift };
}

/**
 * What the provider's count says this fleet owes one limit, in units of `perMinute` (the limit in force). A reset
 * that agrees with what is left (the limit less `remaining`, within rounding) is a bucket's time until full at the
 * rate, its debt to the millisecond; what is left, in whole units, says it only to within one. A reset further off
 * than the count explains is a window whose whole limit comes back at once when it ends (a fixed minute: 59 of 60
 * left, back in 59.4 s), or a figure about something longer (OpenAI's own example: 149,984 of 150,000 tokens left,
 * back in 6m0s): what is left must then last until the reset, at most a minute off for a per-minute limit, and
 * only what the rate would send beyond it is owed.
 */
function owedOf(heard: HeardLimit, perMinute: number): number | undefined {
  const limit = heard.limit ?? perMinute;
  const counted = heard.remaining === undefined ? undefined : Math.max(0, limit - heard.remaining);
  if (heard.resetMs === undefined) return counted;
  const untilReset = Math.min(heard.resetMs, 60_000);
  const fromReset = (untilReset * limit) / 60_000;
  if (counted === undefined || heard.remaining === undefined) return (untilReset * perMinute) / 60_000;
  const slack = Math.max(1, limit * 0.01);
  if (fromReset <= counted + slack && fromReset >= counted - 1 - slack)
    return (untilReset * perMinute) / 60_000;
  return (Math.max(0, fromReset - heard.remaining) * perMinute) / limit;
}

/** Calls this fleet sent after the call being settled arrived (their turns came after its): requests and tokens. */
export interface SentSince {
  requests: number;
  tokens: number;
}

/** Takes the limits a provider announced; `headersSeen` says whether its answers carry any. */
function learn(state: LimitState, limits: ProviderLimits): void {
  const requests = limits.requests?.limit;
  const tokens = limits.tokens?.limit;
  if (requests !== undefined && requests > 0) state.learned.requestsPerMinute = requests;
  if (tokens !== undefined && tokens > 0) state.learned.tokensPerMinute = tokens;
  const any = limits.requests !== undefined || limits.tokens !== undefined;
  if (any) state.headersSeen = true;
  else if (state.headersSeen === null) state.headersSeen = false;
}

/** Learns the prompt's characters a token from an answer's usage (a running average, kept within sane bounds). */
export function calibrate(previous: number, promptChars: number, inputTokens: number): number {
  if (inputTokens <= 0 || promptChars <= 0) return previous;
  const seen = Math.min(8, Math.max(1.5, promptChars / inputTokens));
  return previous * 0.8 + seen * 0.2;
}

/** Estimated tokens of a call: its prompt at the learned characters a token, plus the most it may answer. */
export function estimateTokens(promptChars: number, maxOutputTokens: number, charsPerToken: number): number {
  return Math.ceil(promptChars / charsPerToken) + maxOutputTokens;
}

/** Calls granted in the last minute, for the progress line beside the limit. */
export function callsLastMinute(state: LimitState, now: number): number {
  return state.recent.filter((t) => t > now - RECENT_WINDOW_MS && t <= now).length;
}

/** Reads a number header; undefined when absent or not a number. */
function numberHeader(headers: Headers, name: string): number | undefined {
  const raw = headers.get(name);
  if (raw === null || raw.trim() === '') return undefined;
  const value = Number(raw);
  return Number.isFinite(value) ? value : undefined;
}

/**
 * The limits an answer's headers announce: OpenAI's `x-ratelimit-{limit,remaining}-{requests,tokens}`, or
 * Anthropic's `anthropic-ratelimit-{requests,tokens}-{limit,remaining}` (its input-tokens pair where the combined
 * one is absent). Both count a minute.
 */
export function limitsFromHeaders(headers: Headers): ProviderLimits {
  const pair = (limit: string, remaining: string, reset?: string): HeardLimit | undefined => {
    const l = numberHeader(headers, limit);
    const r = numberHeader(headers, remaining);
    const resetMs = reset === undefined ? undefined : durationMs(headers.get(reset));
    if (l === undefined && r === undefined) return undefined;
    return { limit: l, remaining: r, ...(resetMs === undefined ? {} : { resetMs }) };
  };
  const requests =
    pair('x-ratelimit-limit-requests', 'x-ratelimit-remaining-requests', 'x-ratelimit-reset-requests') ??
    pair('anthropic-ratelimit-requests-limit', 'anthropic-ratelimit-requests-remaining');
  const tokens =
    pair('x-ratelimit-limit-tokens', 'x-ratelimit-remaining-tokens', 'x-ratelimit-reset-tokens') ??
    pair('anthropic-ratelimit-tokens-limit', 'anthropic-ratelimit-tokens-remaining') ??
    pair('anthropic-ratelimit-input-tokens-limit', 'anthropic-ratelimit-input-tokens-remaining');
  return {
    ...(requests === undefined ? {} : { requests }),
    ...(tokens === undefined ? {} : { tokens }),
  };
}

/** OpenAI's reset durations (Go's form: `120ms`, `1s`, `2.183s`, `6m0s`, `1h2m3s`) in milliseconds. */
export function durationMs(raw: string | null): number | undefined {
  if (raw === null) return undefined;
  const text = raw.trim();
  if (!/^(\d+(\.\d+)?(h|m|s|ms|us|µs|ns))+$/.test(text)) return undefined;
  const unit: Record<string, number> = {
    h: 3_600_000,
    m: 60_000,
    s: 1_000,
    ms: 1,
    us: 0.001,
    µs: 0.001,
    ns: 1e-6,
  };
  let ms = 0;
  for (const [, n, u] of text.matchAll(/(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)/g))
    ms += Number(n) * (unit[u ?? ''] ?? 0);
  return ms;
}
