import http from 'node:http';
import net from 'node:net';
import os from 'node:os';

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

/** Reads the body, or stops at `max` bytes (keeping none of the rest) and says so: a body declared longer is not read. */
export function readCappedBody(req: http.IncomingMessage, max: number): Promise<Buffer | 'too-large'> {
  if (Number(req.headers['content-length'] ?? 0) > max) return Promise.resolve('too-large');
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > max) {
        req.off('data', onData);
        chunks.length = 0;
        resolve('too-large');
      } else {
        chunks.push(chunk);
      }
    };
    req.on('data', onData);
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** An address as a URL's host writes it: an IPv6 address in brackets. */
export function bracketed(host: string): string {
  return net.isIPv6(host) ? `[${host}]` : host;
}

/**
 * The names a server bound to `host` answers to, as a Host header writes them (lowercase, IPv6 in brackets): the
 * bound address, the loopback names where it is loopback or every address, this machine's name where it is every
 * address, and `extra`.
 */
export function serverNames(host: string, extra: readonly string[] = []): string[] {
  const wildcard = host === '0.0.0.0' || host === '::';
  return [
    ...new Set(
      [
        host,
        ...(isLoopbackHost(host) || wildcard ? ['localhost', '127.0.0.1', '::1'] : []),
        ...(wildcard ? [os.hostname()] : []),
        ...extra,
      ].map((name) => bracketed(name).toLowerCase()),
    ),
  ];
}

/**
 * Whether a Host header names this server: one of serverNames, with the bound port (80 when left out). Anything
 * else (a DNS-rebinding page's name, a misrouted request) is not this server's to answer.
 */
export function hostMatcher(
  host: string,
  port: number,
  extra: readonly string[] = [],
): (header: string | undefined) => boolean {
  const names = new Set(serverNames(host, extra));
  return (header) => {
    const match = /^(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(\d{1,5}))?$/i.exec(header ?? '');
    if (match === null) return false;
    const [, name = '', given = '80'] = match;
    return names.has(name.toLowerCase()) && Number(given) === port;
  };
}
