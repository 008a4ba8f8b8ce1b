/**
 * A TLS-terminating gRPC proxy in front of a plaintext Temporal dev server, standing where a secured cluster's
 * front door stands: TLS with a certificate from a test CA, optionally mTLS (a client certificate from that CA is
 * required) and an API key (every stream must carry `authorization: Bearer <key>`, else it is answered with gRPC
 * status UNAUTHENTICATED). Each accepted stream goes on to the server over plaintext HTTP/2, with its headers, data
 * and trailers relayed both ways. Also: the test CA and its certificates, made with openssl in a folder.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http2 from 'node:http2';
import type net from 'node:net';
import path from 'node:path';

/** gRPC's status for a request without valid credentials. */
export const UNAUTHENTICATED = 16;
const UNAVAILABLE = 14;
const INTERNAL = 13;

/** The files of a test CA: its certificate, a server certificate for `serverName`, a client certificate. */
export interface TestCertificates {
  serverName: string;
  caCert: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
}

/**
 * Makes a CA (`<name>-ca.pem`) in `dir` and, signed by it, a server certificate for `serverName` and a client
 * certificate (P-256 keys, valid one day, with the extensions rustls and OpenSSL both insist on). Returns paths.
 */
export function makeTestCertificates(
  dir: string,
  name: string,
  serverName = 'temporal.test',
): TestCertificates {
  const file = (suffix: string): string => path.join(dir, `${name}-${suffix}`);
  const openssl = (...args: string[]): void => void execFileSync('openssl', args, { stdio: 'pipe' });
  const newKey = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  // prettier-ignore
  openssl(
    'req', '-x509', ...newKey, '-keyout', file('ca.key'), '-out', file('ca.pem'), '-days', '1',
    '-subj', `/CN=${name} test CA`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
  );
  const leaf = (role: 'server' | 'client', subject: string, extensions: string[]): void => {
    fs.writeFileSync(file(`${role}.ext`), `${extensions.join('\n')}\n`);
    // prettier-ignore
    openssl('req', ...newKey, '-keyout', file(`${role}.key`), '-out', file(`${role}.csr`), '-subj', `/CN=${subject}`);
    // prettier-ignore
    openssl(
      'x509', '-req', '-in', file(`${role}.csr`), '-CA', file('ca.pem'), '-CAkey', file('ca.key'),
      '-set_serial', String(Date.now()), '-days', '1', '-extfile', file(`${role}.ext`), '-out', file(`${role}.pem`),
    );
  };
  const common = ['basicConstraints=critical,CA:FALSE', 'keyUsage=critical,digitalSignature'];
  leaf('server', serverName, [...common, 'extendedKeyUsage=serverAuth', `subjectAltName=DNS:${serverName}`]);
  leaf('client', 'pipeline-worker', [...common, 'extendedKeyUsage=clientAuth']);
  return {
    serverName,
    caCert: file('ca.pem'),
    serverCert: file('server.pem'),
    serverKey: file('server.key'),
    clientCert: file('client.pem'),
    clientKey: file('client.key'),
  };
}

export interface GrpcTlsProxyOptions {
  /** `host:port` of the plaintext gRPC server behind the proxy. */
  upstream: string;
  certificates: TestCertificates;
  /** mTLS: the TLS handshake fails for a client without a certificate signed by the test CA. */
  requireClientCert?: boolean;
  /** Every stream must carry `authorization: Bearer <apiKey>`. */
  apiKey?: string;
}

export interface GrpcTlsProxy {
  /** `127.0.0.1:<port>`, for TEMPORAL_ADDRESS. */
  address: string;
  /** What the proxy refused, in order: `tls: <reason>` for a handshake, `unauthenticated: <reason>` for a stream. */
  refusals: string[];
  /** How many streams went through to the server. */
  forwarded(): number;
  close(): Promise<void>;
}

/** Starts the proxy on a free loopback port; `close` ends every connection it holds, both sides. */
export async function startGrpcTlsProxy({
  upstream,
  certificates,
  requireClientCert = false,
  apiKey,
}: GrpcTlsProxyOptions): Promise<GrpcTlsProxy> {
  const refusals: string[] = [];
  let forwarded = 0;
  const sessions = new Set<http2.Http2Session>();
  const server = http2.createSecureServer({
    cert: fs.readFileSync(certificates.serverCert),
    key: fs.readFileSync(certificates.serverKey),
    ...(requireClientCert
      ? { ca: fs.readFileSync(certificates.caCert), requestCert: true, rejectUnauthorized: true }
      : {}),
  });
  server.on('tlsClientError', (err: Error) => refusals.push(`tls: ${err.message}`));
  server.on('session', (session: http2.ServerHttp2Session) => {
    sessions.add(session);
    // One plaintext connection to the server per client connection, made at its first stream.
    let toServer: http2.ClientHttp2Session | undefined;
    const serverSession = (): http2.ClientHttp2Session => {
      if (toServer === undefined || toServer.closed || toServer.destroyed) {
        toServer = http2.connect(`http://${upstream}`);
        toServer.on('error', () => {}); // each stream on it sees the failure and answers for itself
        sessions.add(toServer);
      }
      return toServer;
    };
    session.on('error', () => {});
    session.once('close', () => {
      sessions.delete(session);
      toServer?.destroy();
    });
    session.on('stream', (stream, headers) => {
      stream.on('error', () => {});
      const refusal = apiKeyRefusal(headers.authorization, apiKey);
      if (refusal !== undefined) {
        refusals.push(`unauthenticated: ${refusal}`);
        answerStatus(stream, UNAUTHENTICATED, refusal);
        return;
      }
      forwarded += 1;
      relay(stream, headers, serverSession(), upstream);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as net.AddressInfo;
  return {
    address: `127.0.0.1:${port}`,
    refusals,
    forwarded: () => forwarded,
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const session of sessions) session.destroy();
      await closed;
    },
  };
}

/** Why a stream's `authorization` header does not carry the API key, or undefined when it does (or none is needed). */
function apiKeyRefusal(authorization: string | undefined, apiKey: string | undefined): string | undefined {
  if (apiKey === undefined) return undefined;
  if (authorization === undefined || authorization === '') return 'no API key: authorization header missing';
  return authorization === `Bearer ${apiKey}` ? undefined : 'the API key is not valid';
}

/** Ends `stream` with gRPC `status` in trailers after empty response headers, its request body left unread. */
function answerStatus(stream: http2.ServerHttp2Stream, status: number, message: string): void {
  stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
  stream.once('wantTrailers', () =>
    stream.sendTrailers({ 'grpc-status': String(status), 'grpc-message': message }),
  );
  stream.end();
  stream.resume();
}

/** Headers to pass on: without pseudo-headers (each side sets its own) and without `without`. */
function passedOn(headers: http2.IncomingHttpHeaders, without: string[] = []): http2.OutgoingHttpHeaders {
  const kept: http2.OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers))
    if (!name.startsWith(':') && !without.includes(name) && value !== undefined) kept[name] = value;
  return kept;
}

/**
 * One gRPC call through: the request's headers (the API key stays here), its messages and end go to the server;
 * the answer's headers, messages and trailers come back. A trailers-only answer (an error before any message)
 * comes back as one. A reset or a dropped connection on either side cancels the other.
 */
function relay(
  stream: http2.ServerHttp2Stream,
  headers: http2.IncomingHttpHeaders,
  toServer: http2.ClientHttp2Session,
  upstream: string,
): void {
  const call = toServer.request({
    ':method': headers[':method'],
    ':path': headers[':path'],
    ':authority': upstream,
    ...passedOn(headers, ['authorization']),
  });
  let trailers: http2.IncomingHttpHeaders | undefined;
  let ended = false;
  call.on('trailers', (received) => (trailers = received));
  call.on('end', () => (ended = true));
  call.on('response', (answer) => {
    const status = { ':status': answer[':status'] ?? 200 };
    if (answer['grpc-status'] !== undefined) {
      stream.respond({ ...status, ...passedOn(answer) }, { endStream: true });
      call.resume();
      return;
    }
    stream.respond({ ...status, ...passedOn(answer) }, { waitForTrailers: true });
    // Sent once the last message is queued, which is after the server's trailers arrived (they end its stream).
    stream.once('wantTrailers', () =>
      stream.sendTrailers(
        trailers === undefined
          ? { 'grpc-status': String(INTERNAL), 'grpc-message': 'the server sent no trailers' }
          : passedOn(trailers),
      ),
    );
    call.pipe(stream);
  });
  // How the call ended is read at its close: an error comes with one, and is answered there.
  call.on('error', () => {});
  call.on('close', () => {
    if (ended || stream.closed) return;
    if (!stream.headersSent) answerStatus(stream, UNAVAILABLE, 'the server behind the proxy did not answer');
    else stream.close(call.rstCode ?? http2.constants.NGHTTP2_INTERNAL_ERROR);
  });
  stream.on('close', () => {
    if (!call.closed) call.close(http2.constants.NGHTTP2_CANCEL);
  });
  stream.pipe(call);
}
