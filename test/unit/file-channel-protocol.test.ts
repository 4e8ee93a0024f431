/**
 * The host side of the files port against a scripted guest: what a restored, confused or
 * hostile guest can send must end an operation cleanly, never hang or crash hostd.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  FileChannel,
  FileChannelError,
  type FileChannelOptions,
} from '../../src/vm/channels/file-channel.js';
import { Kind, encodeFrame, jsonFrame } from '../../src/vm/channels/port-frames.js';
import { connectUnix } from '../../testkit/guest-server.js';
import { ScriptedGuest } from '../helpers/scripted-guest.js';

async function withScriptedGuest(
  fn: (guest: ScriptedGuest, channel: FileChannel) => Promise<void>,
  options: FileChannelOptions = {},
): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hostd-files-proto-'));
  const guest = await ScriptedGuest.start(join(dir, 'files.sock'));
  let channel: FileChannel | undefined;
  try {
    channel = new FileChannel(await connectUnix(join(dir, 'files.sock')), options);
    await fn(guest, channel);
  } finally {
    channel?.close();
    guest.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function rejectsFailure(promise: Promise<unknown>, reason: string): Promise<void> {
  await assert.rejects(promise, (err: unknown) => {
    assert.ok(err instanceof FileChannelError, `expected a FileChannelError, got ${String(err)}`);
    assert.equal(err.reason, reason);
    return true;
  });
}

const entry = { name: 'x', path: '/x', type: 'file', size: 1, mode: 420, mtime_ms: 5 };

test('everything the guest sends before its answer to the hello is discarded', async () => {
  await withScriptedGuest(async (guest, channel) => {
    const stat = channel.stat('/x');
    const hello = await guest.next('hello');
    const request = await guest.next('stat');
    guest.send(
      Buffer.from('torn line from before the snapshot'),
      jsonFrame(request.id, { op: 'done', ok: true, entry: { ...entry, name: 'stale' } }),
      guest.helloReply('an older nonce'),
      jsonFrame(request.id, { op: 'done', ok: true, entry: { ...entry, name: 'stale2' } }),
      guest.helloReply(hello.msg!.nonce),
      jsonFrame(request.id, { op: 'done', ok: true, entry }),
    );
    assert.deepEqual(await stat, entry);
    assert.equal(guest.syncs, 1);
  });
});

test('a hello goes out with the first operation only, and again after resync()', async () => {
  await withScriptedGuest(async (guest, channel) => {
    for (const expectHello of [true, false, 'resync'] as const) {
      if (expectHello === 'resync') channel.resync();
      const stat = channel.stat('/x');
      if (expectHello) {
        guest.send(guest.helloReply((await guest.next('hello')).msg!.nonce));
      }
      const request = await guest.next('stat');
      guest.send(jsonFrame(request.id, { op: 'done', ok: true, entry }));
      await stat;
    }
    assert.equal(guest.syncs, 2);
  });
});

test('an impossible frame fails the operation as a protocol error; the next one resynchronises', async () => {
  await withScriptedGuest(async (guest, channel) => {
    const stat = channel.stat('/x');
    guest.send(guest.helloReply((await guest.next('hello')).msg!.nonce));
    const request = await guest.next('stat');
    guest.send(encodeFrame(0x99, request.id, Buffer.from('?')));
    await rejectsFailure(stat, 'protocol');
    const again = channel.stat('/x');
    guest.send(guest.helloReply((await guest.next('hello')).msg!.nonce));
    guest.send(jsonFrame((await guest.next('stat')).id, { op: 'done', ok: true, entry }));
    assert.deepEqual(await again, entry);
  });
});

test('malformed answers are protocol errors, not exceptions', async () => {
  await withScriptedGuest(async (guest, channel) => {
    const answers: Record<string, unknown>[] = [
      { op: 'done', ok: true, entry: { ...entry, size: -1 } },
      { op: 'done', ok: true, entry: { ...entry, type: 'device' } },
      { op: 'done', ok: true },
      { op: 'what' },
    ];
    for (const answer of answers) {
      const stat = channel.stat('/x');
      // every protocol error makes the next operation start with a hello
      guest.send(guest.helloReply((await guest.next('hello')).msg!.nonce));
      guest.send(jsonFrame((await guest.next('stat')).id, answer));
      await rejectsFailure(stat, 'protocol');
    }
  });
});

test('a download longer than announced is a protocol error', async () => {
  await withScriptedGuest(async (guest, channel) => {
    const read = channel.readFile('/x');
    guest.send(guest.helloReply((await guest.next('hello')).msg!.nonce));
    const request = await guest.next('read');
    guest.send(
      jsonFrame(request.id, { op: 'head', size: 3 }),
      encodeFrame(Kind.data, request.id, Buffer.from('four')),
    );
    const download = await read;
    await rejectsFailure(download.done, 'protocol');
    assert.equal(download.stream.destroyed, true);
  });
});

test('a guest that never answers the hello fails the operation with a timeout', async () => {
  await withScriptedGuest(
    async (guest, channel) => {
      await rejectsFailure(channel.stat('/x'), 'timeout');
      assert.equal(channel.busy, false);
      assert.equal(guest.syncs, 1);
    },
    { helloTimeoutMs: 50 },
  );
});

test('a cancelled operation the guest never ends frees the channel after cancelTimeoutMs', async () => {
  await withScriptedGuest(
    async (guest, channel) => {
      const controller = new AbortController();
      const stat = channel.stat('/x', { signal: controller.signal });
      guest.send(guest.helloReply((await guest.next('hello')).msg!.nonce));
      const request = await guest.next('stat');
      controller.abort();
      assert.equal((await guest.next('cancel')).id, request.id);
      await rejectsFailure(stat, 'timeout');
      const next = channel.stat('/x');
      await guest.next('hello'); // resynchronises: the guest may still be busy with the old one
      await rejectsFailure(next, 'timeout');
    },
    { cancelTimeoutMs: 50, helloTimeoutMs: 50 },
  );
});

test('the guest closing the port fails the running operation', async () => {
  await withScriptedGuest(async (guest, channel) => {
    const stat = channel.stat('/x');
    await guest.next('hello');
    guest.socket.destroy();
    await rejectsFailure(stat, 'closed');
    assert.equal(channel.closed, true);
  });
});
