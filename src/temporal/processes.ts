import fs from 'node:fs';
import path from 'node:path';

/**
 * A process as /proc shows it. The ID alone does not name a process for long: the system gives it to another one
 * once this one has ended, so the start time and the command line come with it, to tell the two apart.
 */
export interface ProcessIdentity {
  pid: number;
  startTime: string;
  command: string;
}

/**
 * The identity of the live process `pid`, read from /proc: its start time (field 22 of /proc/<pid>/stat, clock
 * ticks since boot) and its command line. Undefined when it is gone, a zombie, or the system has no /proc (then no
 * pid file is written or trusted, and a server left behind is used but not stopped).
 */
export function processRecord(pid: number): ProcessIdentity | undefined {
  if (process.platform !== 'linux') return undefined;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Field 2 is the command name in parentheses, which may hold spaces and ')': count from the last ')'.
    const startTime = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[22 - 3];
    const command = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0$/, '').replaceAll('\0', ' ');
    return startTime !== undefined && command !== '' ? { pid, startTime, command } : undefined;
  } catch {
    return undefined;
  }
}

/** True while `record` names a live process that is still the one recorded. */
export function stillRunning(record: ProcessIdentity): boolean {
  const now = processRecord(record.pid);
  return now?.startTime === record.startTime && now.command === record.command;
}

/**
 * The identity of a process just spawned. `spawn` returns when the child's exec has closed its inherited
 * descriptors, a moment before the kernel fills in the new program's command line: read then, /proc shows an empty
 * one. Waits (up to `waitMs`) for it while the process lives; undefined once it is gone.
 */
export async function execedProcessRecord(
  pid: number,
  {
    waitMs = 2_000,
    read = processRecord,
  }: { waitMs?: number; read?: (pid: number) => ProcessIdentity | undefined } = {},
): Promise<ProcessIdentity | undefined> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const record = read(pid);
    if (record !== undefined || !fs.existsSync(`/proc/${pid}`) || Date.now() > deadline) return record;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/**
 * The process listening on TCP `port` (any address), read from /proc: the socket's inode in /proc/net/tcp{,6}, then
 * the process holding a descriptor to it. Undefined off Linux, or when the process belongs to another user.
 */
export function listenerOn(port: number): { pid: number; command: string } | undefined {
  if (process.platform !== 'linux') return undefined;
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  const inodes = new Set<string>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = fs.readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      const local = fields[1];
      // State 0A is LISTEN; field 10 is the socket's inode.
      if (local?.endsWith(`:${hexPort}`) && fields[3] === '0A' && fields[9] !== undefined)
        inodes.add(fields[9]);
    }
  }
  if (inodes.size === 0) return undefined;
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let fds: string[];
    try {
      fds = fs.readdirSync(path.join('/proc', entry, 'fd'));
    } catch {
      continue;
    }
    for (const fd of fds) {
      let target: string;
      try {
        target = fs.readlinkSync(path.join('/proc', entry, 'fd', fd));
      } catch {
        continue;
      }
      const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
      if (inode !== undefined && inodes.has(inode)) {
        const pid = Number(entry);
        return { pid, command: processRecord(pid)?.command ?? '?' };
      }
    }
  }
  return undefined;
}
