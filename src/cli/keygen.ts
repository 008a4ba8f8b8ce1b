import './compose';
import { generateKey, keyIdOf } from '../temporal/codec';

/**
 * `npm run keygen`: prints settings for a fresh payload encryption key (keep them out of version control). The key
 * ID is derived from the key, so no PAYLOAD_ENCRYPTION_KEY_ID is needed and a new key never reuses an old ID.
 */
const key = generateKey();
console.log(`PAYLOAD_ENCRYPTION_KEY=${key}`);
console.log(
  `# key ID ${keyIdOf(Buffer.from(key, 'base64'))}, derived from the key: leave PAYLOAD_ENCRYPTION_KEY_ID unset.`,
);
console.log(
  '# To rotate: run keygen again, make the new key current and add this one to PAYLOAD_DECRYPTION_KEYS.',
);
