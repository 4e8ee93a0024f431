/**
 * The files API against clients and sandboxes that do not play along (docs/api.md, Files): a
 * download the client leaves half-read must stop in the guest and free the sandbox's file lane;
 * paths the guest cannot read are the client's error, in the registry's words; a tar cannot
 * leave a link that leads out of its target, whatever the order of its members.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { readBytes, statPath, upload } from '../../testkit/files.js';
import { withSandbox } from '../../testkit/sandboxes.js';

const MiB = 1024 * 1024;

let hostd: Hostd;
before(async () => {
  hostd = await startHostd({
    env: { SERVICE_TEMPLATES: 'python-slim', SERVICE_POOL_SIZE: '1' },
    startTimeoutMs: 600_000, // its template boots before hostd serves: minutes on a busy host
  });
});
after(async () => {
  await hostd.stop();
});

/**
 * GETs `query` on the files route, reads `bytes` of the body, then hangs up (destroys the
 * socket). Resolves with the moment it hung up (performance.now()).
 */
function readThenHangUp(id: string, query: string, bytes: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      new URL(`${hostd.url}/v1/sandboxes/${id}/files?${query}`),
      { headers: hostd.headers },
      (res) => {
        if (res.statusCode !== 200) {
          reject(new Error(`GET ${query} answered ${res.statusCode}`));
          return;
        }
        let got = 0;
        res.on('data', (chunk: Buffer) => {
          got += chunk.length;
          if (got >= bytes && !req.destroyed) {
            req.destroy();
            resolve(performance.now());
          }
        });
        res.on('end', () => reject(new Error(`the download ended after ${got} bytes`)));
      },
    );
    req.on('error', (err) => {
      if (!req.destroyed) reject(err);
    });
    req.end();
  });
}

/** Lines of `ls -l` on every guest process's open files that name `needle`. */
async function openFilesNaming(id: string, needle: string): Promise<string> {
  const found = await run(
    hostd,
    id,
    `for f in /proc/[0-9]*/fd/*; do t=$(readlink "$f" 2>/dev/null) && case "$t" in ${needle}) echo "$f -> $t";; esac; done; true`,
    { language: 'bash' },
  );
  assert.equal(found.exit, 0, found.stderr);
  return found.stdout;
}

describe('a download the client leaves', () => {
  const cases: [string, string, string][] = [
    ['a 1 TiB sparse file', 'path=/tmp/huge', '/tmp/huge'],
    ['a tar of /proc (with /proc/kcore, 128 TiB)', 'path=/proc&format=tar', '/proc/kcore'],
  ];
  for (const [what, query, file] of cases) {
    test(`${what}: the guest stops sending and the file lane is free for the next operation`, async (t) => {
      await withSandbox(hostd, async (id) => {
        await run(hostd, id, 'truncate -s 1T /tmp/huge', { language: 'bash' });
        const hungUp = await readThenHangUp(id, query, 16 * MiB);
        // One operation at a time in the guest's files thread: a stat that answers comes after
        // the download's end there. Before the fix it waited behind the whole terabyte.
        const stat = await statPath(hostd, id, '/tmp/huge');
        const answered = performance.now();
        assert.deepEqual([stat.status, stat.body.size], [200, 2 ** 40]);
        t.diagnostic(
          `hang-up to the next file operation answered: ${Math.round(answered - hungUp)} ms`,
        );
        assert.equal(await openFilesNaming(id, file), '', 'no guest process still reads it');
      });
    });
  }
});

describe('paths the guest cannot read or write', () => {
  /** What the guest's errors say in its own words (Python's strerror): never in an answer. */
  const GUEST_WORDS = [
    'Input/output error',
    'Invalid argument',
    'Operation not permitted',
    'Permission denied',
    'Too many levels of symbolic links',
    'File name too long',
    'shrank',
  ];

  test("each is the client's error by code, in hostd's words", async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'ln -s loop /tmp/loop', { language: 'bash' });
      const get = (path: string): Promise<{ status: number; body: { code?: string } }> =>
        hostd.json('GET', `/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`);
      const cases: [
        string,
        Promise<{ status: number; body: { code?: string } }>,
        number,
        string,
      ][] = [
        ['/proc/self/mem: EIO on /proc', get('/proc/self/mem'), 400, 'unsupported_file'],
        ['/proc/self/clear_refs: EINVAL', get('/proc/self/clear_refs'), 400, 'unsupported_file'],
        ['/proc/kcore: 128 TiB of /proc', get('/proc/kcore'), 400, 'unsupported_file'],
        [
          'a write-only /sys attribute',
          get('/sys/bus/platform/drivers_probe'),
          403,
          'permission_denied',
        ],
        ['a device', get('/dev/null'), 400, 'invalid_path'],
        ['a loop of symbolic links', get('/tmp/loop'), 400, 'invalid_path'],
        ['a name too long', get(`/tmp/${'n'.repeat(300)}`), 400, 'invalid_path'],
        [
          'writing /proc',
          upload(hostd, id, '/proc/sys/kernel/hostname', 'x'),
          403,
          'permission_denied',
        ],
        [
          'removing /proc',
          hostd.json('DELETE', `/v1/sandboxes/${id}/files?path=/proc&recursive=1`),
          403,
          'permission_denied',
        ],
      ];
      for (const [what, answer, status, code] of cases) {
        const { status: got, body } = await answer;
        assert.deepEqual([got, body.code], [status, code], what);
        const message = (body as { error?: string }).error ?? '';
        for (const words of GUEST_WORDS) assert.ok(!message.includes(words), `${what}: ${message}`);
      }
      assert.equal((await run(hostd, id, 'print(1)')).stdout, '1\n', 'the sandbox is fine');
    });
  });

  test('a /sys file is read whole, not cut to the page size it claims', async () => {
    await withSandbox(hostd, async (id) => {
      const path = '/sys/kernel/mm/transparent_hugepage/enabled';
      const inGuest = await run(hostd, id, `cat ${path}`, { language: 'bash' });
      assert.equal((await statPath(hostd, id, path)).body.size, 4096);
      assert.equal((await readBytes(hostd, id, path)).toString(), inGuest.stdout);
    });
  });
});

describe('a tar upload', () => {
  /** A tar of `links` (name, target), in that order, made by the host's tar. */
  async function linksTar(links: [string, string][]): Promise<Buffer> {
    const dir = await mkdtemp(join(tmpdir(), 'hostd-tar-links-'));
    try {
      for (const [name, target] of links) await symlink(target, join(dir, name));
      return execFileSync('tar', ['-c', '-C', dir, ...links.map(([name]) => name)]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  /** Where each entry of `dir` in the guest resolves (readlink -f), one per line. */
  async function resolved(id: string, dir: string): Promise<string[]> {
    const out = await run(hostd, id, `for f in ${dir}/*; do readlink -f "$f"; done`, {
      language: 'bash',
    });
    return out.stdout.split('\n').filter((l) => l !== '');
  }

  test('cannot leave a link that leads out of its target, whatever the order of its members', async () => {
    await withSandbox(hostd, async (id) => {
      const orders: [string, string][][] = [
        [
          ['x', 'y/..'],
          ['y', '.'],
        ],
        [
          ['y', '.'],
          ['x', 'y/..'],
        ],
      ];
      for (const [i, links] of orders.entries()) {
        const dest = `/tmp/lnk${i}/dest`;
        const put = await upload(hostd, id, dest, await linksTar(links), { tar: true });
        assert.deepEqual([put.status, put.body.code], [400, 'invalid_path'], dest);
        for (const real of await resolved(id, dest)) {
          assert.ok(real.startsWith(`${dest}/`) || real === dest, `${dest}: a link to ${real}`);
        }
      }
    });
  });

  test('may hold links that climb with leading .. as far as its target', async () => {
    await withSandbox(hostd, async (id) => {
      const dir = await mkdtemp(join(tmpdir(), 'hostd-tar-up-'));
      try {
        await mkdir(join(dir, 'a', 'b'), { recursive: true });
        await writeFile(join(dir, 'c'), 'see');
        await symlink('../../c', join(dir, 'a', 'b', 'up'));
        const tarball = execFileSync('tar', ['-c', '-C', dir, 'c', 'a']);
        const put = await upload(hostd, id, '/tmp/ok', tarball, { tar: true });
        assert.equal(put.status, 200, JSON.stringify(put.body));
        assert.equal((await readBytes(hostd, id, '/tmp/ok/a/b/up')).toString(), 'see');
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    });
  });
});
