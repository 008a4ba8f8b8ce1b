import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';

/**
 * Opens (creating if needed) a SQLite file shared safely by several processes: WAL so readers never block the
 * writer, a busy timeout instead of SQLITE_BUSY errors, and FULL sync so a committed row survives a machine crash.
 * The busy timeout is SQLite's wait for another process's lock, and it blocks this thread: a caller on the event
 * loop gives a short one and waits longer without blocking (see sql-sqlite.ts). A file that fails to open (busy,
 * say) is closed again, nothing kept.
 */
export function openDatabase(file: string, busyTimeoutMs = 10_000): Database.Database {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const db = new Database(file, { timeout: busyTimeoutMs });
  try {
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = FULL');
  } catch (err) {
    db.close();
    throw err;
  }
  return db;
}
