/**
 * Route tests of envd as the E2B front serves it (docs/e2b.md, "Commands" and "Files";
 * `E2b-Sandbox-Port: 49983`), over a manager on the fake hypervisor through `inject()`: which
 * sandbox a request is for and its access token, the Connect protocol's framing and error codes
 * (a unary error in the status and body, a stream's in its end-stream envelope with HTTP 200),
 * envd's REST `/files` with its exact error bodies and signed URLs. What the commands and files
 * do in a real guest, and that E2B's published SDK reads these answers, is
 * test/integration/e2b-envd.test.ts's.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { Errors } from '../../src/errors.js';
import { eventually } from '../../testkit/eventually.js';
import {
  E2B_KEY,
  connectError,
  e2bErrorBody,
  enveloped,
  startE2bServer,
  streamOf,
  type E2bSandbox,
  type TestE2bServer,
} from '../helpers/e2b-server.js';
import { E2B_ROUTE_AREAS, assertAreaCovered } from '../helpers/routes.js';

const UNKNOWN = `sbx_${'0'.repeat(32)}`;
const UNARY = { 'content-type': 'application/json' };
const STREAM = { 'content-type': 'application/connect+json' };
/** A signed URL is fetched with no header at all. */
const BARE = {
  'e2b-sandbox-id': undefined,
  'e2b-sandbox-port': undefined,
  'x-access-token': undefined,
};
const b64 = (text: string): string => Buffer.from(text).toString('base64');
const json = <T = Record<string, unknown>>(res: { body: string }): T => JSON.parse(res.body) as T;
/** HTTP Basic auth as the SDKs send the user: the name and an empty password. */
const asUser = (user: string) => ({ authorization: `Basic ${b64(`${user}:`)}` });

/** envd's signature of a `/files` URL, as E2B's SDK makes it (sandbox/signature.ts). */
function sign(path: string, op: 'read' | 'write', user: string, token: string, exp?: number) {
  const raw = `${path}:${op}:${user}:${token}${exp === undefined ? '' : `:${exp}`}`;
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

/** The envd routes that take the access token, as `[method, url]`. */
const TOKEN_ROUTES = Object.keys(E2B_ROUTE_AREAS)
  .filter((r) => r.startsWith('envd ') && !r.endsWith(' /health'))
  .map((r) => r.split(' ').slice(1) as ['GET' | 'POST', string]);

describe('envd on the E2B front', () => {
  let s: TestE2bServer;
  let sbx: E2bSandbox;
  let other: E2bSandbox;
  before(async () => {
    s = await startE2bServer();
    sbx = await s.sandbox();
    other = await s.sandbox();
  });
  after(() => s.close());

  /** A unary Connect call to `sbx` (or `to`). */
  const unary = (method: string, body: unknown = {}, headers = {}, to?: E2bSandbox) =>
    s.envd(to ?? sbx, {
      method: 'POST',
      url: `/${method}`,
      headers: { ...UNARY, ...headers },
      payload: JSON.stringify(body),
    });
  /** A server-streaming Connect call: one enveloped message. */
  const stream = (method: string, body: unknown, headers = {}, to?: E2bSandbox) =>
    s.envd(to ?? sbx, {
      method: 'POST',
      url: `/${method}`,
      headers: { ...STREAM, ...headers },
      payload: enveloped(body),
    });
  /** The pids of `sbx`'s running commands (with `tag`). */
  const pids = async (tag?: string): Promise<number[]> => {
    const res = await unary('process.Process/List');
    return json<{ processes: { pid: number; tag?: string }[] }>(res)
      .processes.filter((p) => tag === undefined || p.tag === tag)
      .map((p) => p.pid);
  };
  /** The pid of `sbx`'s command tagged `tag`, once it runs. */
  const running = async (tag: string): Promise<number> =>
    await eventually(`the command tagged ${tag} to be listed`, async () => (await pids(tag))[0]);
  const write = (path: string, content: string, to = sbx) =>
    s.envd(to, {
      method: 'POST',
      url: `/files?path=${encodeURIComponent(path)}`,
      headers: { 'content-type': 'application/octet-stream' },
      payload: content,
    });

  describe('which sandbox, and its access token', () => {
    test('a request for no sandbox, an unknown one or a paused one is 502, as E2B answers', async () => {
      const list = await unary('process.Process/List', {}, { 'e2b-sandbox-id': undefined });
      assert.equal(list.statusCode, 502);
      assert.equal(connectError(list).code, 'unavailable');
      const unknown = await unary('process.Process/List', {}, { 'e2b-sandbox-id': UNKNOWN });
      assert.equal(connectError(unknown).code, 'unavailable');

      const paused = await s.sandbox();
      const pause = await s.inject({ method: 'POST', url: `/sandboxes/${paused.id}/pause` });
      assert.equal(pause.statusCode, 204);
      const health = await s.envd(paused, { url: '/health' });
      assert.equal(health.statusCode, 502);
      assert.deepEqual(json(health), {
        code: 502,
        message: Errors.sandboxNotRunning.message(paused.id),
        error_code: Errors.sandboxNotRunning.code,
        sandboxId: paused.id,
      });
    });

    test("every route but /health takes the sandbox's own access token in X-Access-Token", async () => {
      for (const [method, url] of TOKEN_ROUTES) {
        // none, another sandbox's, the interpreter's traffic token, the API key
        for (const token of [undefined, other.accessToken, sbx.trafficToken, E2B_KEY]) {
          // without a token, /files checks a signature instead (below)
          if (url === '/files' && token === undefined) continue;
          const res = await s.envd(sbx, { method, url, headers: { 'x-access-token': token } });
          assert.equal(res.statusCode, 401, `${method} ${url}`);
          if (url === '/files') {
            // envd's own REST body, with hostd's code
            assert.equal(e2bErrorBody(res).error_code, Errors.invalidAccessToken.code);
          } else {
            // a stream refused before it opened is refused as a unary call is
            assert.deepEqual(connectError(res), {
              code: 'unauthenticated',
              message: Errors.invalidAccessToken.message(),
            });
          }
        }
      }
    });

    test('/health answers 204 without a token while the sandbox runs', async () => {
      const res = await s.envd(sbx, { url: '/health', headers: { 'x-access-token': undefined } });
      assert.equal(res.statusCode, 204);
      assert.equal(res.body, '');
    });

    test('an unknown RPC is unimplemented, an unknown path 404, another port 501', async () => {
      const rpc = await unary('process.Process/Resize');
      assert.equal(connectError(rpc).code, 'unimplemented');
      const path = await s.envd(sbx, { url: '/nope' });
      assert.equal(path.statusCode, 404);
      assert.equal(e2bErrorBody(path).error_code, Errors.routeNotFound.code);
      const port = await s.envd(sbx, { url: '/', headers: { 'e2b-sandbox-port': '8080' } });
      assert.equal(port.statusCode, 501);
      assert.equal(e2bErrorBody(port).error_code, Errors.notSupported.code);
    });
  });

  describe('the Connect protocol', () => {
    test('a unary call is JSON both ways; an empty body is the empty message', async () => {
      const res = await s.envd(sbx, {
        method: 'POST',
        url: '/process.Process/List',
        headers: UNARY,
      });
      assert.equal(res.statusCode, 200, res.body);
      assert.equal(res.headers['content-type'], 'application/json; charset=utf-8');
      assert.deepEqual(json(res), { processes: [] });
    });

    test('a unary call of another content type, or not a JSON object, is invalid_argument', async () => {
      const text = await unary('process.Process/List', {}, { 'content-type': 'text/plain' });
      assert.equal(connectError(text).code, 'invalid_argument');
      const list = await unary('process.Process/List', []);
      assert.equal(connectError(list).code, 'invalid_argument');
      const broken = await s.envd(sbx, {
        method: 'POST',
        url: '/process.Process/List',
        headers: UNARY,
        payload: '{"processes":',
      });
      assert.equal(connectError(broken).code, 'invalid_argument');
    });

    test('a stream is envelopes: start, the output, the end, then an empty end-stream', async () => {
      const res = await stream('process.Process/Start', {
        process: { cmd: 'echo', args: ['hi', 'there'] },
      });
      assert.equal(res.headers['cache-control'], 'no-store');
      const { messages, end } = streamOf(res);
      assert.deepEqual(end, {});
      const pid = (messages[0] as { event: { start: { pid: number } } }).event.start.pid;
      assert.ok(Number.isInteger(pid));
      assert.deepEqual(messages.slice(1), [
        { event: { data: { stdout: b64('hi there\n') } } },
        { event: { end: { exited: true, status: 'exit status 0' } } },
      ]);
      const failed = streamOf(
        await stream('process.Process/Start', { process: { cmd: 'exit', args: ['3'] } }),
      );
      assert.deepEqual(failed.messages.at(-1), {
        event: {
          end: { exitCode: 3, exited: true, status: 'exit status 3', error: 'exit status 3' },
        },
      });
    });

    test("a stream's errors, even at once, come in its end-stream envelope with HTTP 200", async () => {
      const cases: [string, unknown, Record<string, string>, string][] = [
        ['no process', {}, {}, 'invalid_argument'],
        ['args not strings', { process: { cmd: 'echo', args: [1] } }, {}, 'invalid_argument'],
        [
          'a PTY',
          { process: { cmd: 'bash' }, pty: { size: { cols: 80, rows: 24 } } },
          {},
          'unimplemented',
        ],
        ['an unknown user', { process: { cmd: 'echo' } }, asUser('nobody'), 'unauthenticated'],
        [
          'a bad deadline',
          { process: { cmd: 'echo' } },
          { 'connect-timeout-ms': 'soon' },
          'invalid_argument',
        ],
      ];
      for (const [what, body, headers, code] of cases) {
        const { messages, end } = streamOf(await stream('process.Process/Start', body, headers));
        assert.deepEqual(messages, [], what);
        assert.equal(end.error?.code, code, what);
        // what the SDK's error says: that hostd, not the client, refuses a PTY
        if (what === 'a PTY') assert.match(end.error.message, /^PTY is not supported by hostd/);
      }
      const asUnary = await s.envd(sbx, {
        method: 'POST',
        url: '/process.Process/Start',
        headers: UNARY,
        payload: JSON.stringify({ process: { cmd: 'echo' } }),
      });
      assert.equal(streamOf(asUnary).end.error?.code, 'invalid_argument', 'not enveloped');
      const cut = await s.envd(sbx, {
        method: 'POST',
        url: '/process.Process/Start',
        headers: STREAM,
        payload: enveloped({ process: { cmd: 'echo' } }).subarray(0, 8),
      });
      assert.equal(streamOf(cut).end.error?.code, 'invalid_argument', 'a short envelope');
    });

    test('past Connect-Timeout-Ms a command stream ends with deadline_exceeded', async () => {
      const res = await stream(
        'process.Process/Start',
        { process: { cmd: 'sleep' }, tag: 'deadline' },
        { 'connect-timeout-ms': '20' },
      );
      const { messages, end } = streamOf(res);
      assert.ok('start' in (messages[0] as { event: object }).event);
      assert.equal(end.error?.code, 'deadline_exceeded');
      // the guest kills it at that lifetime: the fake does not, so it is killed here
      const [pid] = await pids('deadline');
      await unary('process.Process/SendSignal', { process: { pid }, signal: 'SIGNAL_SIGKILL' });
    });
  });

  describe('process.Process', () => {
    test('a running command is listed, fed with SendInput, ended by CloseStdin; Connect attaches to it', async () => {
      const started = stream('process.Process/Start', { process: { cmd: 'cat' }, tag: 'feed' });
      const pid = await running('feed');
      const attached = stream('process.Process/Connect', { process: { tag: 'feed' } });
      const proc = s.hv.machines.flatMap((m) => m.procs.processes.get(pid!) ?? [])[0]!;
      await eventually('Connect to attach', () => proc.sinks.size === 2);
      const input = await unary('process.Process/SendInput', {
        process: { pid },
        input: { stdin: b64('hello') },
      });
      assert.deepEqual([input.statusCode, json(input)], [200, {}]);
      const close = await unary('process.Process/CloseStdin', { process: { pid } });
      assert.deepEqual([close.statusCode, json(close)], [200, {}]);
      for (const res of [await started, await attached]) {
        const { messages, end } = streamOf(res);
        assert.deepEqual(end, {});
        assert.deepEqual(messages, [
          { event: { start: { pid } } },
          { event: { data: { stdout: b64('hello') } } },
          { event: { end: { exited: true, status: 'exit status 0' } } },
        ]);
      }
      assert.deepEqual(await pids('feed'), []);
    });

    test('SendSignal: SIGKILL ends a command; then, or for any pid not running, not_found', async () => {
      const started = stream('process.Process/Start', { process: { cmd: 'sleep' }, tag: 'kill' });
      const pid = await running('kill');
      const other = await unary('process.Process/SendSignal', {
        process: { pid },
        signal: 'SIGNAL_SIGHUP',
      });
      assert.equal(connectError(other).code, 'unimplemented', 'envd sends SIGKILL and SIGTERM');
      const kill = await unary('process.Process/SendSignal', {
        process: { pid },
        signal: 'SIGNAL_SIGKILL',
      });
      assert.deepEqual([kill.statusCode, json(kill)], [200, {}]);
      assert.deepEqual(streamOf(await started).messages.at(-1), {
        event: { end: { exitCode: -1, status: 'signal: killed', error: 'signal: killed' } },
      });
      const again = await unary('process.Process/SendSignal', {
        process: { pid },
        signal: 'SIGNAL_SIGKILL',
      });
      assert.equal(connectError(again).code, 'not_found');
      const gone = await stream('process.Process/Connect', { process: { pid } });
      assert.equal(streamOf(gone).end.error?.code, 'not_found');
      const stdin = await unary('process.Process/CloseStdin', { process: { pid } });
      assert.equal(connectError(stdin).code, 'not_found');
    });

    test('PTYs are unimplemented: Update, PTY input, and SendInput without stdin', async () => {
      const update = await unary('process.Process/Update', { process: { pid: 1 } });
      assert.equal(connectError(update).code, 'unimplemented');
      for (const input of [{ pty: b64('x') }, {}]) {
        const res = await unary('process.Process/SendInput', { process: { pid: 1 }, input });
        assert.equal(connectError(res).code, 'unimplemented', JSON.stringify(input));
      }
    });
  });

  describe('filesystem.Filesystem', () => {
    test('MakeDir, Stat, Move, ListDir and Remove, relative paths in the home', async () => {
      const made = await unary('filesystem.Filesystem/MakeDir', { path: 'fs' });
      assert.equal(made.statusCode, 200, made.body);
      const entry = json<{ entry: Record<string, unknown> }>(made).entry;
      assert.deepEqual(
        [entry.name, entry.type, entry.path],
        ['fs', 'FILE_TYPE_DIRECTORY', '/home/user/fs'],
      );
      const twice = await unary('filesystem.Filesystem/MakeDir', { path: 'fs' });
      assert.equal(connectError(twice).code, 'already_exists');

      assert.equal((await write('fs/a.txt', 'abc')).statusCode, 200);
      const stat = await unary('filesystem.Filesystem/Stat', { path: 'fs/a.txt' });
      assert.equal(stat.statusCode, 200, stat.body);
      assert.equal(json<{ entry: { type: string } }>(stat).entry.type, 'FILE_TYPE_FILE');
      const moved = await unary('filesystem.Filesystem/Move', {
        source: '/home/user/fs/a.txt',
        destination: '/home/user/fs/b.txt',
      });
      assert.equal(json<{ entry: { path: string } }>(moved).entry.path, '/home/user/fs/b.txt');
      const list = await unary('filesystem.Filesystem/ListDir', { path: 'fs', depth: 1 });
      assert.deepEqual(
        json<{ entries: { name: string }[] }>(list).entries.map((e) => e.name),
        ['b.txt'],
      );
      const removed = await unary('filesystem.Filesystem/Remove', { path: 'fs' });
      assert.deepEqual([removed.statusCode, json(removed)], [200, {}]);
      const gone = await unary('filesystem.Filesystem/Stat', { path: 'fs/b.txt' });
      assert.equal(connectError(gone).code, 'not_found');
    });

    test('a field of the wrong type is invalid_argument; an unknown user unauthenticated', async () => {
      for (const [method, body] of [
        ['Stat', {}],
        ['Stat', { path: 7 }],
        ['Move', { source: 'a' }],
        ['ListDir', { path: '.', depth: 'deep' }],
        ['CreateWatcher', { path: '.', recursive: 'yes' }],
      ] as const) {
        const res = await unary(`filesystem.Filesystem/${method}`, body);
        assert.equal(
          connectError(res).code,
          'invalid_argument',
          `${method} ${JSON.stringify(body)}`,
        );
      }
      const nobody = await unary('filesystem.Filesystem/Stat', { path: '.' }, asUser('nobody'));
      assert.equal(connectError(nobody).code, 'unauthenticated');
    });

    test('a polling watcher keeps its events until fetched; removed, it is not_found', async () => {
      const created = await unary('filesystem.Filesystem/CreateWatcher', { path: '/tmp' });
      assert.equal(created.statusCode, 200, created.body);
      const { watcherId } = json<{ watcherId: string }>(created);
      for (const m of s.hv.machines) m.procs.emitEvents([{ name: 'x', type: 'create' }]);
      const events = await eventually('the event to be kept', async () => {
        const res = await unary('filesystem.Filesystem/GetWatcherEvents', { watcherId });
        const got = json<{ events: unknown[] }>(res).events;
        return got.length ? got : null;
      });
      assert.deepEqual(events, [{ name: 'x', type: 'EVENT_TYPE_CREATE' }]);
      const removed = await unary('filesystem.Filesystem/RemoveWatcher', { watcherId });
      assert.deepEqual([removed.statusCode, json(removed)], [200, {}]);
      const gone = await unary('filesystem.Filesystem/GetWatcherEvents', { watcherId });
      assert.equal(connectError(gone).code, 'not_found');
      const missing = await unary('filesystem.Filesystem/CreateWatcher', { path: '/missing' });
      assert.equal(connectError(missing).code, 'not_found');
    });

    test('WatchDir streams start, then the events, until the sandbox is gone', async () => {
      const watched = await s.sandbox();
      const watching = stream('filesystem.Filesystem/WatchDir', { path: '/tmp' }, {}, watched);
      await eventually('the watch to take events', () =>
        s.hv.machines.some((m) => m.procs.emitEvents([{ name: 'y', type: 'write' }]) > 0),
      );
      const kill = await s.inject({ method: 'DELETE', url: `/sandboxes/${watched.id}` });
      assert.equal(kill.statusCode, 204);
      const { messages, end } = streamOf(await watching);
      assert.deepEqual(messages.slice(0, 2), [
        { start: {} },
        { filesystem: { name: 'y', type: 'EVENT_TYPE_WRITE' } },
      ]);
      assert.equal(end.error?.code, 'not_found', 'the sandbox is gone');
      const missing = await stream('filesystem.Filesystem/WatchDir', { path: '/missing' });
      assert.equal(streamOf(missing).end.error?.code, 'not_found');
    });
  });

  describe('/files', () => {
    test('a raw upload is written to ?path= and listed; GET reads it back as an attachment', async () => {
      const put = await write('files/a.txt', 'hello');
      assert.equal(put.statusCode, 200, put.body);
      assert.equal(put.headers['content-type'], 'application/json; charset=utf-8');
      assert.deepEqual(json(put), [
        { name: 'a.txt', type: 'file', path: '/home/user/files/a.txt' },
      ]);
      const got = await s.envd(sbx, { url: '/files?path=files/a.txt' });
      assert.equal(got.statusCode, 200);
      assert.equal(got.body, 'hello');
      assert.equal(got.headers['content-type'], 'application/octet-stream');
      assert.equal(got.headers['content-disposition'], "inline; filename*=UTF-8''a.txt");
      assert.equal(got.headers['content-length'], '5');
    });

    test('multipart parts are written in order; gzip bodies are unpacked; metadata is kept', async () => {
      const boundary = 'xBOUNDARYx';
      const part = (name: string, body: string) =>
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${name}"\r\n` +
        `Content-Type: application/octet-stream\r\n\r\n${body}\r\n`;
      const multi = await s.envd(sbx, {
        method: 'POST',
        url: '/files',
        headers: { 'content-type': `multipart/form-data; boundary=${boundary}` },
        payload: `${part('m/one.txt', '1')}${part('m/two.txt', '2')}--${boundary}--\r\n`,
      });
      assert.equal(multi.statusCode, 200, multi.body);
      assert.deepEqual(
        json<{ path: string }[]>(multi).map((f) => f.path),
        ['/home/user/m/one.txt', '/home/user/m/two.txt'],
      );
      const gz = await s.envd(sbx, {
        method: 'POST',
        url: '/files?path=m/z.txt',
        headers: {
          'content-type': 'application/octet-stream',
          'content-encoding': 'gzip',
          'x-metadata-Owner': 'team-a',
        },
        payload: gzipSync('unpacked'),
      });
      assert.equal(gz.statusCode, 200, gz.body);
      assert.deepEqual(json<{ metadata?: object }[]>(gz)[0]!.metadata, { owner: 'team-a' });
      assert.equal((await s.envd(sbx, { url: '/files?path=m/z.txt' })).body, 'unpacked');
    });

    test("envd's error bodies: {code, message} with the status, nothing else", async () => {
      const cases: [string, () => ReturnType<TestE2bServer['envd']>, number][] = [
        ['GET without path', () => s.envd(sbx, { url: '/files' }), 400],
        ['a missing file', () => s.envd(sbx, { url: '/files?path=no/such' }), 404],
        ['an unknown user', () => s.envd(sbx, { url: '/files?path=a&username=nobody' }), 401],
        ['a raw body without path', () => write('', 'x'), 400],
        ['a file too large', () => write('big.bin', 'x'.repeat(2048)), 413],
        [
          'an encoding other than gzip',
          () =>
            s.envd(sbx, {
              method: 'POST',
              url: '/files?path=a',
              headers: { 'content-type': 'application/octet-stream', 'content-encoding': 'br' },
              payload: 'x',
            }),
          415,
        ],
        [
          'non-ASCII metadata',
          () =>
            s.envd(sbx, {
              method: 'POST',
              url: '/files?path=a',
              headers: { 'content-type': 'application/octet-stream', 'x-metadata-k': 'é' },
              payload: 'x',
            }),
          400,
        ],
      ];
      for (const [what, send, status] of cases) {
        const res = await send();
        assert.equal(res.statusCode, status, `${what}: ${res.body}`);
        assert.deepEqual(Object.keys(json(res)).sort(), ['code', 'message'], what);
      }
    });

    test('a signed URL works with no header at all; a forged, expired or missing signature is 401', async () => {
      assert.equal((await write('signed.txt', 'via url')).statusCode, 200);
      const url = (op: 'read' | 'write', sig: string, exp?: number) =>
        `/files?path=signed.txt&username=user&signature=${encodeURIComponent(sig)}` +
        (exp === undefined ? '' : `&signature_expiration=${exp}`);
      const read = sign('signed.txt', 'read', 'user', sbx.accessToken);
      const got = await s.envd(sbx, { url: url('read', read), headers: BARE });
      assert.deepEqual([got.statusCode, got.body], [200, 'via url']);
      const upload = await s.envd(sbx, {
        method: 'POST',
        url: url('write', sign('signed.txt', 'write', 'user', sbx.accessToken)),
        headers: { ...BARE, 'content-type': 'application/octet-stream' },
        payload: 'again',
      });
      assert.equal(upload.statusCode, 200, upload.body);
      // A read signature does not sign a write
      const swapped = await s.envd(sbx, {
        method: 'POST',
        url: url('write', read),
        headers: { ...BARE, 'content-type': 'application/octet-stream' },
        payload: 'x',
      });
      assert.deepEqual(json(swapped), { code: 401, message: 'invalid signature' });

      const past = Math.floor(Date.now() / 1000) - 10;
      const expired = sign('signed.txt', 'read', 'user', sbx.accessToken, past);
      for (const [sig, exp, message] of [
        ['v1_forged', undefined, 'invalid signature'],
        [expired, past, 'signature is already expired'],
      ] as const) {
        const res = await s.envd(sbx, { url: url('read', sig, exp), headers: BARE });
        assert.deepEqual([res.statusCode, json(res)], [401, { code: 401, message }]);
      }
      // With the sandbox's headers but no token, the signature is still required
      const unsigned = await s.envd(sbx, {
        url: '/files?path=signed.txt',
        headers: { 'x-access-token': undefined },
      });
      assert.deepEqual(json(unsigned), { code: 401, message: 'missing signature query parameter' });
    });
  });

  test('every route of envd was exercised', () => assertAreaCovered('e2b-envd'));
});
