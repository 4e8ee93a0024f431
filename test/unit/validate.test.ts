import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseCreate, parseExec, parseFork } from '../../src/api/validate.js';
import { HostdError } from '../../src/errors.js';

const rejects400 = (fn: () => unknown, pattern: RegExp): void => {
  assert.throws(
    fn,
    (err: unknown) => err instanceof HostdError && err.status === 400 && pattern.test(err.message),
  );
};

test('create accepts no body, {} and a template name', () => {
  assert.deepEqual(parseCreate(undefined), {});
  assert.deepEqual(parseCreate({}), {});
  assert.deepEqual(parseCreate({ template: 'python' }), { template: 'python' });
  rejects400(() => parseCreate({ template: 3 }), /template must be/);
  rejects400(() => parseCreate([]), /JSON object/);
  rejects400(() => parseCreate({ tmpl: 'x' }), /unknown field "tmpl"/);
});

test('exec needs code; language defaults to python; timeout is seconds', () => {
  assert.deepEqual(parseExec({ code: 'print(1)' }), { code: 'print(1)', language: 'python' });
  assert.deepEqual(parseExec({ code: 'ls', language: 'bash', timeout: 1.5 }), {
    code: 'ls',
    language: 'bash',
    timeoutMs: 1500,
  });
  rejects400(() => parseExec(undefined), /body is required/);
  rejects400(() => parseExec({}), /code is required/);
  rejects400(() => parseExec({ code: 1 }), /code is required/);
  rejects400(() => parseExec({ code: '', language: 'ruby' }), /language/);
  rejects400(() => parseExec({ code: '', timeout: 0 }), /timeout/);
  rejects400(() => parseExec({ code: '', timeout: '5' }), /timeout/);
  rejects400(() => parseExec({ code: '', timeout_ms: 5 }), /unknown field/);
});

test('fork n is an integer from 1 to 32', () => {
  assert.deepEqual(parseFork({ n: 1 }), { n: 1 });
  assert.deepEqual(parseFork({ n: 32 }), { n: 32 });
  for (const bad of [{ n: 0 }, { n: 33 }, { n: '2' }, { n: 1.5 }, {}, { n: null }]) {
    rejects400(() => parseFork(bad), /n must be an integer from 1 to 32/);
  }
  rejects400(() => parseFork(undefined), /body is required/);
});
