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
              regex: '^\\.\\./activities(/(?!steps$).*)?$',
              allowTypeImports: true,
              message:
                'Import activities as types only (the step list, ../activities/steps, excepted): their code does I/O and must stay out of the sandbox.',
            },
            {
              group: ['../src/*', '!../src/steps', '!../src/batch-steps', '!../src/review'],
              allowTypeImports: true,
              message:
                'Workflow code may import values only from ../src/steps, ../src/batch-steps and ../src/review (other modules do I/O, or build schemas that every run would evaluate again); types from anywhere.',
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
  {
    // The step list and each step's entry in it are imported by the workflow bundle: names and plain functions,
    // values from each other only, anything else as types (no zod, no I/O).
    files: ['activities/steps.ts', 'activities/step-definition.ts', 'activities/*/step.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              regex: '^(?!(\\.\\./|\\./)step-definition$|\\./[a-z-]+/step$)',
              allowTypeImports: true,
              message:
                'The workflow bundle imports the step list: values only from the step list files, anything else as types.',
            },
          ],
        },
      ],
    },
  },
);
