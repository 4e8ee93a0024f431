import { test } from 'node:test';
import assert from 'node:assert/strict';
import { noHugePagesLauncher } from '../../src/vm/host/huge-pages.js';

test('QEMU starts through perl setting PR_SET_THP_DISABLE with the syscall number of its arch', () => {
  const [perl, flag, script] = noHugePagesLauncher('x64', 'madvise', process.execPath);
  assert.equal(perl, process.execPath);
  assert.equal(flag, '-e');
  assert.ok(script!.startsWith('syscall(157, 41, 1, 0, 0, 0)'));
  assert.ok(
    noHugePagesLauncher('arm64', 'always', process.execPath)[2]!.startsWith('syscall(167,'),
  );
});

test('no launcher when THP is off already, perl is missing or the arch is unknown', () => {
  assert.deepEqual(noHugePagesLauncher('x64', 'never', process.execPath), []);
  assert.deepEqual(noHugePagesLauncher('x64', 'madvise', '/nonexistent/perl'), []);
  assert.deepEqual(noHugePagesLauncher('ia32', 'madvise', process.execPath), []);
});
