/**
 * hostd's MCP server without VMs: how an exec's output becomes MCP content (order, limits,
 * images, DataFrames), the tools' schemas and annotations as a model sees them, the session's
 * ownership of the sandboxes it creates, and the Streamable HTTP endpoint's sessions (bound to
 * their key, refused to browser origins, ended by DELETE or idleness), all driven by the MCP
 * SDK's own client against a fake hostd. test/integration/mcp.test.ts at the repository's root
 * covers the same over both transports against a real hostd.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, beforeEach, describe, test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import type { CallToolResult, ContentBlock } from '@modelcontextprotocol/sdk/types.js';
import { RunContent, looksLikeText, sniffImage } from '../src/mcp/content.js';
import { McpHttpEndpoint, createMcpServer, type McpSession } from '../src/mcp/index.js';
import { SDK_VERSION } from '../src/version.js';
import {
  eventLine,
  sendError,
  sendJson,
  startFakeHostd,
  type FakeHostd,
  type Handler,
  type RecordedRequest,
} from './helpers/fake-hostd.js';
import { PACKAGE_DIR } from './helpers/live.js';

const PNG = Buffer.from('89504e470d0a1a0a0000000d49484452', 'hex').toString('base64');
const TOOLS = [
  'run_code',
  'create_sandbox',
  'fork_sandbox',
  'merge_sandbox',
  'snapshot_sandbox',
  'list_sandboxes',
  'delete_sandboxes',
  'list_snapshots',
  'list_templates',
  'read_file',
  'write_file',
  'list_files',
];

const texts = (blocks: ContentBlock[]): string =>
  blocks.map((b) => (b.type === 'text' ? b.text : `<${b.type}>`)).join('|');

describe('exec output as MCP content', () => {
  test('output and displays keep their order; a figure is an image, a DataFrame text plus HTML', () => {
    const c = new RunContent(1000, 'sbx_x');
    c.text('before\n');
    c.display({ 'image/png': PNG, 'text/plain': '<Figure size 640x480 with 1 Axes>' });
    c.text('between\n');
    c.display({ 'text/plain': '   a\n0  1', 'text/html': '<table><tr><td>1</td></tr></table>' });
    const blocks = c.finish('[status]');
    assert.deepEqual(
      blocks.map((b) => b.type),
      ['text', 'image', 'text', 'text', 'resource', 'text'],
    );
    assert.deepEqual(blocks[1], { type: 'image', data: PNG, mimeType: 'image/png' });
    assert.equal(texts(blocks), 'before\n|<image>|between\n|   a\n0  1|<resource>|[status]');
    const html = blocks[4] as Extract<ContentBlock, { type: 'resource' }>;
    assert.equal(html.resource.mimeType, 'text/html');
    assert.equal((html.resource as { text: string }).text, '<table><tr><td>1</td></tr></table>');
    assert.deepEqual(html.annotations, { audience: ['user'] }, 'the HTML is for the host to show');
  });

  test('output past the limit keeps its start and its end, with a note of what was cut', () => {
    const c = new RunContent(1000, 'sbx_x');
    for (let i = 0; i < 1000; i++) c.text(`line ${i}\n`);
    const [out, status] = c.finish('[status]');
    assert.equal(status?.type === 'text' && status.text, '[status]');
    const text = out?.type === 'text' ? out.text : '';
    assert.ok(text.startsWith('line 0\nline 1\n'), 'the start is kept');
    assert.ok(text.endsWith('line 998\nline 999\n'), 'the end (a traceback, a result) is kept');
    const note = /\n\[\.\.\. (\d+) characters of output omitted here[^\n]*\]\n/.exec(text);
    assert.ok(note, 'a note says output was cut');
    const total = Array.from({ length: 1000 }, (_, i) => `line ${i}\n`).join('').length;
    assert.equal(text.length - note[0].length, 1000, 'exactly the limit is kept');
    assert.equal(Number(note[1]), total - 1000, 'the note counts what was cut');
  });

  test('output just over half the limit is split but nothing is cut', () => {
    const c = new RunContent(1000, 'sbx_x');
    c.text('a'.repeat(700));
    const [out] = c.finish('[status]');
    assert.equal(out?.type === 'text' && out.text, 'a'.repeat(700));
  });

  test('at most ten images; the rest are counted', () => {
    const c = new RunContent(1000, 'sbx_x');
    for (let i = 0; i < 12; i++) c.display({ 'image/png': PNG, 'text/plain': 'fig' });
    const blocks = c.finish('[status]');
    assert.equal(blocks.filter((b) => b.type === 'image').length, 10);
    assert.match(texts(blocks), /2 more image\(s\) not shown/);
  });

  test('files: images by their first bytes, text as UTF-8 without NUL bytes', () => {
    assert.equal(sniffImage(Buffer.from(PNG, 'base64')), 'image/png');
    assert.equal(sniffImage(Buffer.from([0xff, 0xd8, 0xff, 0xe0])), 'image/jpeg');
    assert.equal(sniffImage(Buffer.from('GIF89a')), 'image/gif');
    assert.equal(sniffImage(Buffer.from('hello')), undefined);
    assert.ok(looksLikeText(Buffer.from('héllo wörld\n')));
    assert.ok(looksLikeText(Buffer.from('é').subarray(0, 1)), 'a character cut at the end is text');
    assert.ok(!looksLikeText(Buffer.from([0x61, 0x00, 0x62])));
    assert.ok(!looksLikeText(Buffer.from([0xc3, 0x28])));
  });
});

test('SDK_VERSION is the package version', () => {
  const pkg = JSON.parse(readFileSync(`${PACKAGE_DIR}/package.json`, 'utf8')) as {
    version: string;
  };
  assert.equal(SDK_VERSION, pkg.version);
});

/**
 * A fake hostd holding sandboxes by id: create, get, exec (scripted), fork, delete, pause, and
 * reading the files of `files` (the same in every sandbox).
 */
function fakeSandboxes(
  fake: FakeHostd,
  exec: (code: string) => string[],
): { alive: Set<string>; handler: Handler; files: Map<string, Buffer> } {
  const alive = new Set<string>();
  const files = new Map<string, Buffer>();
  let next = 0;
  const newId = (): string => `sbx_${(++next).toString(16).padStart(32, '0')}`;
  const info = (id: string) => ({
    id,
    state: 'ready',
    template: 'python-slim',
    created_at: '2026-01-01T00:00:00.000Z',
    last_used_at: '2026-01-01T00:00:00.000Z',
    parent_id: null,
    busy: false,
    queued: 0,
    network: { allow_out: [], bytes_in: 0, bytes_out: 0 },
  });
  const handler: Handler = (req: RecordedRequest, res) => {
    const url = new URL(req.url, 'http://fake');
    const file = files.get(url.searchParams.get('path') ?? '');
    if (/^\/v1\/sandboxes\/sbx_[0-9a-f]{32}\/files(\/stat)?$/.test(url.pathname)) {
      if (file === undefined) return sendError(res, 404, 'no such file', 'file_not_found');
      if (url.pathname.endsWith('/stat')) {
        return sendJson(res, 200, { type: 'file', size: file.length, mode: 420, mtime_ms: 0 });
      }
      res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(file);
      return;
    }
    const m = /^\/v1\/sandboxes\/(sbx_[0-9a-f]{32})(\/[a-z_]+)?$/.exec(req.url);
    if (req.method === 'POST' && req.url === '/v1/sandboxes') {
      const id = newId();
      alive.add(id);
      return sendJson(res, 200, { id, state: 'ready' });
    }
    if (req.method === 'GET' && req.url === '/v1/sandboxes') {
      return sendJson(res, 200, { sandboxes: [...alive].map(info) });
    }
    if (!m || !alive.has(m[1]!))
      return sendError(res, 404, 'sandbox not found', 'sandbox_not_found');
    const [, id, action] = m;
    if (req.method === 'GET' && action === undefined) return sendJson(res, 200, info(id!));
    if (req.method === 'DELETE' && action === undefined) {
      alive.delete(id!);
      res.writeHead(204).end();
      return;
    }
    if (req.method === 'POST' && action === '/pause')
      return sendJson(res, 200, { id, state: 'paused' });
    if (req.method === 'POST' && action === '/fork') {
      const { n } = JSON.parse(req.body) as { n: number };
      const children = Array.from({ length: n }, () => newId());
      for (const c of children) alive.add(c);
      return sendJson(res, 200, {
        parent_id: id,
        children: children.map((c) => ({ id: c, state: 'ready' })),
      });
    }
    if (req.method === 'POST' && action === '/exec') {
      const { code } = JSON.parse(req.body) as { code: string };
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(exec(code).join(''));
      return;
    }
    sendError(res, 404, `no route for ${req.method} ${req.url}`, 'route_not_found');
  };
  fake.handle(handler);
  return { alive, handler, files };
}

/** Resolves once `probe` is true, checking every 10 ms; fails after 20 s. */
async function until(what: string, probe: () => boolean | Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (!(await probe())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The exec answers of these tests: `fail` raises, `chart` shows a figure, anything else prints. */
function scripted(code: string): string[] {
  if (code === 'fail') {
    return [
      eventLine('stderr', 'Traceback (most recent call last):', 0),
      eventLine('stderr', 'ZeroDivisionError: division by zero', 1),
      eventLine('exit', 1, 2),
    ];
  }
  if (code === 'chart') {
    return [
      eventLine('display', { 'image/png': PNG, 'text/plain': '<Figure>' }, 0),
      eventLine('exit', 0, 1),
    ];
  }
  return [eventLine('stdout', `ran ${code}`, 0), eventLine('exit', 0, 1)];
}

describe('the tools against a fake hostd', { timeout: 60_000 }, () => {
  let fake: FakeHostd;
  let alive: Set<string>;
  let files: Map<string, Buffer>;
  let client: Client;
  let session: McpSession;

  before(async () => {
    fake = await startFakeHostd();
  });
  after(async () => {
    await fake.close();
  });
  beforeEach(async () => {
    ({ alive, files } = fakeSandboxes(fake, scripted));
    const made = createMcpServer({ connection: { baseUrl: fake.url, apiKey: '', maxRetries: 0 } });
    session = made.session;
    const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
    await made.server.connect(serverSide);
    client = new Client({ name: 'test', version: '0' });
    await client.connect(clientSide);
  });

  const call = async (name: string, args: Record<string, unknown>): Promise<CallToolResult> =>
    (await client.callTool({ name, arguments: args })) as CallToolResult;

  test('every tool has a description, a described schema and annotations a host can act on', async () => {
    const { tools } = await client.listTools();
    assert.deepEqual(
      tools.map((t) => t.name),
      TOOLS,
    );
    for (const tool of tools) {
      assert.ok((tool.description ?? '').length > 80, `${tool.name} explains itself`);
      assert.ok(tool.title, `${tool.name} has a title`);
      const props = (tool.inputSchema.properties ?? {}) as Record<string, { description?: string }>;
      for (const [name, prop] of Object.entries(props)) {
        if (name === 'sandbox_id' && tool.name !== 'run_code') continue; // self-explanatory
        assert.ok(prop.description, `${tool.name}.${name} is described`);
      }
      assert.equal(typeof tool.annotations?.readOnlyHint, 'boolean', `${tool.name} readOnlyHint`);
    }
    const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
    for (const name of ['list_sandboxes', 'list_files', 'read_file', 'list_templates']) {
      assert.equal(byName[name]!.annotations?.readOnlyHint, true, name);
    }
    for (const name of ['delete_sandboxes', 'merge_sandbox', 'write_file', 'run_code']) {
      assert.equal(byName[name]!.annotations?.destructiveHint, true, name);
    }
    assert.deepEqual(byName.run_code!.inputSchema.required, ['code']);
    assert.deepEqual(
      (byName.run_code!.inputSchema.properties as Record<string, { enum?: string[] }>).language!
        .enum,
      ['python', 'bash'],
    );
  });

  test('run_code without an id creates the default sandbox once and keeps using it', async () => {
    const first = await call('run_code', { code: 'x = 1' });
    assert.equal(first.isError, undefined);
    assert.equal(alive.size, 1);
    const [id] = [...alive];
    assert.match(texts(first.content), new RegExp(`ran x = 1\n\\|\\[new sandbox ${id}`));
    const second = await call('run_code', { code: 'print(x)' });
    assert.match(
      texts(second.content),
      new RegExp(`^ran print\\(x\\)\n\\|\\[sandbox ${id}; exit code 0\\]$`),
    );
    assert.equal(
      fake.requests.filter((r) => r.method === 'POST' && r.url === '/v1/sandboxes').length,
      1,
    );
    assert.deepEqual([...session.owned], [id]);
  });

  test('calls made in parallel in a new session share one default sandbox', async () => {
    const results = await Promise.all(
      ['a = 1', 'b = 2', 'c = 3'].map((code) => call('run_code', { code })),
    );
    assert.equal(alive.size, 1);
    const [id] = [...alive];
    for (const r of results) assert.match(texts(r.content), new RegExp(`sandbox ${id}`));
  });

  test("list_sandboxes shows the session's own first and at most 100", async () => {
    for (let i = 0; i < 120; i++) alive.add(`sbx_${(0xf000 + i).toString(16).padStart(32, '0')}`);
    await call('run_code', { code: 'x = 1' });
    const listed = await call('list_sandboxes', {});
    const { sandboxes, total } = listed.structuredContent as {
      sandboxes: { sandbox_id: string; this_session: boolean; default: boolean }[];
      total: number;
    };
    assert.equal(total, 121);
    assert.equal(sandboxes.length, 100);
    assert.deepEqual(
      { own: sandboxes[0]!.this_session, default: sandboxes[0]!.default },
      { own: true, default: true },
    );
  });

  test('an exception is a tool error with its traceback; a figure is an image', async () => {
    const failed = await call('run_code', { code: 'fail' });
    assert.equal(failed.isError, true);
    assert.match(texts(failed.content), /Traceback[\s\S]*ZeroDivisionError[\s\S]*exit code 1/);
    const chart = await call('run_code', { code: 'chart' });
    assert.deepEqual(chart.content[0], { type: 'image', data: PNG, mimeType: 'image/png' });
  });

  test("the session's end deletes the sandboxes it made, not the ones it was given", async () => {
    const theirs = `sbx_${'f'.repeat(32)}`;
    alive.add(theirs);
    await call('run_code', { code: 'x = 1', sandbox_id: theirs });
    await call('run_code', { code: 'x = 1' });
    const fork = await call('fork_sandbox', { sandbox_id: theirs, n: 2 });
    const children = (fork.structuredContent as { children: string[] }).children;
    assert.equal(children.length, 2);
    assert.equal(alive.size, 4);
    const report = await session.end();
    assert.equal(report.done.length, 3);
    assert.deepEqual([...alive], [theirs]);
    const after = await call('create_sandbox', {});
    assert.equal(after.isError, true, 'an ended session creates nothing');
  });

  test('read_file: long text in parts, an image whole, a binary file as an attachment', async () => {
    const id = `sbx_${'e'.repeat(32)}`;
    alive.add(id);
    const text = Array.from({ length: 5000 }, (_, i) => `row ${i} é\n`).join('');
    files.set('/root/big.txt', Buffer.from(text));
    const first = await call('read_file', { sandbox_id: id, path: '/root/big.txt' });
    const [part, note] = first.content.map((b) => (b.type === 'text' ? b.text : ''));
    assert.equal(part, text.slice(0, 30_000));
    const offset = Number(/offset=(\d+)/.exec(note ?? '')?.[1]);
    assert.equal(offset, Buffer.byteLength(part!));
    const rest = await call('read_file', { sandbox_id: id, path: '/root/big.txt', offset });
    assert.equal(texts(rest.content), text.slice(30_000), 'the rest, whole');

    const png = Buffer.concat([Buffer.from(PNG, 'base64'), Buffer.alloc(2 * 1024 * 1024, 1)]);
    files.set('/root/plot.png', png);
    const image = await call('read_file', { sandbox_id: id, path: '/root/plot.png' });
    assert.equal(image.content[0]?.type, 'image');
    assert.equal((image.content[0] as { data: string }).data, png.toString('base64'));

    files.set('/root/data.bin', Buffer.from([0, 1, 2, 3, 255]));
    const binary = await call('read_file', { sandbox_id: id, path: '/root/data.bin' });
    assert.match(texts(binary.content), /binary file of 5 bytes/);
    const blob = binary.content[1] as Extract<ContentBlock, { type: 'resource' }>;
    assert.equal((blob.resource as { blob: string }).blob, 'AAECA/8=');
  });

  test('SDK errors are tool errors the model can act on', async () => {
    const missing = await call('run_code', { code: '1', sandbox_id: `sbx_${'0'.repeat(32)}` });
    assert.equal(missing.isError, true);
    assert.match(
      texts(missing.content),
      /^not found \(sandbox_not_found\): sandbox not found \(list_sandboxes/,
    );
    const bad = await call('run_code', { code: '1', sandbox_id: 'nope' });
    assert.equal(bad.isError, true);
    assert.match(texts(bad.content), /sbx_ followed by 32 lowercase hex digits/);
  });
});

describe('the Streamable HTTP endpoint', { timeout: 60_000 }, () => {
  let fake: FakeHostd;
  let alive: Set<string>;
  let handler: Handler;
  let endpoint: McpHttpEndpoint;
  let server: Server;
  let url: string;
  const IDLE = 60_000;

  before(async () => {
    fake = await startFakeHostd();
    endpoint = new McpHttpEndpoint({ idleTimeoutMs: IDLE });
    // As hostd mounts it: the caller's bearer key becomes the session's key.
    server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        const key = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
        void endpoint.handle(req, res, text ? JSON.parse(text) : undefined, {
          baseUrl: fake.url,
          apiKey: key,
          maxRetries: 0,
        });
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`;
  });
  after(async () => {
    await endpoint.close();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    await fake.close();
  });
  beforeEach(() => {
    ({ alive, handler } = fakeSandboxes(fake, scripted));
  });

  const connect = async (
    key: string,
  ): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> => {
    const transport = new StreamableHTTPClientTransport(new URL(url), {
      requestInit: { headers: { authorization: `Bearer ${key}` } },
    });
    const client = new Client({ name: 'test', version: '0' });
    await client.connect(transport);
    return { client, transport };
  };

  test('DELETE ends the session and its sandboxes are gone when it returns', async () => {
    const { client, transport } = await connect('k1');
    await client.callTool({ name: 'run_code', arguments: { code: 'x = 1' } });
    assert.equal(alive.size, 1);
    const sessions = endpoint.size;
    await transport.terminateSession();
    assert.equal(alive.size, 0);
    assert.equal(endpoint.size, sessions - 1);
    await client.close();
  });

  test('a session answers only the key it was started with', async () => {
    const { client, transport } = await connect('k1');
    const res = await fetch(url, {
      method: 'POST',
      headers: {
        authorization: 'Bearer k2',
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-session-id': transport.sessionId!,
        'mcp-protocol-version': '2025-06-18',
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    assert.equal(res.status, 404, 'as for a session that does not exist');
    await transport.terminateSession();
    await client.close();
  });

  test('a browser page on another origin is refused', async () => {
    const res = await fetch(url, {
      method: 'POST',
      headers: {
        origin: 'https://evil.example',
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
      },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 0,
        method: 'initialize',
        params: {
          protocolVersion: '2025-06-18',
          capabilities: {},
          clientInfo: { name: 'x', version: '0' },
        },
      }),
    });
    assert.equal(res.status, 403);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /Origin/);
  });

  test('a session with a request open does not expire; once its client is gone it does', async () => {
    let release: () => void = () => undefined;
    const held = new Promise<void>((r) => (release = r));
    fake.handle(async (req, res) => {
      if (req.url.endsWith('/exec') && JSON.parse(req.body).code === 'hold') {
        await held;
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.end(eventLine('exit', 0, 0));
        return;
      }
      return handler(req, res, undefined as never);
    });
    const { client } = await connect('k1');
    const seen = fake.requests.length;
    const running = client.callTool({ name: 'run_code', arguments: { code: 'hold' } });
    await until('the exec to reach hostd', () =>
      fake.requests.slice(seen).some((r) => r.url.endsWith('/exec')),
    );
    const sessions = endpoint.size;
    await endpoint.sweep(Date.now() + IDLE + 1);
    assert.equal(endpoint.size, sessions, 'a tool call in progress keeps the session');
    release();
    await running;
    assert.equal(alive.size, 1);
    // The client goes away without DELETE: its requests and its GET stream close.
    await client.close();
    await until('the idle session to expire', async () => {
      await endpoint.sweep(Date.now() + IDLE + 1);
      return endpoint.size === sessions - 1;
    });
    assert.equal(alive.size, 0, "the expired session's sandboxes are deleted");
  });
});
