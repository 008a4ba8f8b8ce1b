import type Database from 'better-sqlite3';
import { z } from 'zod';
import { ModelInfoSchema, UsageSchema } from '../contract';
import { openDatabase } from '../lib/sqlite';

const StoredAnswerSchema = z.object({ value: z.unknown(), usage: UsageSchema, model: ModelInfoSchema });
export type StoredAnswer = z.infer<typeof StoredAnswerSchema>;

/**
 * Durable memo of received model answers, keyed by the step's idempotency key. An activity writes the answer
 * here before it returns, so a worker that dies after paying for the answer and before Temporal recorded the
 * step does not pay again: the retry (same run ID, same activity ID, same key) reads it back.
 */
export class AnswerMemo {
  private readonly db: Database.Database;

  constructor(file: string) {
    this.db = openDatabase(file);
    this.db.exec(`CREATE TABLE IF NOT EXISTS model_answers (
      idempotency_key TEXT PRIMARY KEY,
      step TEXT NOT NULL,
      answer TEXT NOT NULL,
      created_at TEXT NOT NULL
    )`);
  }

  /** The answer stored under this key, or undefined. */
  get(key: string): StoredAnswer | undefined {
    const row = this.db.prepare('SELECT answer FROM model_answers WHERE idempotency_key = ?').get(key);
    const parsed = z.object({ answer: z.string() }).safeParse(row);
    if (!parsed.success) return undefined;
    return StoredAnswerSchema.parse(JSON.parse(parsed.data.answer));
  }

  /** Stores an answer; a second write under the same key keeps the first (the one that was paid for). */
  put(key: string, step: string, answer: StoredAnswer): void {
    this.db
      .prepare(
        'INSERT INTO model_answers (idempotency_key, step, answer, created_at) VALUES (?, ?, ?, ?) ' +
          'ON CONFLICT (idempotency_key) DO NOTHING',
      )
      .run(key, step, JSON.stringify(answer), new Date().toISOString());
  }

  /** Number of stored answers (for reports and tests). */
  count(): number {
    const row = z
      .object({ n: z.number() })
      .parse(this.db.prepare('SELECT count(*) AS n FROM model_answers').get());
    return row.n;
  }

  close(): void {
    this.db.close();
  }
}
