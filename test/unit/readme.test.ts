import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../testkit/hostd.js';

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
