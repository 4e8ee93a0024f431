/**
 * The answers hostd gives are what docs/openapi.json (generated from src/api/wire) says they
 * are. test/helpers/server.ts checks every answer of every route test against its route's
 * schema; this file makes sure the payloads clients build on were among them, one request each
 * on the fake hypervisor, and that the check does catch an answer that leaves the contract.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { checkAnswer, checkedSchemas } from '../helpers/wire-check.js';
import { startServer, type TestServer } from '../helpers/server.js';

let s: TestServer;
before(async () => {
  s = await startServer();
});
after(() => s.close());

const ok = async (method: 'GET' | 'POST' | 'PUT', url: string, payload?: unknown) => {
  const res = await s.inject({
    method,
    url,
    ...(payload === undefined ? {} : { payload: payload as object }),
    ...(method === 'PUT' ? { headers: { 'content-type': 'application/octet-stream' } } : {}),
  });
  assert.ok(res.statusCode < 300, `${method} ${url}: ${res.statusCode} ${res.body}`);
  return JSON.parse(res.body.split('\n')[0]!) as Record<string, unknown>;
};

test('sandbox, fork, merge, snapshot, template, file, context, exec and error answers fit their schemas', async () => {
  const { id } = (await ok('POST', '/v1/sandboxes', { metadata: { a: 'b' }, timeout: 60 })) as {
    id: string;
  };
  await ok('GET', `/v1/sandboxes/${id}`);
  await ok('GET', '/v1/sandboxes');
  const fork = (await ok('POST', `/v1/sandboxes/${id}/fork`, { n: 2 })) as {
    children: { id: string }[];
  };
  await ok('POST', `/v1/sandboxes/${id}/merge_into/${fork.children[0]!.id}`);
  const snap = (await ok('POST', `/v1/sandboxes/${id}/snapshot`, { name: 'one' })) as {
    snapshot_id: string;
  };
  await ok('GET', `/v1/snapshots/${snap.snapshot_id}`);
  await ok('GET', '/v1/snapshots');
  await ok('GET', '/v1/templates');
  await ok('PUT', `/v1/sandboxes/${id}/files?path=/tmp/a.txt`, 'hello');
  await ok('GET', `/v1/sandboxes/${id}/files/stat?path=/tmp/a.txt`);
  await ok('GET', `/v1/sandboxes/${id}/files/list?path=/tmp`);
  await ok('POST', `/v1/sandboxes/${id}/contexts`, { id: 'c1' });
  await ok('GET', `/v1/sandboxes/${id}/contexts`);
  await ok('POST', `/v1/sandboxes/${id}/exec`, { code: 'print hello' });
  await ok('POST', `/v1/sandboxes/${id}/pause`);
  const missing = await s.inject({ method: 'GET', url: `/v1/sandboxes/sbx_${'0'.repeat(32)}` });
  assert.equal(missing.statusCode, 404);

  const want = [
    'Sandbox',
    'SandboxInfo',
    'SandboxList',
    'ForkResponse',
    'MergeResponse',
    'Snapshot',
    'SnapshotList',
    'Template',
    'TemplateList',
    'FileWritten',
    'FileEntry',
    'Context',
    'ContextList',
    'ExecEvent',
    'SandboxState',
    'Error',
  ];
  assert.deepEqual(
    want.filter((name) => !checkedSchemas().has(name)),
    [],
    'every payload was checked',
  );
});

test('an answer that leaves the contract fails the check, naming the field', () => {
  const info = {
    statusCode: 200,
    headers: { 'content-type': 'application/json; charset=utf-8' },
    body: JSON.stringify({ id: `sbx_${'0'.repeat(32)}`, state: 'ready', extra: 1 }),
  };
  assert.throws(() => checkAnswer('POST', '/v1/sandboxes', info), /extra/);
  const line = { ...info, headers: { 'content-type': 'application/x-ndjson' } };
  line.body = '{"type":"exit","data":"0","seq":0,"ts":1}\n';
  assert.throws(() => checkAnswer('POST', `/v1/sandboxes/sbx_${'0'.repeat(32)}/exec`, line));
  const error = { ...info, statusCode: 404, body: '{"error":"x","code":"no_such_code"}' };
  assert.throws(() => checkAnswer('GET', '/v1/sandboxes/x', error));
});
