import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { errorCodes } from '../../src/errors.js';
import { ROOT } from '../../testkit/hostd.js';

test('docs/api.md lists exactly the registry, with the same statuses', () => {
  const doc = readFileSync(join(ROOT, 'docs', 'api.md'), 'utf8');
  const section = doc.slice(doc.indexOf('## Errors'), doc.indexOf('## Limits'));
  const documented = new Map<string, number>();
  for (const m of section.matchAll(/^\| (\d{3}) \| `([a-z_]+)` \|/gm))
    documented.set(m[2]!, Number(m[1]));
  assert.deepEqual([...documented.entries()].sort(), [...errorCodes().entries()].sort());
});
