/**
 * The Node.js releases the project is tested on besides the Node that runs `npm test` (20 on this machine and in
 * CI), and what `npm run test:node` runs on them. The Dockerfile builds on one of these lines
 * (test/docker-compose.test.ts checks it); docs/configuration.md says which and why.
 */

/**
 * Each LTS line tested, and its release: the npm registry's `node-<platform>-<arch>` package of that version
 * carries the binary and the headers better-sqlite3 is compiled against. Move a pin forward by editing it here.
 */
export const TESTED_NODE_RELEASES: Readonly<Record<string, string>> = {
  '22': '22.23.5',
  '24': '24.22.3',
};

/**
 * The files run on each of them: what depends on the Node underneath. A real worker on a real dev server (the
 * embedded one of `npm start`, killed and resumed; worker processes killed, timed out and reset; a SIGTERM's
 * shutdown grace), the workflow bundle replaying committed histories, every model provider's adapter over HTTP,
 * both stores (better-sqlite3, the native module compiled per Node, and PostgreSQL), the offline model's thread
 * (a worker thread loading TypeScript through tsx), and the configuration.
 */
export const NODE_MATRIX_TESTS: readonly string[] = [
  'test/npm-start.test.ts',
  'test/dev-server.test.ts',
  'test/shutdown.test.ts',
  'test/replay.test.ts',
  'test/providers.test.ts',
  'test/stores.test.ts',
  'test/thread.test.ts',
  'test/config.test.ts',
];
