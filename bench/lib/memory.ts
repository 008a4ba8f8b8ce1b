import fs from 'node:fs';

/** Peak resident memory of a live process in MiB (VmHWM in /proc), one decimal; undefined once it is gone. */
export function peakMiB(pid: number): number | undefined {
  try {
    const kib = /VmHWM:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
    return kib === undefined ? undefined : Math.round(Number(kib) / 102.4) / 10;
  } catch {
    return undefined;
  }
}

/**
 * CPU time a live process has used so far, user and system, in ms (from /proc, counted in Linux's USER_HZ, 100
 * a second); undefined once it is gone.
 */
export function cpuMs(pid: number): number | undefined {
  try {
    // The fields after the command name, which is in parentheses and may hold spaces: utime and stime are the
    // 12th and 13th of them.
    const fields = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
    const ticks = Number(fields[11]) + Number(fields[12]);
    return Number.isFinite(ticks) ? (ticks * 1000) / 100 : undefined;
  } catch {
    return undefined;
  }
}
