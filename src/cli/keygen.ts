import { randomUUID } from 'node:crypto';
import { generateKey } from '../temporal/codec';

/** `npm run keygen`: prints settings for a fresh payload encryption key (keep them out of version control). */
console.log(`PAYLOAD_ENCRYPTION_KEY=${generateKey()}`);
console.log(`PAYLOAD_ENCRYPTION_KEY_ID=key-${randomUUID().slice(0, 8)}`);
