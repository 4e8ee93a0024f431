/**
 * The files API with real VMs (docs/api.md, Files): bytes and tar trees in and out, listings,
 * errors by code, file operations next to a running exec, across fork, merge and pause, a
 * sandbox deleted mid-transfer, and transfers that stream (hostd's memory stays flat).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile, mkdir } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { Readable } from 'node:stream';
import { WARM_FILE } from '../../src/core/pool.js';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { eventually } from '../../testkit/eventually.js';
import {
  download,
  listDir,
  peakRssGrowth,
  readBytes,
  removePath,
  statPath,
  upload,
  zeros,
} from '../../testkit/files.js';
import { sandboxInfo, withSandbox, withSandboxes } from '../../testkit/sandboxes.js';

const MiB = 1024 * 1024;
const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

let hostd: Hostd;
before(async () => {
  hostd = await startHostd({
    // The files warm-up is opt-in; on here, so that every test of this file also runs on
    // machines that did it.
    env: {
      SERVICE_POOL_SIZE: '2',
      SERVICE_MAX_FILE_BYTES: String(2 ** 31),
      SERVICE_POOL_WARM_FILES: '1',
    },
  });
});
after(async () => {
  await hostd.stop();
});

describe('bytes in and out', () => {
  test('an upload becomes the file, parents created; the download is the same bytes', async () => {
    await withSandbox(hostd, async (id) => {
      const data = randomBytes(3 * MiB + 17);
      const put = await upload(hostd, id, '/home/user/in/deep/data.bin', data, { mode: '0600' });
      assert.equal(put.status, 200);
      assert.deepEqual(put.body, { path: '/home/user/in/deep/data.bin', size: data.length });
      const res = await download(hostd, id, '/home/user/in/deep/data.bin');
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('content-type'), 'application/octet-stream');
      assert.equal(res.headers.get('content-length'), String(data.length));
      assert.equal(sha(Buffer.from(await res.arrayBuffer())), sha(data));
      const stat = await statPath(hostd, id, '/home/user/in/deep/data.bin');
      assert.equal(stat.body.type, 'file');
      assert.equal(stat.body.size, data.length);
      assert.equal(stat.body.mode, 0o600);
      const seen = await run(
        hostd,
        id,
        'import hashlib\nprint(hashlib.sha256(open("/home/user/in/deep/data.bin","rb").read()).hexdigest())',
      );
      assert.equal(seen.stdout, `${sha(data)}\n`, 'code in the sandbox reads what was uploaded');
    });
  });

  test('an empty body is an empty file; an upload replaces what was there', async () => {
    await withSandbox(hostd, async (id) => {
      assert.equal((await upload(hostd, id, '/tmp/f', 'first version')).status, 200);
      assert.equal((await upload(hostd, id, '/tmp/f', '')).body.size, 0);
      assert.equal((await readBytes(hostd, id, '/tmp/f')).length, 0);
      await upload(hostd, id, '/tmp/f', 'second');
      assert.equal((await readBytes(hostd, id, '/tmp/f')).toString(), 'second');
    });
  });

  test("a pooled sandbox shows nothing of the pool's files warm-up", async () => {
    // Taken from the pool, whose clones each wrote, read, listed and removed WARM_FILE.
    await eventually(
      'a pooled clone',
      async () =>
        /hostd_pool_ready\{[^}]*\} [1-9]/.test(
          await (await hostd.request('GET', '/metrics')).text(),
        ),
      { timeoutMs: 300_000, everyMs: 200 },
    );
    await withSandbox(hostd, async (id) => {
      const listing = await listDir(hostd, id, '/tmp');
      assert.equal(listing.status, 200);
      assert.ok(!listing.body.entries.some((e) => e.name === basename(WARM_FILE)));
      assert.equal((await statPath(hostd, id, WARM_FILE)).body.code, 'file_not_found');
    });
  });

  test('list is one level sorted by name; mkdir makes parents; delete needs recursive for a directory', async () => {
    await withSandbox(hostd, async (id) => {
      const made = await hostd.json('POST', `/v1/sandboxes/${id}/files/mkdir?path=/work/a/b`);
      assert.deepEqual(made, { status: 200, body: { path: '/work/a/b' } });
      await upload(hostd, id, '/work/z.txt', 'z');
      await upload(hostd, id, '/work/a/b/c.txt', 'c');
      await run(hostd, id, 'ln -s /work/z.txt /work/link', { language: 'bash' });
      const listing = await listDir(hostd, id, '/work');
      assert.equal(listing.status, 200);
      assert.deepEqual(
        listing.body.entries.map((e) => [e.name, e.type]),
        [
          ['a', 'dir'],
          ['link', 'symlink'],
          ['z.txt', 'file'],
        ],
      );
      assert.equal(listing.body.entries[1]!.target, '/work/z.txt');
      assert.deepEqual(await removePath(hostd, id, '/work/a'), {
        status: 400,
        code: 'is_a_directory',
      });
      assert.deepEqual(await removePath(hostd, id, '/work/a', true), {
        status: 204,
        code: undefined,
      });
      assert.deepEqual(await removePath(hostd, id, '/work/link'), { status: 204, code: undefined });
      assert.deepEqual(
        (await listDir(hostd, id, '/work')).body.entries.map((e) => e.name),
        ['z.txt'],
        'the link went, not its target',
      );
    });
  });

  test('a tree goes in and comes out as tar', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'hostd-files-'));
    try {
      await mkdir(join(dir, 'src', 'pkg'), { recursive: true });
      await writeFile(join(dir, 'src', 'pkg', 'mod.py'), 'VALUE = 42\n');
      await writeFile(join(dir, 'README'), 'read me\n');
      const tarball = execFileSync('tar', ['-c', '-C', dir, '.']);
      await withSandbox(hostd, async (id) => {
        const put = await upload(hostd, id, '/home/user/repo', tarball, { tar: true });
        assert.equal(put.status, 200);
        assert.equal(put.body.path, '/home/user/repo');
        assert.equal(put.body.size, 'VALUE = 42\n'.length + 'read me\n'.length);
        const imported = await run(
          hostd,
          id,
          'import sys\nsys.path.insert(0, "/home/user/repo/src")\nimport pkg.mod\nprint(pkg.mod.VALUE)',
        );
        assert.equal(imported.stdout, '42\n');

        const res = await download(hostd, id, '/home/user/repo', true);
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('content-type'), 'application/x-tar');
        const out = await mkdtemp(join(tmpdir(), 'hostd-files-out-'));
        try {
          execFileSync('tar', ['-x', '-C', out], { input: Buffer.from(await res.arrayBuffer()) });
          assert.equal(await readFile(join(out, 'src', 'pkg', 'mod.py'), 'utf8'), 'VALUE = 42\n');
          assert.equal(await readFile(join(out, 'README'), 'utf8'), 'read me\n');
        } finally {
          await rm(out, { recursive: true, force: true });
        }
      });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('errors, by code', () => {
  test('paths, missing files, directories where files are expected and the reverse', async () => {
    await withSandbox(hostd, async (id) => {
      await upload(hostd, id, '/tmp/file', 'x');
      const cases: [
        string,
        Promise<{ status: number; body: { code?: string } }>,
        number,
        string,
      ][] = [
        [
          'missing file',
          hostd.json('GET', `/v1/sandboxes/${id}/files?path=/nope`),
          404,
          'file_not_found',
        ],
        [
          'reading a directory',
          hostd.json('GET', `/v1/sandboxes/${id}/files?path=/tmp`),
          400,
          'is_a_directory',
        ],
        [
          'listing a file',
          hostd.json('GET', `/v1/sandboxes/${id}/files/list?path=/tmp/file`),
          400,
          'not_a_directory',
        ],
        [
          'a parent that is a file',
          upload(hostd, id, '/tmp/file/child', 'y'),
          400,
          'not_a_directory',
        ],
        ['uploading onto a directory', upload(hostd, id, '/tmp', 'y'), 400, 'is_a_directory'],
        [
          'a tar that is not one',
          upload(hostd, id, '/tmp/t', 'not a tar at all', { tar: true }),
          400,
          'invalid_archive',
        ],
      ];
      for (const [what, answer, status, code] of cases) {
        const { status: got, body } = await answer;
        assert.deepEqual([got, body.code], [status, code], what);
      }
      assert.equal((await readBytes(hostd, id, '/tmp/file')).toString(), 'x', 'nothing changed it');
    });
  });

  test('a Content-Length over SERVICE_MAX_FILE_BYTES is 413 file_too_large before any byte', async () => {
    await withSandbox(hostd, async (id) => {
      const url = new URL(`${hostd.url}/v1/sandboxes/${id}/files?path=/tmp/huge`);
      const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = httpRequest(
          url,
          { method: 'PUT', headers: { ...hostd.headers, 'content-length': String(2 ** 32) } },
          (res) => {
            let body = '';
            res.on('data', (c: Buffer) => (body += c.toString()));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
          },
        );
        req.on('error', reject);
        req.flushHeaders(); // the headers only: the answer must not wait for the body
      });
      assert.equal(answer.status, 413);
      assert.equal((JSON.parse(answer.body) as { code: string }).code, 'file_too_large');
    });
  });
});

describe('ordering', () => {
  test('files are read and written while a long exec runs, without waiting for it', async () => {
    await withSandbox(hostd, async (id) => {
      // The exec writes a file, then waits until the test uploads a marker: it cannot end
      // before the file operations below are done.
      const exec = run(
        hostd,
        id,
        'import os\nopen("/tmp/progress","w").write("halfway")\nwhile not os.path.exists("/tmp/go"):\n    os.sched_yield()\nprint("done")',
      );
      await eventually('the exec to have written its progress file', async () => {
        const res = await download(hostd, id, '/tmp/progress');
        return res.status === 200 && (await res.text()) === 'halfway';
      });
      assert.equal((await sandboxInfo(hostd, id)).busy, true, 'the exec still runs');
      assert.equal((await upload(hostd, id, '/tmp/go', '')).status, 200);
      assert.equal((await exec).stdout, 'done\n');
    });
  });

  test("fork children see every completed write; their writes are their own; merge keeps the winner's", async () => {
    await withSandboxes(hostd, async (scope) => {
      const parent = await scope.create();
      await upload(hostd, parent, '/home/user/state.txt', 'parent');
      const fork = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${parent}/fork`,
        { n: 2 },
      );
      assert.equal(fork.status, 200);
      const [a, b] = scope.track(fork.body.children.map((c) => c.id));
      assert.equal((await readBytes(hostd, a!, '/home/user/state.txt')).toString(), 'parent');
      await upload(hostd, a!, '/home/user/state.txt', 'child a');
      assert.equal((await readBytes(hostd, b!, '/home/user/state.txt')).toString(), 'parent');
      assert.equal((await readBytes(hostd, parent, '/home/user/state.txt')).toString(), 'parent');
      const merged = await hostd.json('POST', `/v1/sandboxes/${parent}/merge_into/${a!}`);
      assert.equal(merged.status, 200);
      assert.equal((await readBytes(hostd, parent, '/home/user/state.txt')).toString(), 'child a');
    });
  });

  test('a file operation on a paused sandbox resumes it', async () => {
    await withSandbox(hostd, async (id) => {
      await upload(hostd, id, '/home/user/kept', 'across the pause');
      assert.equal((await hostd.json('POST', `/v1/sandboxes/${id}/pause`)).status, 200);
      assert.equal((await sandboxInfo(hostd, id)).state, 'paused');
      assert.equal((await readBytes(hostd, id, '/home/user/kept')).toString(), 'across the pause');
      assert.equal((await sandboxInfo(hostd, id)).state, 'ready');
    });
  });
});

describe('transfers that stream', () => {
  test('deleting the sandbox during an upload answers 404 and leaves the others working', async () => {
    await withSandboxes(hostd, async (scope) => {
      const id = await scope.create();
      const other = await scope.create();
      let sent = 0;
      const endless = new Readable({
        read() {
          sent += MiB;
          this.push(Buffer.alloc(MiB));
        },
      });
      const put = upload(hostd, id, '/tmp/never', endless);
      await eventually('the guest to take 8 MiB of the body', () => sent > 8 * MiB, {
        timeoutMs: 120_000,
      });
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
      const answer = await put;
      endless.destroy();
      assert.deepEqual([answer.status, answer.body.code], [404, 'sandbox_not_found']);
      assert.equal((await run(hostd, other, 'print(6 * 7)')).stdout, '42\n');
    });
  });

  test("a 1 GiB download and a 256 MiB upload keep hostd's memory growth under 32 MiB", async () => {
    await withSandboxes(hostd, async (scope) => {
      const id = await scope.create();
      const other = await scope.create();
      await run(hostd, id, 'truncate -s 1G /tmp/big; truncate -s 64M /tmp/warm', {
        language: 'bash',
      });
      const pid = hostd.proc.pid!;
      // A first transfer allocates what every transfer reuses (stream buffers, the JIT's code):
      // what is measured next is what grows with the size of a transfer.
      await (await download(hostd, id, '/tmp/warm')).arrayBuffer();
      const down = await peakRssGrowth(pid, async () => {
        const res = await download(hostd, id, '/tmp/big');
        assert.equal(res.status, 200);
        let bytes = 0;
        for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
          bytes += chunk.length;
        }
        return bytes;
      });
      assert.equal(down.result, 1024 * MiB);
      assert.ok(down.growthBytes < 32 * MiB, `download grew hostd by ${down.growthBytes} bytes`);
      await run(hostd, id, 'rm /tmp/big', { language: 'bash' });

      const up = await peakRssGrowth(pid, async () => {
        const [answer, meanwhile] = await Promise.all([
          upload(hostd, id, '/tmp/up.bin', zeros(256 * MiB)),
          run(hostd, other, 'print("still answering")'),
        ]);
        assert.equal(meanwhile.stdout, 'still answering\n', 'another sandbox answers meanwhile');
        return answer;
      });
      assert.deepEqual(up.result.body, { path: '/tmp/up.bin', size: 256 * MiB });
      assert.ok(up.growthBytes < 32 * MiB, `upload grew hostd by ${up.growthBytes} bytes`);
    });
  });
});
