import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../testkit/root.js';

test('the README shows examples/readme.* unchanged (CI runs those files)', () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  for (const [lang, file] of [
    ['js', 'readme.mjs'],
    ['python', 'readme.py'],
    ['sh', 'readme.sh'],
  ] as const) {
    const code = readFileSync(join(ROOT, 'examples', file), 'utf8');
    assert.ok(
      readme.includes('```' + lang + '\n' + code + '```'),
      `README does not show examples/${file}`,
    );
  }
});

test('examples/e2b runs on the E2B SDKs the integration tests use, and on nothing else', () => {
  const read = (path: string): Record<string, Record<string, string>> =>
    JSON.parse(readFileSync(join(ROOT, path), 'utf8')) as Record<string, Record<string, string>>;
  const root = read('package.json');
  const example = read('examples/e2b/package.json');
  // CI runs the example on the root's node_modules (test/integration/e2b-example.test.ts).
  assert.deepEqual(example.dependencies, {
    '@e2b/code-interpreter': root.devDependencies!['@e2b/code-interpreter'],
    e2b: root.devDependencies!.e2b,
  });
  assert.deepEqual(Object.keys(example.devDependencies ?? {}).sort(), [
    '@types/node',
    'typescript',
  ]);
  assert.equal(example.devDependencies!.typescript, root.devDependencies!.typescript);
  const lock = read('examples/e2b/package-lock.json') as unknown as {
    packages: Record<string, { version?: string }>;
  };
  assert.equal(lock.packages['node_modules/e2b']?.version, root.devDependencies!.e2b);
  assert.equal(
    lock.packages['node_modules/@e2b/code-interpreter']?.version,
    root.devDependencies!['@e2b/code-interpreter'],
  );
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  assert.ok(readme.includes('(examples/e2b/)'), 'the README links examples/e2b');
});
