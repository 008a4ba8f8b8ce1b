/**
 * The pid file of the embedded Temporal server: a later run stops a server left behind by a killed `npm start`,
 * and never another process that happens to hold the ID now. An unrelated process stands in for the server
 * (`sleep`), and a TCP listener for something answering on the embedded server's port.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { loadConfig } from '../src/config';
import type { Config } from '../src/config';
import { connectOrStartTemporal } from '../src/temporal/choose-server';
import { recordedProcess, writePidFile } from '../src/temporal/pid-file';
import { execedProcessRecord, processRecord } from '../src/temporal/processes';
import { cleanupAfterAll, freePort, scratchDir } from './scratch';

const defer = cleanupAfterAll();

/** A live process that is not a Temporal server, killed after the file's tests if still running. */
function unrelatedProcess(): { child: ChildProcess; pid: number; exited: Promise<NodeJS.Signals | null> } {
  const child = spawn('sleep', ['30'], { stdio: 'ignore' });
  const exited = new Promise<NodeJS.Signals | null>((resolve) =>
    child.once('exit', (_, signal) => resolve(signal)),
  );
  defer(() => {
    child.kill('SIGKILL');
  });
  assert.ok(child.pid !== undefined, 'sleep did not start');
  return { child, pid: child.pid, exited };
}

function alive(child: ChildProcess): boolean {
  return child.exitCode === null && child.signalCode === null;
}

/** A data folder and a config whose embedded port has something answering on it, as after a killed run. */
async function answeringPort(): Promise<Config> {
  const dir = scratchDir(defer, 'pid-file-');
  const listener = net.createServer((socket) => socket.destroy());
  await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
  defer(() => new Promise<void>((resolve) => listener.close(() => resolve())));
  const address = listener.address();
  assert.ok(address !== null && typeof address === 'object');
  return loadConfig({ DATA_DIR: dir, EMBEDDED_TEMPORAL_PORT: String(address.port) }, dir);
}

describe('the embedded server’s pid file', { skip: process.platform !== 'linux' && 'reads /proc' }, () => {
  it('records the process’s ID, start time and command line', async () => {
    const sleep = unrelatedProcess();
    const file = path.join(scratchDir(defer, 'pid-file-'), 'temporal-server.pid');

    await writePidFile(file, sleep.pid);

    const written: unknown = JSON.parse(fs.readFileSync(file, 'utf8'));
    const startTime = fs
      .readFileSync(`/proc/${sleep.pid}/stat`, 'utf8')
      .replace(/^.*\) /s, '')
      .split(' ')[19];
    assert.deepEqual(written, { pid: sleep.pid, startTime, command: 'sleep 30' });
    assert.deepEqual(recordedProcess(file), written);
  });

  it('waits for a process just spawned to show its command line, which /proc leaves empty until its exec is done', async () => {
    const sleep = unrelatedProcess();
    let reads = 0;
    // What /proc answers in that moment: the process is there, its command line not yet.
    const midExec = (pid: number): ReturnType<typeof processRecord> =>
      ++reads <= 3 ? undefined : processRecord(pid);

    const record = await execedProcessRecord(sleep.pid, { read: midExec });

    assert.equal(record?.command, 'sleep 30');
    assert.equal(reads, 4);
    sleep.child.kill('SIGKILL');
    await sleep.exited;
    assert.equal(await execedProcessRecord(sleep.pid, { read: midExec }), undefined);
    assert.equal(reads, 5, 'read again and again a process that is gone');
  });

  it('leaves alone the process an old-format file (a bare ID) names, and removes the file', async () => {
    const sleep = unrelatedProcess();
    const config = await answeringPort();
    fs.writeFileSync(config.paths.temporalPid, String(sleep.pid));

    const target = await connectOrStartTemporal(config);
    await target.close();

    assert.equal(target.origin, 'already running');
    assert.ok(alive(sleep.child), 'the process named by the old pid file was stopped');
    assert.equal(fs.existsSync(config.paths.temporalPid), false, 'the stale pid file is still there');
  });

  it('leaves alone a live process whose start time or command is not the recorded one, and removes the file', async () => {
    const sleep = unrelatedProcess();
    const live = await execedProcessRecord(sleep.pid);
    assert.ok(live !== undefined);
    const mismatches = [
      { ...live, startTime: String(Number(live.startTime) - 1) },
      { ...live, command: `${live.command} start-dev` },
    ];
    for (const record of mismatches) {
      const config = await answeringPort();
      fs.writeFileSync(config.paths.temporalPid, JSON.stringify(record));

      const target = await connectOrStartTemporal(config);
      await target.close();

      assert.equal(target.origin, 'already running', JSON.stringify(record));
      assert.ok(alive(sleep.child), `stopped on the word of ${JSON.stringify(record)}`);
      assert.equal(fs.existsSync(config.paths.temporalPid), false, JSON.stringify(record));
    }
  });

  it('still stops the process it recorded, at the end of the run, and removes the file', async () => {
    const sleep = unrelatedProcess();
    const config = await answeringPort();
    await writePidFile(config.paths.temporalPid, sleep.pid);

    const target = await connectOrStartTemporal(config);
    assert.equal(target.origin, 'embedded');
    assert.ok(alive(sleep.child), 'stopped before the end of the run');
    await target.close();

    assert.equal(await sleep.exited, 'SIGTERM');
    assert.equal(fs.existsSync(config.paths.temporalPid), false);
  });

  it('records a real dev server as it runs, so the record still matches when a later run checks it', async () => {
    const dir = scratchDir(defer, 'pid-file-server-');
    const config = loadConfig(
      {
        PATH: process.env.PATH ?? '',
        TEMPORAL_CLI_PATH: process.env.TEMPORAL_CLI_PATH ?? '',
        DATA_DIR: dir,
        EMBEDDED_TEMPORAL_PORT: String(await freePort()),
        TEMPORAL_UI_PORT: String(await freePort()),
      },
      dir,
    );
    const target = await connectOrStartTemporal(config);
    let closed = false;
    defer(async () => {
      if (!closed) await target.close();
    });
    assert.equal(target.origin, 'embedded');

    const record = recordedProcess(config.paths.temporalPid);
    assert.ok(record !== undefined, 'no pid file that matches the running server');
    assert.match(record.command, / server start-dev /);
    await target.close();
    closed = true;

    assert.equal(processRecord(record.pid), undefined, 'the server is still running');
    assert.equal(fs.existsSync(config.paths.temporalPid), false);
  });
});
