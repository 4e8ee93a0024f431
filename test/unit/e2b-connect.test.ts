/**
 * The Connect codec of the E2B front (src/api/e2b/connect.ts) and envd's messages
 * (envd-messages.ts), as E2B's SDKs read them (docs/e2b.md, "envd"): enveloped streams that end
 * with an end-stream envelope (errors inside it, with HTTP 200), keepalives while silent, the
 * client's deadline, and proto3 JSON of process ends and entries.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import Fastify, { type FastifyInstance } from 'fastify';
import { fail } from '../../src/errors.js';
import {
  ServerStream,
  envelope,
  sendUnary,
  streamRequest,
  unaryRequest,
} from '../../src/api/e2b/connect.js';
import { endEvent, entryInfo, timestamp, userOf } from '../../src/api/e2b/envd-messages.js';
import type { DetailedEntry } from '../../src/core/sandbox-manager.js';
import { eventually } from '../../testkit/eventually.js';

/** Splits a body into envelopes: [flags, JSON]. */
function envelopes(body: Buffer): [number, unknown][] {
  const out: [number, unknown][] = [];
  let off = 0;
  while (off + 5 <= body.length) {
    const flags = body.readUInt8(off);
    const len = body.readUInt32BE(off + 1);
    out.push([flags, JSON.parse(body.subarray(off + 5, off + 5 + len).toString())]);
    off += 5 + len;
  }
  assert.equal(off, body.length, 'the body is whole envelopes');
  return out;
}

let app: FastifyInstance;
let url = '';
/** What the streaming route saw: its signal, and a gate the test opens. */
const seen: { aborted: boolean; release: (() => void) | null } = { aborted: false, release: null };

before(async () => {
  // As hostd's own servers (src/api/server.ts, src/api/e2b/server.ts): close() ends every
  // connection. With Fastify's default ('idle' only), the server end of the aborted stream's
  // connection was left open in some runs, and close() waited ~70 s for it (the file's
  // process, and CI, with it).
  app = Fastify({ forceCloseConnections: true });
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_r, raw, done) =>
    done(null, (raw as string) ? JSON.parse(raw as string) : undefined),
  );
  app.addContentTypeParser('application/connect+json', { parseAs: 'buffer' }, (_r, b, done) =>
    done(null, b),
  );
  app.setErrorHandler((err, _req, reply) => reply.code(400).send({ message: String(err) }));
  app.post('/test.Echo/Unary', async (req, reply) => sendUnary(reply, { got: unaryRequest(req) }));
  app.post('/test.Echo/Stream', async (req, reply) => {
    const stream = new ServerStream(req, reply, { keepalive: { keepalive: {} }, what: 'the echo' });
    if (!stream.open) return;
    try {
      const msg = streamRequest(req);
      seen.aborted = false;
      stream.signal.addEventListener('abort', () => (seen.aborted = true));
      await stream.send({ first: msg });
      if (msg.wait) await new Promise<void>((r) => (seen.release = r));
      if (msg.fail) throw fail('processNotFound', 'pid 7');
      await stream.send({ second: true });
      stream.end();
    } catch (err) {
      stream.end(err);
    }
  });
  url = await app.listen({ host: '127.0.0.1', port: 0 });
});

after(async () => {
  seen.release?.();
  await app.close();
});

const post = (
  path: string,
  body: Buffer | string,
  headers: Record<string, string>,
): Promise<Response> => fetch(url + path, { method: 'POST', body: body as BodyInit, headers });

describe('unary calls', () => {
  test('JSON in, JSON out with the JSON content type', async () => {
    const res = await post('/test.Echo/Unary', '{"a":1}', { 'content-type': 'application/json' });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^application\/json/);
    assert.deepEqual(await res.json(), { got: { a: 1 } });
  });

  test('an empty body is the empty message', async () => {
    const res = await post('/test.Echo/Unary', '', { 'content-type': 'application/json' });
    assert.deepEqual(await res.json(), { got: {} });
  });
});

describe('server streams', () => {
  const stream = (msg: unknown, headers: Record<string, string> = {}): Promise<Response> =>
    post('/test.Echo/Stream', envelope(msg), {
      'content-type': 'application/connect+json',
      ...headers,
    });

  test('messages come in envelopes and the last one is an empty end-stream', async () => {
    const res = await stream({ hi: 1 });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), 'application/connect+json');
    assert.deepEqual(envelopes(Buffer.from(await res.arrayBuffer())), [
      [0, { first: { hi: 1 } }],
      [0, { second: true }],
      [2, {}],
    ]);
  });

  test('an error ends the stream inside its end-stream envelope, with HTTP 200', async () => {
    const res = await stream({ fail: true });
    assert.equal(res.status, 200);
    const all = envelopes(Buffer.from(await res.arrayBuffer()));
    assert.deepEqual(all.at(-1), [
      2,
      { error: { code: 'not_found', message: 'process with pid 7 not found' } },
    ]);
  });

  test('a request that is not one envelope is refused in the end-stream envelope', async () => {
    const res = await post('/test.Echo/Stream', Buffer.from('{"raw":true}'), {
      'content-type': 'application/connect+json',
    });
    const [[flags, body]] = envelopes(Buffer.from(await res.arrayBuffer())) as [
      [number, { error: { code: string } }],
    ];
    assert.equal(flags, 2);
    assert.equal(body.error.code, 'invalid_argument');
  });

  test('while silent for Keepalive-Ping-Interval seconds, the stream sends keepalives', async () => {
    const res = await stream({ wait: true }, { 'keepalive-ping-interval': '1' });
    const reader = res.body!.getReader();
    let got = Buffer.alloc(0);
    await eventually(
      'a keepalive',
      async () => {
        const { value } = await reader.read();
        got = Buffer.concat([got, Buffer.from(value ?? [])]);
        return envelopes(got).some(([, m]) => JSON.stringify(m) === '{"keepalive":{}}');
      },
      { timeoutMs: 20_000 },
    );
    seen.release!();
    await reader.cancel();
  });

  test('past Connect-Timeout-Ms the stream ends with deadline_exceeded and its work stops', async () => {
    const res = await stream({ wait: true }, { 'connect-timeout-ms': '200' });
    const all = envelopes(Buffer.from(await res.arrayBuffer()));
    const [flags, last] = all.at(-1) as [number, { error: { code: string; message: string } }];
    assert.equal(flags, 2);
    assert.equal(last.error.code, 'deadline_exceeded');
    assert.match(last.error.message, /the echo ran past its timeout of 200 ms/);
    assert.equal(seen.aborted, true);
    seen.release!();
  });

  test('a client that goes away aborts the stream', async () => {
    seen.release = null;
    const controller = new AbortController();
    const pending = fetch(`${url}/test.Echo/Stream`, {
      method: 'POST',
      body: envelope({ wait: true }) as BodyInit,
      headers: { 'content-type': 'application/connect+json' },
      signal: controller.signal,
    }).then((r) => r.body?.getReader().read());
    await eventually('the route to wait', () => seen.release !== null);
    controller.abort();
    await pending.catch(() => undefined);
    await eventually('the route to see it', () => seen.aborted);
    seen.release!();
  });
});

describe('envd messages', () => {
  test('a process end reads as Go prints a ProcessState', () => {
    assert.deepEqual(endEvent({ exitCode: 0, signal: null, timedOut: false }), {
      exited: true,
      status: 'exit status 0',
    });
    assert.deepEqual(endEvent({ exitCode: 2, signal: null, timedOut: false }), {
      exitCode: 2,
      exited: true,
      status: 'exit status 2',
      error: 'exit status 2',
    });
    assert.deepEqual(endEvent({ exitCode: null, signal: 9, timedOut: false }), {
      exitCode: -1,
      status: 'signal: killed',
      error: 'signal: killed',
    });
  });

  test('timestamps are RFC 3339 with 0, 3, 6 or 9 fractional digits', () => {
    assert.equal(timestamp('1700000000000000000'), '2023-11-14T22:13:20Z');
    assert.equal(timestamp('1700000000120000000'), '2023-11-14T22:13:20.120Z');
    assert.equal(timestamp('1700000000123456000'), '2023-11-14T22:13:20.123456Z');
    assert.equal(timestamp('1700000000123456789'), '2023-11-14T22:13:20.123456789Z');
  });

  const base: DetailedEntry = {
    name: 'f',
    path: '/home/user/f',
    type: 'file',
    size: 5,
    mode: 0o644,
    mtime_ms: 1700000000000,
    mtime_ns: '1700000000000000000',
    owner: 'user',
    group: 'user',
    permissions: '-rw-r--r--',
  };

  test('an entry: int64 size as a string, enum names, defaults left out', () => {
    assert.deepEqual(entryInfo(base), {
      name: 'f',
      type: 'FILE_TYPE_FILE',
      path: '/home/user/f',
      size: '5',
      mode: 0o644,
      permissions: '-rw-r--r--',
      owner: 'user',
      group: 'user',
      modifiedTime: '2023-11-14T22:13:20Z',
    });
    assert.equal(entryInfo({ ...base, size: 0 }).size, undefined);
  });

  test("a link shows its target's type and mode and where it resolves; a dangling one no type", () => {
    const link: DetailedEntry = {
      ...base,
      type: 'symlink',
      mode: 0o777,
      permissions: 'Lrwxrwxrwx',
      target: 'd',
      resolved: '/home/user/d',
      target_type: 'dir',
      target_mode: 0o755,
    };
    const info = entryInfo(link);
    assert.deepEqual(
      [info.type, info.mode, info.symlinkTarget, info.permissions],
      ['FILE_TYPE_DIRECTORY', 0o755, '/home/user/d', 'Lrwxrwxrwx'],
    );
    const dangling = entryInfo({
      ...link,
      target_type: null,
      target_mode: null,
      resolved: link.path,
    });
    assert.equal(dangling.type, undefined);
  });

  test("the user is Basic auth's name, else user", () => {
    const req = (authorization?: string): Parameters<typeof userOf>[0] =>
      ({ headers: authorization ? { authorization } : {} }) as Parameters<typeof userOf>[0];
    assert.equal(userOf(req()), 'user');
    assert.equal(userOf(req(`Basic ${Buffer.from('root:').toString('base64')}`)), 'root');
    assert.throws(() => userOf(req('Bearer x')));
  });
});
