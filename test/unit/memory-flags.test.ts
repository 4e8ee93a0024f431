import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { memoryFlagsLauncher } from '../../src/vm/host/memory-flags.js';

const both = { noHugePages: true, mergeAll: true };

test('QEMU starts through perl setting PR_SET_THP_DISABLE with the syscall number of its arch', () => {
  const [perl, flag, script] = memoryFlagsLauncher(
    { noHugePages: true, mergeAll: false },
    'x64',
    'madvise',
    process.execPath,
  );
  assert.equal(perl, process.execPath);
  assert.equal(flag, '-e');
  assert.ok(script!.startsWith('syscall(157, 41, 1, 0, 0, 0)'));
  assert.ok(!script!.includes(', 67,'));
  assert.ok(
    memoryFlagsLauncher(both, 'arm64', 'always', process.execPath)[2]!.startsWith('syscall(167,'),
  );
});

test('PR_SET_MEMORY_MERGE is set without dying on a kernel that refuses it', () => {
  const script = memoryFlagsLauncher(both, 'x64', 'madvise', process.execPath)[2]!;
  assert.match(script, /syscall\(157, 67, 1, 0, 0, 0\); exec/);
  const alone = memoryFlagsLauncher(
    { noHugePages: true, mergeAll: true },
    'x64',
    'never',
    process.execPath,
  )[2]!;
  assert.ok(alone.startsWith('syscall(157, 67, 1, 0, 0, 0); exec'));
});

test('no launcher when there is nothing to set, perl is missing or the arch is unknown', () => {
  const thpOnly = { noHugePages: true, mergeAll: false };
  assert.deepEqual(memoryFlagsLauncher(thpOnly, 'x64', 'never', process.execPath), []);
  assert.deepEqual(
    memoryFlagsLauncher(
      { noHugePages: false, mergeAll: false },
      'x64',
      'madvise',
      process.execPath,
    ),
    [],
  );
  assert.deepEqual(memoryFlagsLauncher(both, 'x64', 'madvise', '/nonexistent/perl'), []);
  assert.deepEqual(memoryFlagsLauncher(both, 'ia32', 'madvise', process.execPath), []);
});

test('the flags reach the program the launcher execs', (t) => {
  const perl = '/usr/bin/perl';
  if (process.arch !== 'x64' || !existsSync(perl) || !existsSync('/proc/self/ksm_stat')) {
    t.skip('needs x64 Linux >= 6.7 with KSM, and perl');
    return;
  }
  const [cmd, ...pre] = memoryFlagsLauncher(both, 'x64', 'madvise', perl);
  const read = (file: string): string =>
    execFileSync(cmd!, [...pre, '/bin/cat', file], { encoding: 'utf8' });
  assert.match(read('/proc/self/ksm_stat'), /^ksm_merge_any: yes$/m);
  assert.match(read('/proc/self/status'), /^THP_enabled:\s+0$/m);
  // Without the launcher a process starts with neither (they are not set on this test's runner).
  assert.match(readFileSync('/proc/self/ksm_stat', 'utf8'), /^ksm_merge_any: no$/m);
});
