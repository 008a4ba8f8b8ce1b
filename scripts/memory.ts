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
