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
  {
    // The project's own code only (an allow-list): documents and folders of your own in the repository are not
    // linted. A new top-level source folder goes on this list; test/project-files.test.ts checks it.
    ignores: [
      '*',
      '!src/',
      '!demo/',
      '!test/',
      '!workflows/',
      '!activities/',
      '!scripts/',
      '!bench/',
      '!deploy/',
      'test/histories/',
    ],
  },
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
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    // Workflow code is replayed inside Temporal's sandbox: no Node builtins, activities by type only, and the kit
    // only through its workflow-side entry (src/workflow/), whose modules hold no I/O and build no schemas.
    files: ['workflows/**/*.ts', 'src/workflow/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              regex: '^(\\.\\./)+activities(/.*)?$',
              allowTypeImports: true,
              message:
                'Import activities as types only: their code does I/O and must stay out of the sandbox.',
            },
            {
              regex: '^\\.\\./src/(?!workflow$)',
              allowTypeImports: true,
              message:
                "The face's workflows import the kit's values through its workflow-side entry, ../src/workflow; types from anywhere.",
            },
            {
              regex: '^\\.\\./(?!contract/plain$|contract/review$|contract/batch-plain$|src/workflow$)[^.]',
              allowTypeImports: true,
              message:
                "The kit's workflow side imports values only from itself and the plain contract (../contract/plain, review, batch-plain): other modules do I/O, or build schemas every run would evaluate again.",
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
