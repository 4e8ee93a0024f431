// @ts-check
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'dist/**',
      'node_modules/**',
      'sdk/**/dist/**',
      'examples/**/dist/**',
      'bench/results/**',
    ],
  },
  js.configs.recommended,
  {
    // Plain Node scripts (examples): Node's globals.
    files: ['examples/**/*.mjs'],
    languageOptions: { globals: { console: 'readonly', process: 'readonly' } },
  },
  {
    // The web console: browser ES modules, type-checked by console/tsconfig.json.
    files: ['console/**/*.js'],
    languageOptions: { globals: globals.browser },
  },
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      // Layering: api -> core -> vm. vm must never import core or api; core never imports api.
      'no-restricted-imports': 'off',
    },
  },
  {
    // Settings are read once, validated, in src/config.ts; elsewhere a SERVICE_* variable is a
    // Config field. (What a child process inherits, like PATH, is not a setting.)
    files: ['src/**/*.ts'],
    ignores: ['src/config.ts'],
    rules: {
      'no-restricted-syntax': [
        'error',
        {
          selector:
            "MemberExpression[object.object.name='process'][object.property.name='env'][property.name=/^SERVICE_/]",
          message: 'Read SERVICE_* variables in src/config.ts and pass the Config field.',
        },
        {
          selector:
            "MemberExpression[object.object.name='process'][object.property.name='env'][property.value=/^SERVICE_/]",
          message: 'Read SERVICE_* variables in src/config.ts and pass the Config field.',
        },
      ],
    },
  },
  {
    files: ['src/vm/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: ['../core/*', '../api/*', '**/core/**', '**/api/**'] },
      ],
    },
  },
  {
    // Rooms of vm: qemu drives the others; storage, channels and host know no other room, and
    // image builds on storage only. machine.ts, the port core sees, imports none of them.
    files: ['src/vm/storage/**/*.ts', 'src/vm/channels/**/*.ts', 'src/vm/host/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            '../core/*',
            '../api/*',
            '**/core/**',
            '**/api/**',
            '../qemu/*',
            '../image/*',
            '../storage/*',
            '../channels/*',
            '../host/*',
          ],
        },
      ],
    },
  },
  {
    files: ['src/vm/image/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            '../core/*',
            '../api/*',
            '**/core/**',
            '**/api/**',
            '../qemu/*',
            '../channels/*',
            '../host/*',
          ],
        },
      ],
    },
  },
  {
    files: ['src/core/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: ['../api/*', '**/api/**'] }] },
  },
  {
    // Adapters of cluster mode (etcd, peers over HTTP): they implement core's ports
    // (core/cluster/), and know neither the HTTP API nor machines.
    files: ['src/cluster/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: ['../api/*', '**/api/**', '../vm/*', '**/vm/**'] },
      ],
    },
  },
  {
    // api reaches machines only through core.
    files: ['src/api/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: ['../vm/*', '**/vm/**'] }] },
  },
  {
    // test/README.md: testkit (real parts) is shared by the tests and the bench; test/helpers
    // (fakes, inject harnesses) belongs to the unit tests, and testkit never needs it.
    files: ['testkit/**/*.ts', 'bench/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', { patterns: ['**/test/helpers/**', '**/helpers/*'] }],
    },
  },
);
