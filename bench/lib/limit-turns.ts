/**
 * One handle on the store taking turns, for `npm run bench:limits`: a process of its own, as a worker is, on the
 * store its environment names (DATA_DIR's SQLite file, or DATABASE_URL). It takes `--warmup` turns, says `ready`,
 * waits for a line on stdin (so that every handle starts together), then takes `--turns` turns as a model call
 * takes them (Pacer.run): the scope's characters a token read, SqlRateLimits.reserve, and SqlRateLimits.end with
 * an answer's limit headers. It prints the milliseconds of each, and the seconds of them all, as one line of JSON.
 */
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import { loadConfig } from '../../src/config';
import { runMain } from '../../src/lib/run-main';
import type { CallEnd } from '../../src/model/rate-limit';
import { openStores } from '../../src/store/open';
import type { Stores } from '../../src/store/open';
import type { TurnTimes } from '../limits';

/** A scope that every handle shares, as every worker of a fleet shares its provider's. */
const SCOPE = 'openai-compatible/bench at http://127.0.0.1';
/** A provider whose limits never make a call wait: the time measured is the store's alone. */
const ANSWER: CallEnd = {
  kind: 'answered',
  reservedTokens: 1_000,
  usedTokens: 800,
  limits: {
    requests: { limit: 1_000_000, remaining: 999_999 },
    tokens: { limit: 1_000_000_000, remaining: 999_999_000 },
  },
  elapsedMs: 100,
};

async function takeTurns(stores: Stores, handle: string, count: number, into?: TurnTimes): Promise<void> {
  const limits = stores.rateLimits;
  for (let i = 0; i < count; i++) {
    const holdKey = `${handle}:${i}`;
    const started = performance.now();
    await limits.charsPerToken(SCOPE);
    const read = performance.now();
    const turn = await limits.reserve(
      { scope: SCOPE, holdKey, tokens: 1_000, usd: 0, workflowId: 'bench', leaseMs: 180_000 },
      {},
    );
    const reserved = performance.now();
    if (turn.kind === 'busy') {
      if (into !== undefined) into.busy++;
      i--;
      await new Promise((resolve) => setTimeout(resolve, turn.retryInMs));
      continue;
    }
    if (turn.kind !== 'granted') throw new Error(`turn ${holdKey}: ${turn.kind}`);
    await limits.end(SCOPE, { holdKey, nonce: turn.nonce }, ANSWER, {}, { tokens: 800, usd: 0 });
    const ended = performance.now();
    into?.read.push(read - started);
    into?.reserve.push(reserved - read);
    into?.end.push(ended - reserved);
  }
}

runMain(async () => {
  const { values } = parseArgs({
    options: {
      handle: { type: 'string', default: 'h1' },
      turns: { type: 'string', default: '300' },
      warmup: { type: 'string', default: '30' },
    },
  });
  const stores = await openStores(loadConfig());
  try {
    await takeTurns(stores, `${values.handle}:warmup`, Number(values.warmup));
    console.log('ready');
    await once(process.stdin, 'data');
    const times: TurnTimes = { read: [], reserve: [], end: [], busy: 0, seconds: 0 };
    const started = performance.now();
    await takeTurns(stores, values.handle, Number(values.turns), times);
    times.seconds = (performance.now() - started) / 1000;
    console.log(JSON.stringify(times));
  } finally {
    await stores.close();
  }
});
