/**
 * Notebook cells and REPL contexts against a scripted fake: the exec options as docs/api.md
 * names them, run()'s result, error and count, a partial line kept without a newline, and the
 * context routes with their errors.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  ContextExistsError,
  ContextNotFoundError,
  InvalidRequestError,
  Sandbox,
  type CellError,
  type Display,
} from '../src/index.js';
import {
  defaultHandler,
  eventLine,
  sendError,
  sendJson,
  startFakeHostd,
  type FakeHostd,
} from './helpers/fake-hostd.js';

const ID = 'sbx_' + 'b'.repeat(32);

describe('notebook cells and contexts', { timeout: 30_000 }, () => {
  let fake: FakeHostd;
  let sandbox: Sandbox;
  before(async () => {
    fake = await startFakeHostd();
    sandbox = await Sandbox.connect(ID, { baseUrl: fake.url });
  });
  after(() => fake.close());

  test('run sends context and notebook and collects the result, error and count', async () => {
    const chart = { type: 'bar', title: null, elements: [] };
    fake.handle((req, res) => {
      if (!req.url.endsWith('/exec')) return defaultHandler(req, res, undefined as never);
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(eventLine('execution_count', 4, 0));
      res.write(eventLine('stdout', 'ab', 1, { partial: true }));
      res.write(eventLine('stdout', 'c', 2));
      res.write(
        eventLine('display', { 'text/plain': 'fig', 'application/vnd.hostd.chart+json': chart }, 3),
      );
      res.write(
        eventLine(
          'result',
          { 'text/plain': 'x', 'application/vnd.hostd.dataframe+json': { a: [1] } },
          4,
        ),
      );
      res.write(eventLine('error', { name: 'E', value: 'v', traceback: 't' }, 5));
      res.end(eventLine('exit', 1, 6));
    });
    const results: Display[] = [];
    const errors: CellError[] = [];
    const run = await sandbox.run('x', {
      context: 'c1',
      notebook: true,
      onResult: (r) => results.push(r),
      onError: (e) => errors.push(e),
    });
    assert.deepEqual(JSON.parse(fake.requests.at(-1)!.body), {
      code: 'x',
      context: 'c1',
      notebook: true,
    });
    assert.equal(run.stdout, 'abc\n');
    assert.equal(run.executionCount, 4);
    assert.equal(run.result?.text, 'x');
    assert.deepEqual(run.result?.dataframe, { a: [1] });
    assert.deepEqual(run.displays[0]?.chart, chart);
    assert.deepEqual(run.error, { name: 'E', value: 'v', traceback: 't' });
    assert.equal(run.exitCode, 1);
    assert.equal(results.length, 1);
    assert.equal(errors.length, 1);
  });

  test('a plain run has no notebook fields', async () => {
    fake.handle((req, res) => {
      if (!req.url.endsWith('/exec')) return defaultHandler(req, res, undefined as never);
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(eventLine('exit', 0, 0));
    });
    assert.deepEqual(await sandbox.run('x'), { stdout: '', stderr: '', exitCode: 0, displays: [] });
  });

  test('context calls use the routes of docs/api.md', async () => {
    const context = { id: 'c1', cwd: '/tmp', execution_count: 0 };
    fake.handle((req, res) => {
      if (req.method === 'POST' && req.url.endsWith('/contexts'))
        return sendJson(res, 200, context);
      if (req.method === 'GET') return sendJson(res, 200, { contexts: [context] });
      if (req.url.endsWith('/restart')) return sendJson(res, 200, context);
      res.writeHead(204).end();
    });
    assert.deepEqual(await sandbox.createContext({ id: 'c1', cwd: '/tmp' }), context);
    assert.deepEqual(await sandbox.listContexts(), [context]);
    assert.deepEqual(await sandbox.restartContext('c1'), context);
    await sandbox.deleteContext('c1');
    assert.deepEqual(
      fake.requests.slice(-4).map((r) => [r.method, r.url, r.body]),
      [
        ['POST', `/v1/sandboxes/${ID}/contexts`, '{"id":"c1","cwd":"/tmp"}'],
        ['GET', `/v1/sandboxes/${ID}/contexts`, ''],
        ['POST', `/v1/sandboxes/${ID}/contexts/c1/restart`, ''],
        ['DELETE', `/v1/sandboxes/${ID}/contexts/c1`, ''],
      ],
    );
  });

  test('context errors are their classes', async () => {
    fake.handle((req, res) => {
      if (req.method === 'POST') return sendError(res, 409, 'exists', 'context_exists');
      if (req.method === 'DELETE' && req.url.endsWith('/default')) {
        return sendError(res, 400, 'default', 'context_is_default');
      }
      sendError(res, 404, 'no context', 'context_not_found');
    });
    await assert.rejects(sandbox.createContext({ id: 'c1' }), ContextExistsError);
    await assert.rejects(sandbox.listContexts(), ContextNotFoundError);
    await assert.rejects(sandbox.deleteContext('default'), InvalidRequestError);
  });
});
