/**
 * The offline model's own thread (see OfflineModel): it answers each request with offline-nlp.ts's scoring, away
 * from the event loop of the process that asked. Only a thread's entry: a module that wants the scoring itself
 * imports offline-nlp.ts, since importing this one inside a thread would answer that thread's requests too.
 */
import { parentPort } from 'node:worker_threads';
import { serveRequests } from '../lib/thread';
import { score } from './offline-nlp';

if (parentPort !== null) serveRequests(parentPort, score);
