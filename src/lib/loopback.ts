import http from 'node:http';
import net from 'node:net';

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

/**
 * Where freeLoopbackPort looks: below the ports the kernel hands out for outgoing connections (Linux's default
 * range starts at 32768, the others' higher), so no client's connection takes the port between the probe and the
 * server's bind (seen: a test's dev server refused to start on "address already in use" for a port the kernel had
 * just given it as free).
 */
export const FREE_PORT_RANGE = { from: 20_000, to: 32_768 } as const;
/** Ports this process handed out lately: two callers at once get two ports. */
const handedOut: number[] = [];

/** A loopback port free a moment ago: for a server another process is about to start on it. */
export async function freeLoopbackPort(): Promise<number> {
  for (let tries = 0; tries < 50; tries++) {
    const port =
      FREE_PORT_RANGE.from + Math.floor(Math.random() * (FREE_PORT_RANGE.to - FREE_PORT_RANGE.from));
    if (handedOut.includes(port)) continue;
    // Reserved before the probe: a caller probing at the same time picks another.
    handedOut.push(port);
    if (handedOut.length > 256) handedOut.shift();
    const probe = http.createServer();
    try {
      await listenOnLoopback(probe, 'port probe', port);
    } catch {
      continue; // taken by another process
    }
    await closeServer(probe);
    return port;
  }
  // The range is crowded: any port the kernel gives.
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

/** True for a host name or address that stays on this machine: `localhost`, `::1`, 127.x.x.x. */
export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || (net.isIPv4(host) && host.startsWith('127.'));
}
