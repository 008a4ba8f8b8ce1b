import http from 'node:http';

/**
 * Starts `server` on a free loopback port (or `port`) and returns its origin, `http://127.0.0.1:<port>`. `what`
 * names the server in the error thrown if it did not bind a TCP port.
 */
export async function listenOnLoopback(server: http.Server, what = 'server', port = 0): Promise<string> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', resolve);
  });
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error(`${what} did not bind a TCP port`);
  return `http://127.0.0.1:${address.port}`;
}

/** A loopback port free a moment ago: for a server another process is about to start on it. */
export async function freeLoopbackPort(): Promise<number> {
  const probe = http.createServer();
  const origin = await listenOnLoopback(probe, 'port probe');
  await closeServer(probe);
  return Number(new URL(origin).port);
}

/** Closes `server` at once: its open connections too, held requests included. */
export async function closeServer(server: http.Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

/** A request body read whole. */
export function readBody(req: http.IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}
