import fs from 'node:fs';
import { z } from 'zod';
import { execedProcessRecord, stillRunning } from './processes';
import type { ProcessIdentity } from './processes';

/**
 * What the embedded server's pid file (DATA_DIR/temporal-server.pid) holds: the server's identity (ID, start time,
 * command line), and `owner`, the process that started it (`npm start`, `npm run server`): while the owner lives
 * the server is in use, once it is gone the server was left behind.
 */
const IdentitySchema = z.object({
  pid: z.number().int().positive(),
  startTime: z.string(),
  command: z.string(),
});
const ProcessRecordSchema = IdentitySchema.extend({ owner: IdentitySchema.optional() });
export type ProcessRecord = z.infer<typeof ProcessRecordSchema>;

/** True while the process that started the recorded server is alive (a record without an owner has none). */
export function ownerAlive(record: ProcessRecord): boolean {
  return record.owner !== undefined && stillRunning(record.owner);
}

/**
 * Writes the pid file of the embedded server while it runs, so a later run can stop one left behind, and only that
 * one. Nothing is written for a process that is gone.
 */
export async function writePidFile(file: string, pid: number, owner?: ProcessIdentity): Promise<void> {
  const record = await execedProcessRecord(pid);
  if (record === undefined) return;
  const { pid: ownerPid, startTime, command } = owner ?? {};
  const withOwner =
    ownerPid !== undefined && startTime !== undefined && command !== undefined
      ? { ...record, owner: { pid: ownerPid, startTime, command } }
      : record;
  fs.writeFileSync(file, JSON.stringify(withOwner));
}

/**
 * The embedded server recorded in `file`, if that very process is still alive: same ID, start time and command.
 * A file that names another process (its ID reused), a dead one, or is in the old format (a bare ID) is removed,
 * and undefined returned: nothing is ever signalled on its word.
 */
export function recordedProcess(file: string): ProcessRecord | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch {
    parsed = undefined;
  }
  const record = ProcessRecordSchema.safeParse(parsed);
  if (record.success && stillRunning(record.data)) return record.data;
  fs.rmSync(file, { force: true });
  return undefined;
}

/**
 * SIGTERM, then wait (up to 10 s) until the process is gone; removes its pid file. Checked again just before the
 * signal: the run may have lasted hours, long enough for the server to end and its ID to go to another process.
 */
export async function stopProcess(record: ProcessRecord, file: string): Promise<void> {
  fs.rmSync(file, { force: true });
  if (!stillRunning(record)) return;
  try {
    process.kill(record.pid, 'SIGTERM');
  } catch {
    return;
  }
  for (let waited = 0; waited < 10_000 && stillRunning(record); waited += 100) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
