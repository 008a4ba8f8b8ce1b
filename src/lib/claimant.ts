import { randomUUID } from 'node:crypto';
import os from 'node:os';

/**
 * Names one attempt that claims a memo entry or a delivery: the host and process holding the claim (for logs and
 * the operator), `detail` when given, and a random suffix so two attempts of one process never share a name.
 */
export function claimantName(detail?: string): string {
  return [
    os.hostname(),
    process.pid,
    ...(detail === undefined ? [] : [detail]),
    randomUUID().slice(0, 8),
  ].join('/');
}
