import net from 'node:net';
import { Connection } from '@temporalio/client';

/** True when something accepts TCP connections on host:port within a short wait. */
export function answers(host: string, port: number, timeoutMs = 500): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port });
    const done = (result: boolean): void => {
      socket.destroy();
      resolve(result);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
  });
}

/** True once a Temporal server answers gRPC on `address` and knows the namespace. */
export async function serving(address: string, namespace: string): Promise<boolean> {
  const [host, port] = address.split(':');
  if (host === undefined || !(await answers(host, Number(port)))) return false;
  let connection: Connection | undefined;
  try {
    connection = await Connection.connect({ address, connectTimeout: 1_000 });
    await connection.workflowService.describeNamespace({ namespace });
    return true;
  } catch {
    return false;
  } finally {
    await connection?.close();
  }
}

/**
 * True when the Temporal Web UI answers on this loopback port: its settings API, not just any listener (a port
 * freed by a server that stopped may be taken by another program a moment later).
 */
export async function uiAnswers(port: number, timeoutMs = 1_000): Promise<boolean> {
  try {
    const response = await fetch(`http://127.0.0.1:${port}/api/v1/settings`, {
      signal: AbortSignal.timeout(timeoutMs),
      redirect: 'manual',
    });
    // Only the status and the content type count: whatever took the port may answer a body without end.
    await response.body?.cancel();
    return response.ok && (response.headers.get('content-type') ?? '').includes('application/json');
  } catch {
    return false;
  }
}
