/**
 * An operator's side of the delivery ledger (`npm run deliveries`): which deliveries nobody knows the fate of, and
 * settling one once the receiver has been checked.
 */
import { inFlightMs } from './ledger';
import type { DeliveryLedger, LedgerEntry } from './ledger';

export interface ReconcileOptions {
  /** PUBLISH_REQUEST_TIMEOUT_MS: a claim younger than this (and the grace) may still have its POST under way. */
  requestTimeoutMs: number;
}

/**
 * True while the claim's POST may still be under way: it was claimed, sent again or answered within the request
 * timeout and a grace, by the store's clock (the operator's own may be off).
 */
export function mayBeInFlight(entry: LedgerEntry, { requestTimeoutMs }: ReconcileOptions): boolean {
  return entry.ageMs < inFlightMs(requestTimeoutMs);
}

/** The lines `npm run deliveries` prints for the open claims. */
export function describeOpen(open: LedgerEntry[], options: ReconcileOptions): string[] {
  if (open.length === 0)
    return ['No open deliveries: every webhook delivery has a receipt or is known not to have arrived.'];
  const lines = [`${open.length} open deliveries: check the receiver for each key, then resolve it.`];
  for (const entry of open) {
    const state = mayBeInFlight(entry, options)
      ? 'sending now (its POST may still be under way: wait, then look again)'
      : 'sent, never answered';
    lines.push(
      `  ${entry.idempotencyKey}  document ${entry.documentId}  ${state}  attempts ${entry.attempts}  since ` +
        `${entry.updatedAt.toISOString()}  by ${entry.owner ?? '-'}${entry.lastError ? `  (${entry.lastError})` : ''}`,
    );
  }
  return lines;
}

export type Verdict = { kind: 'delivered'; revision: number } | { kind: 'unsent' };

/**
 * Applies an operator's verdict to the open claim under `key`. Refused, with the reason, when there is no open
 * claim, when its POST may still be under way (it could land after an "unsent" and be sent again), or when the
 * claim was settled meanwhile.
 */
export async function resolveDelivery(
  ledger: DeliveryLedger,
  key: string,
  verdict: Verdict,
  options: ReconcileOptions,
): Promise<{ ok: boolean; message: string; workflowId?: string }> {
  const open = (await ledger.openClaims()).find((e) => e.idempotencyKey === key);
  if (open === undefined)
    return {
      ok: false,
      message: `No open delivery under ${key}: \`npm run deliveries\` lists the open ones.`,
    };
  if (mayBeInFlight(open, options)) {
    return {
      ok: false,
      message:
        `${key} was sent ${Math.round(open.ageMs / 1000)} s ago and ` +
        `its POST may still be under way (PUBLISH_REQUEST_TIMEOUT_MS is ${options.requestTimeoutMs}): wait until ` +
        'it has had its answer or timed out, check the receiver, then resolve it.',
    };
  }
  const done = await ledger.resolve(
    open,
    verdict.kind === 'unsent'
      ? 'unsent'
      : { delivered: { documentId: open.documentId, revision: verdict.revision, duplicate: true } },
  );
  if (!done)
    return {
      ok: false,
      message:
        `${key}: nothing resolved; the delivery moved on meanwhile (settled by a retry, the lookup or another ` +
        'operator, or taken by a new attempt): `npm run deliveries` shows where it stands.',
    };
  return {
    ok: true,
    workflowId: open.workflowId,
    message:
      verdict.kind === 'unsent'
        ? `${key}: marked not delivered; the held publish step sends it on its next try.`
        : `${key}: marked delivered (revision ${verdict.revision}), and the later runs held on it with it; the held ` +
          'publish steps complete on their next try.',
  };
}
