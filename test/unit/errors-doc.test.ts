import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { errorCodes } from '../../src/errors.js';
import { ROOT } from '../../testkit/root.js';

/** `| 404 | `code` |` rows of a document's `## Errors` section, up to the next `## ` heading. */
function documented(file: string): [string, number][] {
  const doc = readFileSync(join(ROOT, 'docs', file), 'utf8');
  const start = doc.indexOf('\n## Errors');
  assert.ok(start >= 0, `docs/${file} has an Errors section`);
  const end = doc.indexOf('\n## ', start + 1);
  const section = doc.slice(start, end < 0 ? undefined : end);
  const rows = new Map<string, number>();
  for (const m of section.matchAll(/^\| (\d{3}) \| `([a-z_]+)` \|/gm))
    rows.set(m[2]!, Number(m[1]));
  return [...rows.entries()].sort();
}

test('docs/api.md lists exactly the registry, with the same statuses', () => {
  assert.deepEqual(documented('api.md'), [...errorCodes().entries()].sort());
});

test('docs/e2b.md lists exactly the codes only the E2B front answers', () => {
  assert.deepEqual(documented('e2b.md'), [...errorCodes('e2b').entries()].sort());
});
