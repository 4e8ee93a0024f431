/**
 * E2B's `sandbox.commands` and `sandbox.files` through the unmodified npm `e2b` package against
 * a real hostd (docs/e2b.md, "Commands" and "Files"): envd's processes, filesystem and `/files`
 * as hostd serves them, on real VMs. One sandbox serves most tests (each works in its own
 * directory); the ones that kill or time out get their own.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import {
  CommandExitError,
  FileType,
  FilesystemEventType,
  NotFoundError,
  Sandbox,
  TimeoutError,
  type FilesystemEvent,
} from 'e2b';
import { e2bRequest, pointE2bAt, sandboxHeaders, withE2b } from '../../testkit/e2b.js';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { eventually } from '../../testkit/eventually.js';
import { reportFailure } from '../../testkit/sandboxes.js';

const TEMPLATE = 'python-slim';
let hostd: Hostd;
let shared: Sandbox;

/** Runs `fn` with its own sandbox, reported when it fails and always deleted. */
function withE2bSandbox(fn: (sbx: Sandbox) => Promise<void>): Promise<void> {
  return withE2b(hostd, async (scope) => fn(scope.track(await Sandbox.create(TEMPLATE))));
}

/**
 * A unary envd RPC sent by hand, as the SDKs send it: for what the JS SDK does not call (the
 * polling watchers E2B's Python SDK uses).
 */
async function rpc(
  sbx: Sandbox,
  method: string,
  body: unknown,
): Promise<{ status: number; body: unknown }> {
  const token = (sbx as unknown as { envdAccessToken: string }).envdAccessToken;
  const res = await e2bRequest(hostd, 'POST', `/${method}`, {
    body,
    apiKey: null,
    headers: { 'connect-protocol-version': '1', ...sandboxHeaders(sbx.sandboxId, token) },
  });
  return { status: res.status, body: res.json };
}

/** Runs `fn` on the shared sandbox, reporting it when `fn` fails. */
async function onShared(fn: (sbx: Sandbox) => Promise<void>): Promise<void> {
  try {
    await fn(shared);
  } catch (err) {
    await reportFailure(hostd, shared.sandboxId);
    throw err;
  }
}

before(async () => {
  // The template's first boot takes minutes on a loaded host under TCG
  hostd = await startHostd({
    env: { SERVICE_TEMPLATES: TEMPLATE, SERVICE_POOL_SIZE: '2' },
    startTimeoutMs: 900_000,
  });
  pointE2bAt(hostd);
  // Its lifetime must outlast the file: E2B's default, 300 s from the create, can end before
  // the last test on a loaded host, and the tests after it would find no sandbox.
  shared = await Sandbox.create(TEMPLATE, { timeoutMs: 3_600_000 });
});

after(async () => {
  await shared?.kill().catch(() => undefined);
  await hostd?.stop();
});

describe('commands.run', () => {
  test('a command runs in a login bash as user, in its home, and returns its output', async () => {
    await onShared(async (sbx) => {
      const result = await sbx.commands.run(
        'whoami; pwd; echo $HOME; shopt -q login_shell && echo login',
      );
      assert.equal(result.exitCode, 0);
      assert.equal(result.stdout, 'user\n/home/user\n/home/user\nlogin\n');
      assert.equal(result.stderr, '');
    });
  });

  test('envs apply to their command only', async () => {
    await onShared(async (sbx) => {
      const one = await sbx.commands.run('echo "$FOO $USER"', { envs: { FOO: 'bar' } });
      assert.equal(one.stdout, 'bar user\n');
      const next = await sbx.commands.run('echo "[$FOO]"');
      assert.equal(next.stdout, '[]\n');
    });
  });

  test('cwd and user: root has its own home, and user becomes root with sudo', async () => {
    await onShared(async (sbx) => {
      assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n');
      assert.equal(
        (await sbx.commands.run('whoami; pwd', { user: 'root' })).stdout,
        'root\n/root\n',
      );
      assert.equal((await sbx.commands.run('sudo whoami')).stdout, 'root\n');
    });
  });

  test('a missing cwd is an InvalidArgumentError naming it', async () => {
    await onShared(async (sbx) => {
      await assert.rejects(sbx.commands.run('pwd', { cwd: '/no/such/dir' }), (err: Error) => {
        assert.equal(err.name, 'InvalidArgumentError');
        assert.match(err.message, /cwd '\/no\/such\/dir' does not exist/);
        return true;
      });
    });
  });

  test('onStdout and onStderr get the output as it comes', async () => {
    await onShared(async (sbx) => {
      const out: string[] = [];
      const err: string[] = [];
      await sbx.commands.run('echo one; echo two >&2', {
        onStdout: (d) => void out.push(d),
        onStderr: (d) => void err.push(d),
      });
      assert.equal(out.join(''), 'one\n');
      assert.equal(err.join(''), 'two\n');
    });
  });

  test('a command that fails throws CommandExitError with its exit code and output', async () => {
    await onShared(async (sbx) => {
      await assert.rejects(sbx.commands.run('echo partial; exit 3'), (err: unknown) => {
        assert.ok(err instanceof CommandExitError);
        assert.equal(err.exitCode, 3);
        assert.equal(err.stdout, 'partial\n');
        assert.equal(err.error, 'exit status 3');
        return true;
      });
    });
  });

  test('a command past its timeoutMs is killed and throws TimeoutError', async () => {
    await onShared(async (sbx) => {
      const marker = `timeout-${Date.now()}`;
      await assert.rejects(
        sbx.commands.run(`sleep 60 # ${marker}`, { timeoutMs: 2000 }),
        (err: unknown) => err instanceof TimeoutError,
      );
      await eventually('the command to be gone', async () => {
        const list = await sbx.commands.list();
        return !list.some((p) => p.args.some((a) => a.includes(marker)));
      });
    });
  });
});

describe('background commands', () => {
  test('a background command is listed, killed by pid, and its wait throws', async () => {
    await onShared(async (sbx) => {
      const handle = await sbx.commands.run('sleep 120', { background: true });
      assert.ok(handle.pid > 1);
      const listed = (await sbx.commands.list()).find((p) => p.pid === handle.pid);
      assert.deepEqual(
        { cmd: listed?.cmd, args: listed?.args },
        { cmd: '/bin/bash', args: ['-l', '-c', 'sleep 120'] },
      );
      assert.equal(await sbx.commands.kill(handle.pid), true);
      await assert.rejects(handle.wait(), (err: unknown) => {
        assert.ok(err instanceof CommandExitError);
        assert.equal(err.exitCode, -1);
        assert.equal(err.error, 'signal: killed');
        return true;
      });
      assert.equal(await sbx.commands.kill(handle.pid), false);
    });
  });

  test('stdin: sendStdin feeds a command, closeStdin ends its input', async () => {
    await onShared(async (sbx) => {
      const handle = await sbx.commands.run('cat', { background: true, stdin: true });
      await sbx.commands.sendStdin(handle.pid, 'hello ');
      await handle.sendStdin('world');
      await sbx.commands.closeStdin(handle.pid);
      const result = await handle.wait();
      assert.equal(result.stdout, 'hello world');
    });
  });

  test('connect attaches to a running command after its first stream was dropped', async () => {
    await onShared(async (sbx) => {
      const first = await sbx.commands.run('read x; echo "got $x"', {
        background: true,
        stdin: true,
      });
      await first.disconnect();
      const again = await sbx.commands.connect(first.pid);
      await sbx.commands.sendStdin(first.pid, 'it\n');
      const result = await again.wait();
      assert.equal(result.stdout, 'got it\n');
    });
  });

  test('connecting to a pid that does not run is NotFoundError', async () => {
    await onShared(async (sbx) => {
      await assert.rejects(
        sbx.commands.connect(999_999),
        (err: unknown) => err instanceof NotFoundError,
      );
    });
  });

  test('a sandbox killed while a command runs: the SDK says it was killed in flight', async () => {
    await withE2bSandbox(async (sbx) => {
      // Settled by hand: it rejects while the test waits for the command to be listed
      const running = sbx.commands.run('sleep 60').then(
        () => assert.fail('the command ended by itself'),
        (err: unknown) => err,
      );
      await eventually('the command to run', async () =>
        (await sbx.commands.list()).some((p) => p.args.includes('sleep 60')),
      );
      await Sandbox.kill(sbx.sandboxId);
      const err = await running;
      assert.ok(err instanceof TimeoutError, String(err));
      assert.match(err.message, /killed or reached its end of life/);
      assert.equal(await sbx.isRunning(), false);
    });
  });
});

describe('files', () => {
  test('text, bytes and streams are written and read back, relative paths in the home', async () => {
    await onShared(async (sbx) => {
      const info = await sbx.files.write('rw/hello.txt', 'hi there');
      assert.deepEqual(
        { name: info.name, type: info.type, path: info.path },
        { name: 'hello.txt', type: 'file', path: '/home/user/rw/hello.txt' },
      );
      assert.equal(await sbx.files.read('rw/hello.txt'), 'hi there');
      const bytes = randomBytes(100_000);
      const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length);
      await sbx.files.write('/home/user/rw/blob.bin', buffer);
      const back = await sbx.files.read('/home/user/rw/blob.bin', { format: 'bytes' });
      assert.ok(Buffer.from(back).equals(bytes));
      const stream = new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(new TextEncoder().encode('streamed '));
          c.enqueue(new TextEncoder().encode('content'));
          c.close();
        },
      });
      await sbx.files.write('rw/stream.txt', stream);
      const readable = await sbx.files.read('rw/stream.txt', { format: 'stream' });
      const chunks: Uint8Array[] = [];
      for await (const c of readable as unknown as AsyncIterable<Uint8Array>) chunks.push(c);
      assert.equal(Buffer.concat(chunks).toString(), 'streamed content');
      assert.equal(await sbx.files.read('rw/empty.txt').catch(() => 'missing'), 'missing');
      await sbx.files.write('rw/empty.txt', '');
      assert.equal(await sbx.files.read('rw/empty.txt'), '');
    });
  });

  test('many files go in one write, and gzip uploads work', async () => {
    await onShared(async (sbx) => {
      const infos = await sbx.files.write([
        { path: 'many/a.txt', data: 'A' },
        { path: '/tmp/many/b.txt', data: 'B' },
      ]);
      assert.deepEqual(
        infos.map((i) => i.path),
        ['/home/user/many/a.txt', '/tmp/many/b.txt'],
      );
      await sbx.files.write('many/gz.txt', 'compressed', { gzip: true });
      assert.equal(await sbx.files.read('many/gz.txt'), 'compressed');
      const tagged = await sbx.files.write('many/meta.txt', 'x', { metadata: { Owner: 'me' } });
      assert.deepEqual(tagged.metadata, { owner: 'me' });
      assert.deepEqual((await sbx.files.getInfo('many/meta.txt')).metadata, { owner: 'me' });
    });
  });

  test("files written for user are theirs; written for root, root's", async () => {
    await onShared(async (sbx) => {
      await sbx.files.write('owned/u.txt', 'x');
      await sbx.files.write('/tmp/owned-r.txt', 'x', { user: 'root' });
      const u = await sbx.files.getInfo('owned/u.txt');
      const r = await sbx.files.getInfo('/tmp/owned-r.txt');
      assert.deepEqual([u.owner, u.group, r.owner], ['user', 'user', 'root']);
      assert.equal((await sbx.commands.run('stat -c %U ~/owned')).stdout, 'user\n');
    });
  });

  test('getInfo and exists describe an entry as E2B does', async () => {
    await onShared(async (sbx) => {
      await sbx.files.write('info/f.txt', '12345');
      const info = await sbx.files.getInfo('info/f.txt');
      assert.equal(info.name, 'f.txt');
      assert.equal(info.type, FileType.FILE);
      assert.equal(info.path, '/home/user/info/f.txt');
      assert.equal(info.size, 5);
      assert.equal(info.mode, 0o644);
      assert.equal(info.permissions, '-rw-r--r--');
      assert.ok(
        info.modifiedTime instanceof Date &&
          Math.abs(Date.now() - info.modifiedTime.getTime()) < 600_000,
      );
      await sbx.commands.run('ln -s /home/user/info/f.txt ~/info/link');
      const link = await sbx.files.getInfo('info/link');
      assert.equal(link.type, FileType.FILE);
      assert.equal(link.symlinkTarget, '/home/user/info/f.txt');
      assert.equal(await sbx.files.exists('info/f.txt'), true);
      assert.equal(await sbx.files.exists('info/nope'), false);
    });
  });

  test('list walks as deep as asked, sorted by name at each level', async () => {
    await onShared(async (sbx) => {
      await sbx.commands.run(
        'mkdir -p ~/tree/b/b1 ~/tree/c && touch ~/tree/a.txt ~/tree/b/x.txt ~/tree/b/b1/z',
      );
      const names = async (depth?: number): Promise<string[]> =>
        (await sbx.files.list('tree', depth === undefined ? {} : { depth })).map((e) =>
          e.path.slice('/home/user/tree/'.length),
        );
      assert.deepEqual(await names(), ['a.txt', 'b', 'c']);
      assert.deepEqual(await names(3), ['a.txt', 'b', 'b/b1', 'b/b1/z', 'b/x.txt', 'c']);
      const dir = (await sbx.files.list('tree')).find((e) => e.name === 'b')!;
      assert.equal(dir.type, FileType.DIR);
    });
  });

  test('makeDir, rename and remove', async () => {
    await onShared(async (sbx) => {
      assert.equal(await sbx.files.makeDir('made/deep'), true);
      assert.equal(await sbx.files.makeDir('made/deep'), false);
      await sbx.files.write('made/deep/f', 'x');
      const moved = await sbx.files.rename('made/deep/f', 'made/moved/g');
      assert.equal(moved.path, '/home/user/made/moved/g');
      assert.equal(await sbx.files.read('made/moved/g'), 'x');
      await sbx.files.remove('made');
      assert.equal(await sbx.files.exists('made'), false);
      await sbx.files.remove('made'); // missing: no error
    });
  });

  test('watchDir reports creations and writes, nested ones when recursive', async () => {
    await onShared(async (sbx) => {
      await sbx.files.makeDir('watched');
      const events: FilesystemEvent[] = [];
      const handle = await sbx.files.watchDir('watched', (e) => void events.push(e), {
        recursive: true,
        timeoutMs: 0,
      });
      try {
        await sbx.files.write('watched/top.txt', 'one');
        await sbx.files.write('watched/top.txt', 'two');
        await sbx.files.makeDir('watched/sub');
        await eventually('the directory to be watched', () =>
          events.some((e) => e.name === 'sub' && e.type === FilesystemEventType.CREATE),
        );
        await sbx.files.write('watched/sub/inner.txt', 'x');
        await eventually(
          'every event',
          () =>
            events.some(
              (e) => e.name === 'sub/inner.txt' && e.type === FilesystemEventType.CREATE,
            ) && events.some((e) => e.name === 'top.txt' && e.type === FilesystemEventType.WRITE),
        );
      } finally {
        await handle.stop();
      }
    });
  });

  test("the polling watchers (E2B's Python SDK) keep events until they are fetched", async () => {
    await onShared(async (sbx) => {
      await sbx.files.makeDir('polled');
      const created = await rpc(sbx, 'filesystem.Filesystem/CreateWatcher', { path: 'polled' });
      assert.equal(created.status, 200, JSON.stringify(created.body));
      const { watcherId } = created.body as { watcherId: string };
      await sbx.files.write('polled/a.txt', 'a');
      const events: { name: string; type: string }[] = [];
      await eventually('the events', async () => {
        const got = await rpc(sbx, 'filesystem.Filesystem/GetWatcherEvents', { watcherId });
        events.push(...(got.body as { events: { name: string; type: string }[] }).events);
        return events.some((e) => e.name === 'a.txt' && e.type === 'EVENT_TYPE_CREATE');
      });
      assert.equal(
        (await rpc(sbx, 'filesystem.Filesystem/RemoveWatcher', { watcherId })).status,
        200,
      );
    });
  });

  // Forged, expired and missing signatures, and envd's exact error bodies, are
  // test/unit/routes-e2b-envd.test.ts's
  test('signed upload and download URLs work without any header', async () => {
    await onShared(async (sbx) => {
      const upload = await sbx.uploadUrl('signed/up.txt');
      assert.ok(upload.startsWith(`${hostd.e2bUrl}/files?`), upload);
      const form = new FormData();
      form.append('file', new Blob(['via url']), 'up.txt');
      const put = await fetch(upload, { method: 'POST', body: form });
      assert.equal(put.status, 200, await put.clone().text());
      // A plain text field named file is the content too (envd takes it; E2B's tests send it)
      const text = new FormData();
      text.append('file', 'as a field');
      const field = await fetch(await sbx.uploadUrl('signed/field.txt'), {
        method: 'POST',
        body: text,
      });
      assert.deepEqual(
        [field.status, await field.json()],
        [200, [{ name: 'field.txt', path: '/home/user/signed/field.txt', type: 'file' }]],
      );
      assert.equal(await sbx.files.read('signed/field.txt'), 'as a field');
      const download = await sbx.downloadUrl('signed/up.txt', { useSignatureExpiration: 60 });
      const got = await fetch(download);
      assert.equal(got.status, 200);
      assert.equal(await got.text(), 'via url');
    });
  });
});

describe('the native API sees the same sandbox', () => {
  test('a file written through E2B is renamed natively (files/move) and read back', async () => {
    await onShared(async (sbx) => {
      await sbx.files.write('native/a.txt', 'moved');
      const q = (p: string): string => encodeURIComponent(p);
      const res = await hostd.json<{ path: string }>(
        'POST',
        `/v1/sandboxes/${sbx.sandboxId}/files/move?path=${q('/home/user/native/a.txt')}&to=${q('/home/user/native/sub/b.txt')}`,
      );
      assert.deepEqual(res, { status: 200, body: { path: '/home/user/native/sub/b.txt' } });
      assert.equal(await sbx.files.read('native/sub/b.txt'), 'moved');
      assert.equal(await sbx.files.exists('native/a.txt'), false);
    });
  });
});
