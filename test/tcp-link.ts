/**
 * A TCP link of a test's own in front of a real server (PostgreSQL, Temporal, an HTTP server), to fail the network
 * between a process and that server on purpose: refuse connections for a while (a database that is down), cut
 * every connection (a failover), or let nothing through without closing anything (a partition: no reset, no
 * answer). It forwards bytes only; what is behind it is the real thing.
 */
import net from 'node:net';
import type { Defer } from './scratch';

export interface TcpLink {
  /** `host:port` to give the process instead of the server's. */
  address: string;
  host: string;
  port: number;
  /** Cuts every connection and refuses new ones for `ms`, then takes connections again. */
  refuseFor(ms: number): Promise<void>;
  /** Cuts every connection; new ones are taken at once. */
  cutAll(): void;
  /** Lets nothing through, either way, while `partitioned` (connections stay open, silent). */
  partition(partitioned: boolean): void;
  /**
   * Once, cuts the connection whose server sends a chunk that `matches`, that chunk dropped: the server did what it
   * answers (a commit, say) and the client never hears it. Resolves when it has cut.
   */
  cutBeforeAnswer(matches: (fromServer: Buffer) => boolean): Promise<void>;
}

/**
 * Listens on `listenHost` (loopback unless given: a network namespace's peer address, say) and forwards each
 * connection to `target` (`host:port`). Closed after the file's tests.
 */
export async function tcpLink(defer: Defer, target: string, listenHost = '127.0.0.1'): Promise<TcpLink> {
  const [targetHost = '127.0.0.1', targetPort = '0'] = splitHostPort(target);
  const sockets = new Set<net.Socket>();
  let partitioned = false;
  let cutter: { matches: (fromServer: Buffer) => boolean; cut: () => void } | undefined;
  const server = net.createServer((inbound) => {
    const outbound = net.connect(Number(targetPort), targetHost);
    for (const socket of [inbound, outbound]) {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      socket.on('error', () => socket.destroy());
    }
    // Forwarded by hand, not piped: a partition drops what arrives instead of queueing it.
    inbound.on('data', (chunk: Buffer) => void (partitioned || outbound.write(chunk)));
    outbound.on('data', (chunk: Buffer) => {
      if (cutter?.matches(chunk) === true) {
        cutter.cut();
        cutter = undefined;
        inbound.destroy();
        outbound.destroy();
        return;
      }
      if (!partitioned) inbound.write(chunk);
    });
    inbound.on('close', () => outbound.destroy());
    outbound.on('close', () => inbound.destroy());
  });
  const listen = (port: number): Promise<number> =>
    new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, listenHost, () => {
        server.off('error', reject);
        resolve((server.address() as net.AddressInfo).port);
      });
    });
  const port = await listen(0);
  const cutAll = (): void => {
    for (const socket of sockets) socket.destroy();
  };
  defer(
    () =>
      new Promise<void>((resolve) => {
        cutAll();
        if (server.listening) server.close(() => resolve());
        else resolve();
      }),
  );
  return {
    address: `${listenHost}:${port}`,
    host: listenHost,
    port,
    cutAll,
    async refuseFor(ms) {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        cutAll();
      });
      await new Promise((resolve) => setTimeout(resolve, ms));
      await listen(port);
    },
    partition(on) {
      partitioned = on;
    },
    cutBeforeAnswer(matches) {
      return new Promise<void>((cut) => (cutter = { matches, cut }));
    },
  };
}

function splitHostPort(address: string): [string, string] {
  const at = address.lastIndexOf(':');
  return [address.slice(0, at).replace(/^\[|\]$/g, ''), address.slice(at + 1)];
}
