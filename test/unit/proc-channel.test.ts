/**
 * The processes port's host side (vm/channels/proc-channel.ts) against the real guest server
 * (guest/agent/proc_server.py) run on this machine: processes with pids, output as bytes, ends,
 * input, signals, listing, reconnecting, flow control, watches, and what a close does.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  ProcChannel,
  ProcChannelError,
  ProcOpError,
  WINDOW,
  type ProcessEnd,
  type ProcessSink,
  type ProcessSpec,
  type ProcStream,
  type WatchEvent,
} from '../../src/vm/channels/proc-channel.js';
import { GuestServer, connectUnix } from '../../testkit/guest-server.js';
import { eventually } from '../../testkit/eventually.js';

async function withGuest(fn: (channel: ProcChannel, dir: string) => Promise<void>): Promise<void> {
  const guest = await GuestServer.start('proc_server.py');
  let channel: ProcChannel | undefined;
  try {
    channel = new ProcChannel(await connectUnix(guest.socketPath));
    const dir = join(guest.dir, 'work');
    mkdirSync(dir);
    await fn(channel, dir);
  } finally {
    channel?.close();
    await guest.stop();
  }
}

const spec = (cmd: string, args: string[], fields: Partial<ProcessSpec> = {}): ProcessSpec => ({
  cmd,
  args,
  envs: {},
  stdin: false,
  timeoutMs: 0,
  ...fields,
});

/** A process sink that records everything, consuming at once unless told to hold. */
class Recorder implements ProcessSink {
  pid = 0;
  stdout = Buffer.alloc(0);
  stderr = Buffer.alloc(0);
  end: ProcessEnd | null = null;
  error: ProcOpError | null = null;
  lost: string | null = null;
  /** Bytes received and not handed back (when `hold`). */
  held = 0;
  stream: ProcStream | null = null;
  readonly started: Promise<void>;
  private startedResolve!: () => void;

  constructor(private readonly hold = false) {
    this.started = new Promise((resolve) => (this.startedResolve = resolve));
  }

  onStarted(pid: number): void {
    this.pid = pid;
    this.startedResolve();
  }

  onOutput(stream: 'stdout' | 'stderr', data: Buffer, bytes: number): void {
    this[stream] = Buffer.concat([this[stream], data]);
    if (this.hold) this.held += bytes;
    else this.stream?.consumed(bytes);
  }

  onEnd(end: ProcessEnd): void {
    this.end = end;
  }

  onError(err: ProcOpError): void {
    this.error = err;
    this.startedResolve();
  }

  onLost(reason: string): void {
    this.lost = reason;
  }

  get over(): boolean {
    return this.end !== null || this.error !== null || this.lost !== null;
  }
}

function run(channel: ProcChannel, s: ProcessSpec, hold = false): Recorder {
  const r = new Recorder(hold);
  r.stream = channel.start(s, r);
  return r;
}

test('a process streams its pid, its output as bytes and its end', async () => {
  await withGuest(async (channel) => {
    const r = run(channel, spec('bash', ['-c', "printf 'a\\xff'; echo err >&2; exit 4"]));
    await eventually('the process to end', () => r.over);
    assert.ok(r.pid > 1);
    assert.deepEqual(r.stdout, Buffer.from([0x61, 0xff]));
    assert.equal(r.stderr.toString(), 'err\n');
    assert.deepEqual(r.end, { exitCode: 4, signal: null, timedOut: false });
  });
});

test('many processes run at once, fed through stdin and listed while they run', async () => {
  await withGuest(async (channel) => {
    const rs = [1, 2, 3].map(() => run(channel, spec('cat', [], { stdin: true })));
    await Promise.all(rs.map((r) => r.started));
    const listed = await channel.list();
    assert.deepEqual(listed.map((p) => p.pid).sort(), rs.map((r) => r.pid).sort());
    for (const r of rs) {
      await channel.input({ pid: r.pid }, Buffer.from(`to ${r.pid}`));
      await channel.closeStdin({ pid: r.pid });
    }
    await eventually('every process to end', () => rs.every((r) => r.over));
    for (const r of rs) assert.equal(r.stdout.toString(), `to ${r.pid}`);
  });
});

test('refusals come back as ProcOpErrors with the guest code', async () => {
  await withGuest(async (channel) => {
    const r = run(channel, spec('true', [], { user: 'no-such-user' }));
    await eventually('the refusal', () => r.over);
    assert.equal(r.error?.code, 'unknown_user');
    const c = run(channel, spec('true', [], { cwd: '/no/such/dir' }));
    await eventually('the refusal', () => c.over);
    assert.deepEqual([c.error?.code, c.error?.path], ['invalid_cwd', '/no/such/dir']);
    await assert.rejects(channel.signal({ pid: 999_999 }, 9), (err: unknown) => {
      assert.ok(err instanceof ProcOpError);
      return err.code === 'not_found';
    });
  });
});

test('a signal ends a process; a lifetime ends it too and says it timed out', async () => {
  await withGuest(async (channel) => {
    const r = run(channel, spec('sleep', ['60']));
    await r.started;
    await channel.signal({ pid: r.pid }, 15);
    await eventually('the end', () => r.over);
    assert.deepEqual(r.end, { exitCode: null, signal: 15, timedOut: false });
    const t = run(channel, spec('sleep', ['60'], { timeoutMs: 200 }));
    await eventually('the lifetime to run out', () => t.over);
    assert.deepEqual(t.end, { exitCode: null, signal: 9, timedOut: true });
  });
});

test('a detached process runs on, and connect attaches to what it prints next', async () => {
  await withGuest(async (channel) => {
    const first = run(channel, spec('cat', [], { stdin: true }));
    await first.started;
    first.stream!.detach();
    const again = new Recorder();
    again.stream = channel.connect({ pid: first.pid }, again);
    await again.started;
    await channel.input({ pid: first.pid }, Buffer.from('later'));
    await channel.closeStdin({ pid: first.pid });
    await eventually('the end', () => again.over);
    assert.equal(again.stdout.toString(), 'later');
    assert.equal(first.end, null, 'the detached stream heard nothing more');
  });
});

test('a stream gets at most WINDOW unconsumed bytes, and all of them once it consumes', async () => {
  await withGuest(async (channel) => {
    const total = 1024 * 1024;
    const r = run(channel, spec('head', ['-c', String(total), '/dev/zero']), true);
    await eventually('the guest to stop for credit', () => r.held >= WINDOW - 64 * 1024);
    assert.ok(r.held <= WINDOW, `${r.held} bytes unconsumed`);
    r.stream!.consumed(r.held);
    // From now on, consume as it comes
    (r as unknown as { hold: boolean }).hold = false;
    await eventually('all of it', () => r.over, { timeoutMs: 30_000 });
    assert.equal(r.stdout.length, total);
  });
});

test('a watch reports events named relative to its directory', async () => {
  await withGuest(async (channel, dir) => {
    const events: WatchEvent[] = [];
    let started = '';
    const stream = channel.watch(
      { path: dir, recursive: true, entries: true },
      {
        onStarted: (path) => (started = path),
        onEvents: (batch, bytes) => {
          events.push(...batch);
          stream.consumed(bytes);
        },
        onError: (err) => assert.fail(err),
        onLost: (reason) => assert.fail(reason),
      },
    );
    await eventually('the watch to start', () => started === dir);
    mkdirSync(join(dir, 'sub'));
    await eventually('the directory to be seen', () => events.some((e) => e.name === 'sub'));
    writeFileSync(join(dir, 'sub', 'f.txt'), 'x');
    await eventually('the nested file to be seen', () =>
      events.some((e) => e.name === 'sub/f.txt' && e.type === 'write'),
    );
    const created = events.find((e) => e.name === 'sub/f.txt' && e.type === 'create')!;
    assert.equal(created.entry?.type, 'file');
    stream.detach();
  });
});

test('closing the channel loses every stream and fails every request', async () => {
  await withGuest(async (channel) => {
    const r = run(channel, spec('sleep', ['60']));
    await r.started;
    channel.close('the VM was destroyed');
    assert.equal(r.lost, 'the VM was destroyed');
    await assert.rejects(channel.list(), (err: unknown) => {
      assert.ok(err instanceof ProcChannelError);
      return err.reason === 'closed';
    });
  });
});
