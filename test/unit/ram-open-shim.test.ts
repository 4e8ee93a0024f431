/**
 * The RAM image shim (vm/host/ram-open-shim.ts): a read-write open of a RAM image that the
 * file's mode refuses is retried read-only, which a copy-on-write mapping needs, and nothing
 * else changes. Played by Debian's python3 as an unprivileged uid (root runs the unit tests in
 * CI; elsewhere the uid checks are skipped).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, chownSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ramOpenShim } from '../../src/vm/host/ram-open-shim.js';

const QEMU = 'qemu-system-x86_64';
const NOBODY = 65534;

/** Opens `path` read-write as uid/gid nobody, maps it privately and writes a page; what happened. */
function openAsNobody(path: string, preload: string | null): Record<string, string> {
  const script = `
import errno, fcntl, json, mmap, os, sys
r = {}
try:
    fd = os.open(sys.argv[1], os.O_RDWR)
    r['mode'] = ['O_RDONLY', 'O_WRONLY', 'O_RDWR'][fcntl.fcntl(fd, fcntl.F_GETFL) & 3]
    m = mmap.mmap(fd, 4096, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    m[0:1] = b'Z'
    r['private write'] = m[0:1].decode()
except OSError as e:
    r['error'] = errno.errorcode[e.errno]
print(json.dumps(r))
`;
  const r = spawnSync(
    'setpriv',
    [
      `--reuid=${NOBODY}`,
      `--regid=${NOBODY}`,
      '--clear-groups',
      '/usr/bin/python3',
      '-c',
      script,
      path,
    ],
    {
      encoding: 'utf8',
      env: { PATH: '/usr/bin:/bin', ...(preload ? { LD_PRELOAD: preload } : {}) },
    },
  );
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Record<string, string>;
}

test('a RAM image its mode keeps read-only opens read-only through the shim, and stays unchanged', (t) => {
  const dir = mkdtempSync('/var/tmp/hostd-ram-shim-');
  try {
    chmodSync(dir, 0o755);
    const shim = ramOpenShim(dir, QEMU);
    assert.ok(shim.path !== null, shim.path === null ? shim.why : '');
    assert.deepEqual(ramOpenShim(dir, QEMU), shim, 'the second start finds it');
    if (process.getuid?.() !== 0) {
      t.skip('needs root to play an unprivileged QEMU');
      return;
    }
    const image = join(dir, 'fork-0123456789abcdef.mem');
    const other = join(dir, 'device.state');
    for (const f of [image, other]) {
      writeFileSync(f, Buffer.alloc(8192));
      chownSync(f, 0, NOBODY);
      chmodSync(f, 0o640);
    }
    assert.deepEqual(openAsNobody(image, null), { error: 'EACCES' }, 'without it, QEMU 7.2 fails');
    assert.deepEqual(openAsNobody(image, shim.path), { mode: 'O_RDONLY', 'private write': 'Z' });
    assert.deepEqual(openAsNobody(other, shim.path), { error: 'EACCES' }, 'only RAM images');
    assert.ok(
      Buffer.alloc(8192).equals(Buffer.from(spawnSync('cat', [image]).stdout)),
      'the private write stayed private',
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('without a compiler there is no shim, and why', () => {
  const dir = mkdtempSync('/var/tmp/hostd-ram-shim-');
  try {
    const shim = ramOpenShim(dir, QEMU, '/nonexistent/cc');
    assert.ok(shim.path === null && shim.why.length > 0);
    assert.deepEqual(readdirSync(join(dir, 'qemu-libs')), [], 'a failed build leaves nothing');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
