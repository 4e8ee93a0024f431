import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import {
  FileChannel,
  FileChannelError,
  FileOpError,
  type FileChannelOptions,
} from '../../src/vm/channels/file-channel.js';
import { GuestServer, connectUnix } from '../../testkit/guest-server.js';

/** A FileChannel connected to the real guest files server (files_server.py), run locally. */
async function withGuest(
  fn: (channel: FileChannel, dir: string) => Promise<void>,
  options: FileChannelOptions = {},
): Promise<void> {
  const guest = await GuestServer.start('files_server.py');
  let channel: FileChannel | undefined;
  try {
    channel = new FileChannel(await connectUnix(guest.socketPath), options);
    const dir = join(guest.dir, 'files');
    mkdirSync(dir);
    await fn(channel, dir);
  } finally {
    channel?.close();
    await guest.stop();
  }
}

/** `total` bytes of a repeating pattern, produced in `chunk`-byte pieces, never held whole. */
function pattern(total: number, chunk = 64 * 1024): Readable {
  let sent = 0;
  return new Readable({
    read() {
      if (sent >= total) return void this.push(null);
      const n = Math.min(chunk, total - sent);
      const piece = Buffer.alloc(n);
      for (let i = 0; i < n; i++) piece[i] = (sent + i) % 251;
      sent += n;
      this.push(piece);
    },
  });
}

async function rejectsWith(promise: Promise<unknown>, code: string): Promise<void> {
  await assert.rejects(promise, (err: unknown) => {
    assert.ok(err instanceof FileOpError, `expected a FileOpError, got ${String(err)}`);
    assert.equal(err.code, code);
    return true;
  });
}

async function rejectsFailure(promise: Promise<unknown>, reason: string): Promise<void> {
  await assert.rejects(promise, (err: unknown) => {
    assert.ok(err instanceof FileChannelError, `expected a FileChannelError, got ${String(err)}`);
    assert.equal(err.reason, reason);
    return true;
  });
}

async function collect(stream: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

test('a file put then read comes back whole, its size announced before its bytes', async () => {
  await withGuest(async (channel, dir) => {
    const path = join(dir, 'sub', 'small.txt');
    const written = await channel.putFile(path, Buffer.from('hello'), { mode: 0o600 });
    assert.deepEqual(written, { path, size: 5 });
    assert.equal(statSync(path).mode & 0o777, 0o600);
    const download = await channel.readFile(path);
    assert.equal(download.size, 5);
    assert.equal((await collect(download.stream)).toString(), 'hello');
    await download.done;
  });
});

test('uploads and downloads stream through with backpressure', async () => {
  await withGuest(async (channel, dir) => {
    const path = join(dir, 'big.bin');
    const total = 24 * 1024 * 1024 + 123;
    const upload = channel.writeFile(path);
    await pipeline(pattern(total), upload.sink);
    assert.deepEqual(await upload.done, { path, size: total });

    const download = await channel.readFile(path);
    assert.equal(download.size, total);
    let received = 0;
    let maxBuffered = 0;
    let mismatch = -1;
    for await (const chunk of download.stream) {
      const buf = chunk as Buffer;
      for (let i = 0; i < buf.length && mismatch < 0; i += 4093) {
        if (buf[i] !== (received + i) % 251) mismatch = received + i;
      }
      received += buf.length;
      maxBuffered = Math.max(maxBuffered, download.stream.readableLength);
      await new Promise((r) => setImmediate(r)); // a consumer slower than the guest
    }
    await download.done;
    assert.equal(received, total);
    assert.equal(mismatch, -1);
    assert.ok(maxBuffered <= 2 * 1024 * 1024, `buffered ${maxBuffered} bytes at most`);
  });
});

test("the guest's refusals arrive as FileOpError codes, and the channel goes on", async () => {
  await withGuest(async (channel, dir) => {
    writeFileSync(join(dir, 'f'), 'x');
    mkdirSync(join(dir, 'd'));
    await rejectsWith(channel.readFile(join(dir, 'missing')), 'file_not_found');
    await rejectsWith(channel.readFile(join(dir, 'd')), 'is_a_directory');
    await rejectsWith(channel.list(join(dir, 'f')), 'not_a_directory');
    await rejectsWith(channel.putFile(join(dir, 'd'), Buffer.from('x')), 'is_a_directory');
    await rejectsWith(channel.putFile(join(dir, 'f', 'g'), Buffer.from('x')), 'not_a_directory');
    await rejectsWith(channel.stat('relative/path'), 'invalid_path');
    await rejectsWith(channel.remove(join(dir, 'd')), 'is_a_directory');
    await rejectsWith(channel.tarOut(join(dir, 'missing')), 'file_not_found');
    assert.equal((await channel.stat(join(dir, 'f'))).size, 1);
  });
});

test("the guest's reason and the tar member come with its refusal, its own words apart", async () => {
  await withGuest(async (channel) => {
    await assert.rejects(channel.readFile('/proc/self/mem'), (err: unknown) => {
      assert.ok(err instanceof FileOpError, String(err));
      assert.deepEqual([err.code, err.reason, err.member], ['unsupported_file', 'io', null]);
      assert.ok(err.detail.length > 0, 'the guest words stay available for the log');
      return true;
    });
  });
});

test('a refused upload fails its sink too, so a pipeline stops instead of sending it all', async () => {
  await withGuest(async (channel, dir) => {
    mkdirSync(join(dir, 'd'));
    const upload = channel.writeFile(join(dir, 'd'));
    const source = pattern(64 * 1024 * 1024);
    await rejectsWith(pipeline(source, upload.sink), 'is_a_directory');
    await rejectsWith(upload.done, 'is_a_directory');
    assert.ok(source.destroyed);
  });
});

test('list, stat, mkdir and remove', async () => {
  await withGuest(async (channel, dir) => {
    assert.equal(await channel.mkdir(join(dir, 'a', 'b')), join(dir, 'a', 'b'));
    await channel.putFile(join(dir, 'a', 'file'), Buffer.from('12345'));
    const entries = await channel.list(join(dir, 'a'));
    assert.deepEqual(
      entries.map((e) => [e.name, e.type, e.size]),
      [
        ['b', 'dir', entries[0]!.size],
        ['file', 'file', 5],
      ],
    );
    assert.equal(entries[1]!.mode, 0o644);
    assert.equal(entries[1]!.path, join(dir, 'a', 'file'));
    assert.equal((await channel.stat(join(dir, 'a'))).type, 'dir');
    await channel.remove(join(dir, 'a'), { recursive: true });
    assert.equal(existsSync(join(dir, 'a')), false);
  });
});

test('a directory goes out as a tar and comes back in', async () => {
  await withGuest(async (channel, dir) => {
    await channel.putFile(join(dir, 'src', 'x.txt'), Buffer.from('x'));
    await channel.putFile(join(dir, 'src', 'deep', 'y.bin'), Buffer.alloc(300_000, 7));
    const tar = await channel.tarOut(join(dir, 'src'));
    assert.equal(tar.size, null);
    const bytes = await collect(tar.stream);
    await tar.done;
    const extract = channel.tarIn(join(dir, 'copy'));
    await pipeline(Readable.from([bytes]), extract.sink);
    assert.deepEqual(await extract.done, { path: join(dir, 'copy'), files: 3, size: 300_001 });
    assert.deepEqual(readFileSync(join(dir, 'copy', 'deep', 'y.bin')), Buffer.alloc(300_000, 7));
  });
});

test('a second operation while one runs is refused as busy', async () => {
  await withGuest(async (channel, dir) => {
    const upload = channel.writeFile(join(dir, 'slow'));
    assert.equal(channel.busy, true);
    await rejectsFailure(channel.stat(dir), 'busy');
    upload.sink.end(Buffer.from('done'));
    await upload.done;
    assert.equal(channel.busy, false);
    assert.equal((await channel.stat(join(dir, 'slow'))).size, 4);
  });
});

test('an upload cut off midway is cancelled in the guest and leaves nothing behind', async () => {
  await withGuest(async (channel, dir) => {
    const upload = channel.writeFile(join(dir, 'new', 'cut.bin'));
    upload.sink.write(Buffer.alloc(100_000, 1));
    upload.sink.write(Buffer.alloc(100_000, 2));
    upload.sink.destroy(new Error('client went away'));
    await rejectsFailure(upload.done, 'cancelled');
    assert.deepEqual(readdirSync(dir), []);
    assert.deepEqual(await channel.putFile(join(dir, 'next'), Buffer.from('ok')), {
      path: join(dir, 'next'),
      size: 2,
    });
  });
});

test('a download abandoned midway is cancelled and the channel goes on', async () => {
  await withGuest(async (channel, dir) => {
    const path = join(dir, 'big');
    await pipeline(pattern(32 * 1024 * 1024), channel.writeFile(path).sink);
    const download = await channel.readFile(path);
    for await (const chunk of download.stream) {
      assert.ok((chunk as Buffer).length > 0);
      break; // leaving the loop destroys the stream
    }
    await rejectsFailure(download.done, 'cancelled');
    assert.equal((await channel.stat(path)).size, 32 * 1024 * 1024);
  });
});

test('an abort signal cancels an operation', async () => {
  await withGuest(async (channel, dir) => {
    const controller = new AbortController();
    const upload = channel.writeFile(join(dir, 'f'), { signal: controller.signal });
    upload.sink.write(Buffer.alloc(1000));
    controller.abort();
    await rejectsFailure(upload.done, 'cancelled');
    await rejectsFailure(channel.stat(dir, { signal: AbortSignal.abort() }), 'cancelled');
    assert.deepEqual(readdirSync(dir), []);
  });
});

test('after resync() (a restore), the next operation says hello first and works', async () => {
  await withGuest(async (channel, dir) => {
    await channel.putFile(join(dir, 'a'), Buffer.from('1'));
    channel.resync();
    assert.equal((await channel.stat(join(dir, 'a'))).size, 1);
  });
});

test('a closed channel fails the running operation and refuses the next', async () => {
  await withGuest(async (channel, dir) => {
    const closed = once(channel, 'close');
    const upload = channel.writeFile(join(dir, 'x'));
    upload.sink.write(Buffer.from('a'));
    channel.close('the VM died');
    assert.deepEqual(await closed, ['the VM died']);
    await rejectsFailure(upload.done, 'closed');
    await rejectsFailure(channel.stat(dir), 'closed');
    assert.equal(channel.closed, true);
  });
});
