// @ts-check
import tseslint from 'typescript-eslint';

const nodeBuiltins = [
  'assert',
  'buffer',
  'child_process',
  'crypto',
  'dns',
  'events',
  'fs',
  'http',
  'https',
  'net',
  'os',
  'path',
  'process',
  'stream',
  'timers',
  'tls',
  'url',
  'util',
  'worker_threads',
  'zlib',
];

export default tseslint.config(
  { ignores: ['node_modules/', 'dist/', 'data/', '.tmp/', '.tools/', 'eslint.config.mjs'] },
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': [
        'error',
        {
          allowForKnownSafeCalls: [
            {
              from: 'package',
              package: 'node:test',
              name: ['describe', 'it', 'test', 'before', 'after', 'beforeEach', 'afterEach'],
            },
          ],
        },
      ],
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
    },
  },
  {
    // Workflow code is replayed inside Temporal's sandbox: no Node builtins, and activities by type only.
    files: ['workflows/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['../activities', '../activities/*'],
              allowTypeImports: true,
              message:
                'Import activities as types only: their code does I/O and must stay out of the sandbox.',
            },
            {
              group: ['../src/*', '!../src/contract'],
              allowTypeImports: true,
              message:
                'Workflow code may import only the workflow-safe ../src/contract (other modules do I/O).',
            },
            {
              group: ['node:*'],
              message: 'No Node builtins in workflow code: it runs in the deterministic sandbox.',
            },
            ...nodeBuiltins.map((name) => ({
              group: [name, `${name}/*`],
              message: 'No Node builtins in workflow code.',
            })),
          ],
        },
      ],
    },
  },
);
