/**
 * One HTTP request with exactly the method, target path and headers given (Host included, which fetch would not
 * let a test set; a malformed percent-encoding goes out as written, node does not re-encode it), and the whole
 * answer read. Gives up after 5 s.
 */
import http from 'node:http';

export interface RawAnswer {
  status: number;
  body: string;
}

export function rawRequest(
  method: 'GET' | 'POST',
  url: string,
  { path, headers = {}, body = '' }: { path?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<RawAnswer> {
  const target = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request({
      method,
      hostname: target.hostname,
      port: target.port,
      path: path ?? `${target.pathname}${target.search}`,
      headers,
      signal: AbortSignal.timeout(5_000),
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }),
      );
    });
    req.on('error', reject);
    req.end(body);
  });
}
