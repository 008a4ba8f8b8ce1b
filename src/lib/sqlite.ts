import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';

/**
 * Opens (creating if needed) a SQLite file shared safely by several processes: WAL so readers never block the
 * writer, a busy timeout instead of SQLITE_BUSY errors, and FULL sync so a committed row survives a machine crash.
 */
export function openDatabase(file: string): Database.Database {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  db.pragma('busy_timeout = 10000');
  db.pragma('synchronous = FULL');
  return db;
}
