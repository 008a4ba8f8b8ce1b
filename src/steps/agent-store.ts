import { sql } from 'kysely';
import { jsonOf, safeToRepeat } from '../store/sql';
import type { Sql } from '../store/sql';

/**
 * An agent step's checkpoints, beside the memo (its database, either backend): each turn's conversation as it was
 * sent to the model, and each tool call's output, so the workflow's history carries their keys and never their
 * text. A key is written once: a retry of the turn or call that wrote it writes the same body (the conversation
 * is rebuilt from the previous checkpoint and the tools' outputs, which are fixed) and keeps the first.
 */
export class SqlAgentCheckpoints {
  constructor(private readonly db: Sql) {}

  /** Stores `body` under `key` unless the key holds one already; returns the key. Durable when it resolves. */
  async put(key: string, workflowId: string, step: string, body: unknown): Promise<string> {
    const json = JSON.stringify(body);
    // Safe to repeat: a repeat after it committed inserts nothing, and the first body stays.
    await this.db.run(
      safeToRepeat(
        sql`INSERT INTO agent_checkpoints (checkpoint_key, workflow_id, step, body, chars, created_at)
          VALUES (${key}, ${workflowId}, ${step}, ${json}, ${json.length}, ${this.db.now()})
          ON CONFLICT (checkpoint_key) DO NOTHING`,
      ),
    );
    return key;
  }

  /** The body stored under `key`, or undefined. */
  async get(key: string): Promise<unknown> {
    const row = await this.db.first(
      sql<{ body: unknown }>`SELECT body FROM agent_checkpoints WHERE checkpoint_key = ${key}`,
    );
    return row === undefined ? undefined : jsonOf(row.body);
  }
}
