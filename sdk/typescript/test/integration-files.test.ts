/**
 * `sandbox.files` against the real hostd (SERVICE_HOSTD_URL): round trips of text, bytes and a
 * 16 MiB stream, what code and the files API see of each other's writes, directories both ways,
 * and the error classes. Skipped without SERVICE_HOSTD_URL, and each test skips itself while
 * the server has no files API (it answers route_not_found).
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test, type TestContext } from 'node:test';
import {
  InvalidRequestError,
  Sandbox,
  SandboxFileNotFoundError,
  isHostdError,
} from '../src/index.js';
import { lacks } from './helpers/features.js';
import { LIVE_TIMEOUT_MS, skipLive } from './helpers/live.js';
import { awkwardTree, makeTree, readTree } from './helpers/tree.js';

describe('files against a real hostd', { skip: skipLive, timeout: 10 * LIVE_TIMEOUT_MS }, () => {
  let sandbox: Sandbox | undefined;
  let work: string;
  before(async () => {
    work = await mkdtemp(join(tmpdir(), 'hostd-sdk-live-files-'));
  });
  after(async () => {
    await sandbox?.delete().catch((e: unknown) => {
      if (!isHostdError(e, 'not_found')) throw e;
    });
    await rm(work, { recursive: true, force: true });
  });

  /** The shared sandbox, or undefined after skipping `t` when the server has no files API. */
  async function ready(t: TestContext): Promise<Sandbox | undefined> {
    const lacking = await lacks('files');
    if (lacking) {
      t.skip(lacking);
      return undefined;
    }
    sandbox ??= await Sandbox.create();
    return sandbox;
  }

  test(
    'text and bytes round trip; code sees them and the API sees code’s',
    { timeout: LIVE_TIMEOUT_MS },
    async (t) => {
      const s = await ready(t);
      if (!s) return;
      assert.deepEqual(await s.files.write('/root/t/hello.txt', 'héllo\n', { mode: 0o600 }), {
        path: '/root/t/hello.txt',
        size: 7,
      });
      assert.equal((await s.files.read('/root/t/hello.txt')).toString('utf8'), 'héllo\n');
      const entry = await s.files.stat('/root/t/hello.txt');
      assert.deepEqual([entry.type, entry.size, entry.mode], ['file', 7, 0o600]);
      assert.equal(
        (await s.run('print(open("/root/t/hello.txt").read(), end="")')).stdout,
        'héllo\n',
      );
      await s.run('open("/root/t/from-code.bin", "wb").write(bytes(range(256)))');
      assert.deepEqual([...(await s.files.read('/root/t/from-code.bin'))], [...Array(256).keys()]);
      assert.deepEqual(
        (await s.files.list('/root/t')).map((e) => e.name),
        ['from-code.bin', 'hello.txt'],
      );
      await s.files.mkdir('/root/t/a/b');
      assert.equal((await s.files.stat('/root/t/a/b')).type, 'dir');
      await s.files.remove('/root/t', { recursive: true });
      await assert.rejects(s.files.stat('/root/t'), SandboxFileNotFoundError);
    },
  );

  test(
    'a 16 MiB stream goes up and comes back down intact',
    { timeout: LIVE_TIMEOUT_MS },
    async (t) => {
      const s = await ready(t);
      if (!s) return;
      const chunks = Array.from({ length: 16 }, () => randomBytes(1 << 20));
      const expected = createHash('sha256').update(Buffer.concat(chunks)).digest('hex');
      const info = await s.files.write('/root/big.bin', Readable.from(chunks));
      assert.equal(info.size, 16 << 20);
      const got = createHash('sha256');
      for await (const c of await s.files.readStream('/root/big.bin')) got.update(c as Buffer);
      assert.equal(got.digest('hex'), expected);
      const inside = await s.run(
        'import hashlib\nprint(hashlib.sha256(open("/root/big.bin", "rb").read()).hexdigest())',
      );
      assert.equal(inside.stdout.trim(), expected);
    },
  );

  test(
    'a directory goes up and comes back down as the same tree',
    { timeout: LIVE_TIMEOUT_MS },
    async (t) => {
      const s = await ready(t);
      if (!s) return;
      const src = join(work, 'src');
      await makeTree(src, awkwardTree());
      const up = await s.files.uploadDir(src, '/root/tree');
      assert.equal(up.path, '/root/tree');
      // Members extracted: 6 files, the link and 5 directories (docs/api.md, Files).
      assert.equal(up.files, 12);
      assert.equal(
        (await s.run('print(open("/root/tree/a.txt").read(), end="")')).stdout,
        'alpha\n',
      );
      const out = join(work, 'out');
      await s.files.downloadDir('/root/tree', out);
      assert.deepEqual(await readTree(out), await readTree(src));
    },
  );

  test('the error classes of the files API', { timeout: LIVE_TIMEOUT_MS }, async (t) => {
    const s = await ready(t);
    if (!s) return;
    await assert.rejects(s.files.read('/root/no-such-file'), (e: unknown) => {
      assert.ok(e instanceof SandboxFileNotFoundError);
      assert.equal(e.code, 'file_not_found');
      return true;
    });
    await s.files.mkdir('/root/d');
    await assert.rejects(s.files.remove('/root/d'), (e: unknown) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.code, 'is_a_directory');
      return true;
    });
    await assert.rejects(s.files.read('relative/path'), (e: unknown) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.code, 'invalid_path');
      return true;
    });
  });
});
