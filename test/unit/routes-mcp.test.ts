/**
 * Route tests of `/mcp` (docs/mcp.md): a session starts with `initialize` and ends with DELETE,
 * the stream route needs one, and the protocol's own errors are JSON-RPC messages, not hostd's
 * `{error, code}`. The MCP tools call hostd's API over loopback (api/routes/mcp.ts), so this
 * server listens on 127.0.0.1 as well as taking `inject()`; the tools themselves are
 * sdk/typescript's tests and test/integration/mcp.test.ts's.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { assertAreaCovered } from '../helpers/routes.js';
import { startServer, type TestServer } from '../helpers/server.js';

const ACCEPT = { accept: 'application/json, text/event-stream' };

/** The JSON-RPC messages of an answer, whether it came as JSON or as SSE `data:` lines. */
function messages(res: {
  body: string;
  headers: Record<string, unknown>;
}): Record<string, unknown>[] {
  if (String(res.headers['content-type']).startsWith('text/event-stream')) {
    return res.body
      .split('\n')
      .filter((l) => l.startsWith('data: '))
      .map((l) => JSON.parse(l.slice(6)) as Record<string, unknown>);
  }
  return [JSON.parse(res.body) as Record<string, unknown>];
}

describe('/mcp', () => {
  let s: TestServer;
  before(async () => {
    s = await startServer();
    await s.app.listen({ host: '127.0.0.1', port: 0 });
  });
  after(() => s.close());

  const rpc = (body: object, headers: Record<string, string> = {}) =>
    s.inject({ method: 'POST', url: '/mcp', payload: body, headers: { ...ACCEPT, ...headers } });

  test('initialize starts a session, tools/list lists the tools, DELETE ends it', async () => {
    const init = await rpc({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: {
        protocolVersion: '2025-03-26',
        capabilities: {},
        clientInfo: { name: 'routes-mcp-test', version: '0' },
      },
    });
    assert.equal(init.statusCode, 200, init.body);
    const session = String(init.headers['mcp-session-id'] ?? '');
    assert.notEqual(session, '', 'the answer names the session');
    assert.equal(messages(init)[0]?.id, 1);
    const sid = { 'mcp-session-id': session };

    const notified = await rpc({ jsonrpc: '2.0', method: 'notifications/initialized' }, sid);
    assert.equal(notified.statusCode, 202);

    const tools = await rpc({ jsonrpc: '2.0', id: 2, method: 'tools/list' }, sid);
    assert.equal(tools.statusCode, 200, tools.body);
    const result = messages(tools).find((m) => m.id === 2)?.result as { tools: unknown[] };
    assert.ok(result.tools.length > 0);

    const end = await s.inject({ method: 'DELETE', url: '/mcp', headers: sid });
    assert.equal(end.statusCode, 200, end.body);
    const after = await rpc({ jsonrpc: '2.0', id: 3, method: 'tools/list' }, sid);
    assert.equal(after.statusCode, 404, 'an ended session is unknown');
    assert.ok('error' in messages(after)[0]!, 'a JSON-RPC error');
  });

  test('without a session, GET and requests are JSON-RPC errors, not hostd error bodies', async () => {
    const get = await s.inject({
      method: 'GET',
      url: '/mcp',
      headers: { accept: 'text/event-stream' },
    });
    assert.ok(get.statusCode >= 400 && get.statusCode < 500, `${get.statusCode} ${get.body}`);
    const body = JSON.parse(get.body) as { jsonrpc?: string; error?: unknown; code?: unknown };
    assert.equal(body.jsonrpc, '2.0');
    assert.ok(body.error !== undefined && body.code === undefined, get.body);
    const req = await rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' });
    assert.ok(req.statusCode >= 400 && req.statusCode < 500, `${req.statusCode} ${req.body}`);
    assert.equal((JSON.parse(req.body) as { jsonrpc?: string }).jsonrpc, '2.0');
  });

  test('every route of this area was exercised', () => assertAreaCovered('mcp'));
});
