/**
 * A worker whose connection goes silent while it holds a provider's pacing row, for test/rate-limit-edges.test.ts:
 * it opens PostgreSQL at argv[2] as a worker does, locks the row of the scope argv[3] in a transaction, says
 * "locked" and stops itself (SIGSTOP), as a frozen host or a partition leaves its session: idle in transaction,
 * holding the lock. The test kills it.
 */
import { sql } from 'kysely';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';

async function run(): Promise<void> {
  const [url, scope] = process.argv.slice(2);
  if (url === undefined || scope === undefined) throw new Error('usage: pacing-lock-holder <url> <scope>');
  const db = postgresSql(await openPostgres(url));
  await db.transaction(async (tx) => {
    await tx.first(sql`SELECT state FROM model_limits WHERE scope = ${scope} FOR UPDATE`);
    process.stdout.write('locked\n');
    process.kill(process.pid, 'SIGSTOP');
    await new Promise(() => undefined);
  });
}

run().catch((err: unknown) => {
  process.stderr.write(`${String(err)}\n`);
  process.exit(1);
});
