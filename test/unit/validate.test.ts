import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  parseContextCreate,
  parseCreate,
  parseExec,
  parseFork,
  parseGuestPath,
  parseSetTimeout,
  parseSnapshot,
} from '../../src/api/validate.js';
import { HostdError, type ErrorName } from '../../src/errors.js';

/** Throws `invalid_request` from registry entry `entry`, about `field` when one is given. */
const rejects400 = (fn: () => unknown, entry: ErrorName, field?: string): void => {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof HostdError);
    assert.equal(err.code, 'invalid_request');
    assert.equal(err.status, 400);
    assert.equal(err.entry, entry);
    if (field !== undefined) assert.equal(err.params[0], field);
    return true;
  });
};

test('create accepts no body, {} and a template name', () => {
  assert.deepEqual(parseCreate(undefined), {});
  assert.deepEqual(parseCreate({}), {});
  assert.deepEqual(parseCreate({ template: 'python' }), { template: 'python' });
  rejects400(() => parseCreate({ template: 3 }), 'invalidField', 'template');
  rejects400(() => parseCreate([]), 'bodyNotObject');
  rejects400(() => parseCreate({ tmpl: 'x' }), 'unknownField', 'tmpl');
});

test('create takes metadata (string labels) and a lifetime; on_timeout needs a timeout', () => {
  assert.deepEqual(parseCreate({ metadata: { a: 'b' }, timeout: 300 }), {
    metadata: { a: 'b' },
    lifetime: { timeoutS: 300, onTimeout: 'delete' },
  });
  assert.deepEqual(parseCreate({ timeout: 0.5, on_timeout: 'pause' }).lifetime, {
    timeoutS: 0.5,
    onTimeout: 'pause',
  });
  rejects400(() => parseCreate({ metadata: { a: 1 } }), 'invalidField', 'metadata.a');
  rejects400(() => parseCreate({ metadata: ['x'] }), 'invalidField', 'metadata');
  const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, 'v']));
  rejects400(() => parseCreate({ metadata: many }), 'invalidField', 'metadata');
  rejects400(() => parseCreate({ timeout: 0 }), 'invalidField', 'timeout');
  rejects400(() => parseCreate({ timeout: 31 * 86400 }), 'invalidField', 'timeout');
  rejects400(() => parseCreate({ timeout: '300' }), 'invalidField', 'timeout');
  rejects400(() => parseCreate({ on_timeout: 'pause' }), 'invalidField', 'timeout');
  rejects400(() => parseCreate({ timeout: 5, on_timeout: 'kill' }), 'invalidField', 'on_timeout');
});

test('set timeout: seconds or null, required; on_timeout optional', () => {
  assert.deepEqual(parseSetTimeout({ timeout: 60 }), { timeoutS: 60 });
  assert.deepEqual(parseSetTimeout({ timeout: null }), { timeoutS: null });
  assert.deepEqual(parseSetTimeout({ timeout: 5, on_timeout: 'pause' }), {
    timeoutS: 5,
    onTimeout: 'pause',
  });
  rejects400(() => parseSetTimeout({}), 'invalidField', 'timeout');
  rejects400(() => parseSetTimeout(undefined), 'bodyNotObject');
  rejects400(() => parseSetTimeout({ timeout: -1 }), 'invalidField', 'timeout');
  rejects400(() => parseSetTimeout({ timeout: 30 * 86400 + 1 }), 'invalidField', 'timeout');
  rejects400(
    () => parseSetTimeout({ timeout: 5, on_timeout: 'kill' }),
    'invalidField',
    'on_timeout',
  );
  rejects400(() => parseSetTimeout({ timeout: 5, ttl: 1 }), 'unknownField', 'ttl');
});

test('snapshot takes no body or a printable name', () => {
  assert.deepEqual(parseSnapshot(undefined), { name: null });
  assert.deepEqual(parseSnapshot({ name: 'team/base:v1' }), { name: 'team/base:v1' });
  rejects400(() => parseSnapshot({ name: '' }), 'invalidField', 'name');
  rejects400(() => parseSnapshot({ name: 'a\nb' }), 'invalidField', 'name');
  rejects400(() => parseSnapshot({ name: 'x'.repeat(129) }), 'invalidField', 'name');
  rejects400(() => parseSnapshot({ name: ' leading space' }), 'invalidField', 'name');
  rejects400(() => parseSnapshot({ name: 5 }), 'invalidField', 'name');
  rejects400(() => parseSnapshot({ label: 'x' }), 'unknownField', 'label');
});

test('exec needs code; language defaults to python; timeout is seconds', () => {
  assert.deepEqual(parseExec({ code: 'print(1)' }), { code: 'print(1)', language: 'python' });
  assert.deepEqual(parseExec({ code: 'ls', language: 'bash', timeout: 1.5 }), {
    code: 'ls',
    language: 'bash',
    timeoutMs: 1500,
  });
  rejects400(() => parseExec(undefined), 'bodyNotObject');
  rejects400(() => parseExec({}), 'invalidField', 'code');
  rejects400(() => parseExec({ code: 1 }), 'invalidField', 'code');
  rejects400(() => parseExec({ code: '', language: 'ruby' }), 'invalidField', 'language');
  rejects400(() => parseExec({ code: '', timeout: 0 }), 'invalidField', 'timeout');
  rejects400(() => parseExec({ code: '', timeout: '5' }), 'invalidField', 'timeout');
  rejects400(() => parseExec({ code: '', timeout_ms: 5 }), 'unknownField', 'timeout_ms');
});

test('fork n is an integer from 1 to 32', () => {
  assert.deepEqual(parseFork({ n: 1 }), { n: 1 });
  assert.deepEqual(parseFork({ n: 32 }), { n: 32 });
  for (const bad of [{ n: 0 }, { n: 33 }, { n: '2' }, { n: 1.5 }, {}, { n: null }]) {
    rejects400(() => parseFork(bad), 'invalidField', 'n');
  }
  rejects400(() => parseFork(undefined), 'bodyNotObject');
});

test('create takes env, network and a snapshot instead of a template', () => {
  assert.deepEqual(parseCreate({ env: { A: '1' }, network: { allow_out: ['pypi.org'] } }), {
    env: { A: '1' },
    network: { allow_out: ['pypi.org'] },
  });
  assert.deepEqual(parseCreate({ snapshot: 'snap_x' }), { snapshot: 'snap_x' });
  assert.deepEqual(parseCreate({ network: { allow_out: null } }), { network: { allow_out: [] } });
  rejects400(() => parseCreate({ template: 'a', snapshot: 'b' }), 'conflictingFields');
  rejects400(() => parseCreate({ env: { '1BAD': 'x' } }), 'invalidField', 'env name');
  rejects400(() => parseCreate({ env: { A: 1 } }), 'invalidField', 'env.A');
  rejects400(() => parseCreate({ env: ['A=1'] }), 'invalidField', 'env');
  rejects400(() => parseCreate({ network: { allow: [] } }), 'unknownField', 'allow');
  rejects400(
    () => parseCreate({ network: { allow_out: 'x' } }),
    'invalidField',
    'network.allow_out',
  );
});

test('exec takes env, an absolute cwd and display', () => {
  assert.deepEqual(parseExec({ code: 'x', env: { A: 'b' }, cwd: '/tmp', display: true }), {
    code: 'x',
    language: 'python',
    env: { A: 'b' },
    cwd: '/tmp',
    display: true,
  });
  assert.deepEqual(parseExec({ code: 'x', display: false }), { code: 'x', language: 'python' });
  rejects400(() => parseExec({ code: 'x', cwd: 'tmp' }), 'invalidField', 'cwd');
  rejects400(() => parseExec({ code: 'x', display: 'yes' }), 'invalidField', 'display');
});

test('exec takes a context id and notebook mode, for Python only', () => {
  assert.deepEqual(parseExec({ code: 'x', context: 'ctx-1.a_b', notebook: true }), {
    code: 'x',
    language: 'python',
    context: 'ctx-1.a_b',
    notebook: true,
  });
  assert.deepEqual(parseExec({ code: 'x', notebook: false }), { code: 'x', language: 'python' });
  for (const bad of ['', '-x', 'a/b', 'x'.repeat(65), 7, 'a b']) {
    rejects400(() => parseExec({ code: 'x', context: bad }), 'invalidField', 'context');
  }
  rejects400(() => parseExec({ code: 'x', notebook: 1 }), 'invalidField', 'notebook');
  rejects400(
    () => parseExec({ code: 'x', language: 'bash', notebook: true }),
    'invalidField',
    'notebook',
  );
  rejects400(
    () => parseExec({ code: 'x', language: 'bash', context: 'c' }),
    'invalidField',
    'context',
  );
});

test('a context is created from nothing, or its id and an absolute cwd', () => {
  assert.deepEqual(parseContextCreate(undefined), {});
  assert.deepEqual(parseContextCreate({ id: 'c1', cwd: '/tmp' }), { context: 'c1', cwd: '/tmp' });
  rejects400(() => parseContextCreate({ id: 'a/b' }), 'invalidField', 'id');
  rejects400(() => parseContextCreate({ cwd: 'tmp' }), 'invalidField', 'cwd');
  rejects400(() => parseContextCreate({ language: 'python' }), 'unknownField', 'language');
});

test('a file path is one absolute path: missing, repeated, relative, NUL and .. are refused', () => {
  assert.equal(parseGuestPath('/home/user/a b.txt'), '/home/user/a b.txt');
  for (const bad of [undefined, '', ['/a', '/b'], 'etc/passwd', '/tmp/a\0b', '/tmp/../etc']) {
    assert.throws(
      () => parseGuestPath(bad),
      (err: unknown) =>
        err instanceof HostdError && err.code === 'invalid_path' && err.status === 400,
    );
  }
  assert.throws(
    () => parseGuestPath(['/a', '/b']),
    (err: unknown) =>
      err instanceof HostdError && err.params[1] === 'the path query parameter is given 2 times',
  );
});

test('schema failures name the field, what it accepts and what was sent, in a short message', () => {
  const message = (fn: () => unknown): string => {
    try {
      fn();
    } catch (err) {
      assert.ok(err instanceof HostdError);
      assert.equal(err.code, 'invalid_request');
      return err.message;
    }
    assert.fail('accepted');
  };
  const fork = message(() => parseFork({ n: 33 }));
  assert.ok(fork.startsWith('n must be an integer from 1 to 32'), fork);
  assert.ok(fork.endsWith('got 33'), fork);
  // what JSON Schema cannot say is still checked: the byte total of the environment
  rejects400(() => parseCreate({ env: { A: 'x'.repeat(70_000) } }), 'invalidField', 'env');
  rejects400(() => parseExec({ code: 'x', env: { A: 'a\0b' } }), 'invalidField', 'env.A');
  // a huge or deep value is quoted short
  let deep: unknown = 'x'.repeat(1_000_000);
  for (let i = 0; i < 1000; i++) deep = { a: deep };
  for (const body of [{ template: deep }, { env: { A: deep } }, { metadata: deep }]) {
    assert.ok(message(() => parseCreate(body)).length < 300);
  }
});
