import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AgentChannel } from '../../src/vm/channels/agent-channel.js';
import type { ExecSink } from '../../src/vm/machine.js';
import { eventually } from '../../testkit/eventually.js';

/** The guest side of both ports, as QEMU's socket chardevs present them: a fake guest. */
class FakeGuest {
  readonly lines: Record<'agent' | 'repl', Record<string, unknown>[]> = { agent: [], repl: [] };
  readonly sockets: Partial<Record<'agent' | 'repl', Socket>> = {};
  private readonly servers: Server[] = [];

  constructor(readonly dir: string) {}

  async listen(): Promise<void> {
    for (const port of ['agent', 'repl'] as const) {
      const server = createServer((socket) => {
        this.sockets[port] = socket;
        let buffer = '';
        socket.setEncoding('utf8');
        socket.on('data', (chunk: string) => {
          buffer += chunk;
          let nl;
          while ((nl = buffer.indexOf('\n')) >= 0) {
            const msg = JSON.parse(buffer.slice(0, nl)) as Record<string, unknown>;
            buffer = buffer.slice(nl + 1);
            this.lines[port].push(msg);
            // The agent answers hello at once
            if (port === 'agent' && msg.op === 'hello')
              this.send('agent', { op: 'hello', nonce: msg.nonce });
          }
        });
      });
      server.listen(join(this.dir, `${port}.sock`));
      await once(server, 'listening');
      this.servers.push(server);
    }
  }

  send(port: 'agent' | 'repl', msg: Record<string, unknown> | string): void {
    this.sockets[port]!.write((typeof msg === 'string' ? msg : JSON.stringify(msg)) + '\n');
  }

  close(): void {
    for (const s of Object.values(this.sockets)) s.destroy();
    for (const s of this.servers) s.close();
  }
}

interface Recorded {
  out: string[];
  exit: Promise<number>;
  /** The exit code the sink was given, as soon as it was given (null before). */
  ended: () => number | null;
  sink: ExecSink;
}

function recorder(): Recorded {
  const out: string[] = [];
  let code: number | null = null;
  let resolve!: (code: number) => void;
  const exit = new Promise<number>((r) => (resolve = r));
  const end = (c: number): void => {
    code = c;
    resolve(c);
  };
  return {
    out,
    exit,
    ended: () => code,
    sink: {
      onOutput: (_stream, data) => out.push(data),
      onExit: end,
      onLost: () => end(-1),
    },
  };
}

const until = (cond: () => boolean): Promise<true> =>
  eventually('the fake guest to have received those messages', () => cond() || null);

async function withChannel(
  fn: (guest: FakeGuest, channel: AgentChannel) => Promise<void>,
): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hostd-channel-'));
  const guest = new FakeGuest(dir);
  let channel: AgentChannel | undefined;
  try {
    await guest.listen();
    channel = await AgentChannel.connect(
      join(dir, 'agent.sock'),
      join(dir, 'repl.sock'),
      Date.now() + 2000,
    );
    await channel.hello(2000, true);
    await fn(guest, channel);
  } finally {
    channel?.close();
    guest.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

test('Python execs go to the REPL port, after one hello per agent hello; bash and cancels go to the agent', async () => {
  await withChannel(async (guest, channel) => {
    const first = channel.exec({ language: 'python', code: 'print(1)' }, recorder().sink);
    channel.exec({ language: 'python', code: 'x' }, recorder().sink);
    const bash = channel.exec({ language: 'bash', code: 'true' }, recorder().sink);
    channel.cancel(first, 'client');
    await until(() => guest.lines.repl.length === 3 && guest.lines.agent.length === 3);
    assert.deepEqual(
      guest.lines.repl.map((m) => m.op),
      ['hello', 'exec', 'exec'],
    );
    assert.deepEqual(guest.lines.repl[1], { op: 'exec', id: first, code: 'print(1)' });
    assert.deepEqual(guest.lines.agent.slice(1), [
      { op: 'exec', id: bash, language: 'bash', code: 'true' },
      { op: 'cancel', id: first, reason: 'client' },
    ]);
    await channel.hello(2000, false);
    channel.exec({ language: 'python', code: 'y' }, recorder().sink);
    await until(() => guest.lines.repl.length === 5);
    assert.equal(guest.lines.repl[3]!.op, 'hello', 'a new agent hello means a new REPL hello');
    // Whether the VM is a new copy (its Python generators shared with siblings) or goes on
    assert.deepEqual(
      guest.lines.agent.filter((m) => m.op === 'hello').map((m) => m.copy),
      [true, false],
    );
  });
});

test('what the REPL port says before its hello echo is discarded; then out and exit reach the exec', async () => {
  await withChannel(async (guest, channel) => {
    const rec = recorder();
    const id = channel.exec({ language: 'python', code: 'print(1)' }, rec.sink);
    await until(() => guest.lines.repl.length === 2);
    guest.send('repl', '{"op":"out","id":1,"str'); // torn line from before a restore
    guest.send('repl', { op: 'out', id, stream: 'stdout', data: 'stale' });
    guest.send('repl', { op: 'hello', nonce: guest.lines.repl[0]!.nonce, pid: 7 });
    guest.send('repl', { op: 'out', id, stream: 'stdout', data: '1' });
    guest.send('repl', { op: 'exit', id, code: 0 });
    assert.equal(await rec.exit, 0);
    assert.deepEqual(rec.out, ['1']);
  });
});

test('repl_died ends the Python execs the worker took, and the cancelled ones; later ones wait', async () => {
  await withChannel(async (guest, channel) => {
    const plain = recorder();
    const timedOut = recorder();
    const bash = recorder();
    channel.exec({ language: 'python', code: 'a' }, plain.sink);
    const t = channel.exec({ language: 'python', code: 'b' }, timedOut.sink);
    const bashId = channel.exec({ language: 'bash', code: 'sleep 1' }, bash.sink);
    channel.cancel(t, 'timeout');
    await until(() => guest.lines.repl.length === 3);
    guest.send('repl', { op: 'hello', nonce: guest.lines.repl[0]!.nonce });
    const later = recorder();
    const laterId = channel.exec({ language: 'python', code: 'c' }, later.sink);
    guest.send('repl', { op: 'repl_died', code: 137, upto: t });
    assert.equal(await plain.exit, 137);
    assert.equal(await timedOut.exit, 124);
    // repl_died is handled as a whole once read: what it did not end, it left running
    assert.equal(later.ended(), null, 'a Python exec the worker had not taken');
    assert.equal(bash.ended(), null, 'a bash exec is not the worker’s');
    guest.send('repl', { op: 'exit', id: laterId, code: 0 });
    assert.equal(await later.exit, 0, 'the next worker runs it');
    guest.send('agent', { op: 'exit', id: bashId, code: 0 });
    assert.equal(await bash.exit, 0, 'the agent ends it');
  });
});

test('a worker that dies holding the REPL hello gets a fresh one', async () => {
  await withChannel(async (guest, channel) => {
    const rec = recorder();
    const id = channel.exec({ language: 'python', code: 'x' }, rec.sink);
    await until(() => guest.lines.repl.length === 2);
    guest.send('repl', { op: 'repl_died', code: 9, upto: id });
    assert.equal(await rec.exit, 9);
    await until(() => guest.lines.repl.length === 3);
    const hello = guest.lines.repl[2]!;
    assert.equal(hello.op, 'hello');
    assert.notEqual(hello.nonce, guest.lines.repl[0]!.nonce);
    guest.send('repl', { op: 'hello', nonce: hello.nonce });
    const next = recorder();
    const nextId = channel.exec({ language: 'python', code: 'y' }, next.sink);
    guest.send('repl', { op: 'exit', id: nextId, code: 0 });
    assert.equal(await next.exit, 0);
  });
});

test('a notebook exec in a context: its fields go to the worker, its start, results, errors and partial lines come back', async () => {
  await withChannel(async (guest, channel) => {
    const seen: unknown[] = [];
    let exited!: (code: number) => void;
    const exit = new Promise<number>((r) => (exited = r));
    const id = channel.exec(
      { language: 'python', code: 'x', context: 'c1', notebook: true },
      {
        onOutput: (stream, data, partial) => seen.push(['out', stream, data, partial]),
        onStart: (count) => seen.push(['start', count]),
        onResult: (data) => seen.push(['result', data]),
        onError: (error) => seen.push(['error', error]),
        onExit: (code) => exited(code),
        onLost: () => exited(-1),
      },
    );
    await until(() => guest.lines.repl.length === 2);
    assert.deepEqual(guest.lines.repl[1], {
      op: 'exec',
      code: 'x',
      context: 'c1',
      notebook: true,
      id,
    });
    guest.send('repl', { op: 'hello', nonce: guest.lines.repl[0]!.nonce });
    guest.send('repl', { op: 'start', id, execution_count: 3 });
    guest.send('repl', { op: 'out', id, stream: 'stdout', data: 'ab', partial: true });
    guest.send('repl', { op: 'result', id, data: { 'text/plain': '1' } });
    guest.send('repl', { op: 'exception', id, name: 'E', value: 'v', traceback: 7 });
    guest.send('repl', { op: 'exit', id, code: 1 });
    assert.equal(await exit, 1);
    assert.deepEqual(seen, [
      ['start', 3],
      ['out', 'stdout', 'ab', true],
      ['result', { 'text/plain': '1' }],
      ['error', { name: 'E', value: 'v', traceback: '' }],
    ]);
  });
});

test('an exec the worker rejects says why before its exit', async () => {
  await withChannel(async (guest, channel) => {
    let rejected = '';
    let exited!: (code: number) => void;
    const exit = new Promise<number>((r) => (exited = r));
    const id = channel.exec(
      { language: 'python', code: 'x', context: 'nope' },
      {
        onOutput: () => undefined,
        onRejected: (why) => (rejected = why),
        onExit: (code) => exited(code),
        onLost: () => exited(-1),
      },
    );
    await until(() => guest.lines.repl.length === 2);
    guest.send('repl', { op: 'hello', nonce: guest.lines.repl[0]!.nonce });
    guest.send('repl', { op: 'exit', id, code: 1, rejected: 'context_not_found' });
    assert.equal(await exit, 1);
    assert.equal(rejected, 'context_not_found');
  });
});

test('context requests take an exec id on the REPL port and resolve with the checked answer', async () => {
  await withChannel(async (guest, channel) => {
    const listed = channel.context({ action: 'list' }, 2000);
    await until(() => guest.lines.repl.length === 2);
    const { id } = guest.lines.repl[1] as { id: number };
    assert.deepEqual(guest.lines.repl[1], { op: 'context', action: 'list', id });
    guest.send('repl', { op: 'hello', nonce: guest.lines.repl[0]!.nonce });
    const contexts = [{ id: 'default', cwd: '/root', execution_count: 2 }];
    guest.send('repl', { op: 'context', id, contexts });
    guest.send('repl', { op: 'exit', id, code: 0 });
    assert.deepEqual(await listed, { contexts });

    const failed = channel.context({ action: 'delete', context: 'x' }, 2000);
    await until(() => guest.lines.repl.length === 3);
    const other = (guest.lines.repl[2] as { id: number }).id;
    guest.send('repl', { op: 'context', id: other, error: 'context_not_found', message: 'm' });
    guest.send('repl', { op: 'exit', id: other, code: 0 });
    assert.deepEqual(await failed, { error: { code: 'context_not_found', message: 'm' } });

    const malformed = channel.context({ action: 'create' }, 2000);
    await until(() => guest.lines.repl.length === 4);
    const third = (guest.lines.repl[3] as { id: number }).id;
    guest.send('repl', { op: 'context', id: third, context: { id: 3 } });
    guest.send('repl', { op: 'exit', id: third, code: 0 });
    assert.equal((await malformed).error?.code, 'bad_answer');
  });
});

test('a context request the worker never answers, or dies in, rejects', async () => {
  await withChannel(async (guest, channel) => {
    await assert.rejects(channel.context({ action: 'list' }, 50), /did not answer within 50 ms/);
    const dying = channel.context({ action: 'list' }, 2000);
    await until(() => guest.lines.repl.length === 3);
    const { id } = guest.lines.repl[2] as { id: number };
    guest.send('repl', { op: 'repl_died', code: 9, upto: id });
    await assert.rejects(dying, /exited before it answered/);
  });
});
