/**
 * Route tests of the files API (docs/api.md, Files): upload, download, list, stat, mkdir, move
 * and delete, their query validation (`400 invalid_path`, `invalid_request`), the size bound
 * before the body (`413 file_too_large`), the guest's refusals as 403/404, and the download
 * headers. On the fake hypervisor's files (test/helpers/fake-files.ts, no tar) through
 * `inject()`; real guests' filesystems are the integration tests'.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { FileOpError } from '../../src/vm/machine.js';
import { FakeFiles } from '../helpers/fake-files.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

describe('file routes', () => {
  let s: TestServer;
  let id: string;
  before(async () => {
    s = await startServer();
    id = (await s.manager.create({})).id;
  });
  after(() => s.close());

  const files = (path: string) => `/v1/sandboxes/${id}/files${path}`;
  const upload = (query: string, payload: string, headers: Record<string, string> = {}) =>
    s.inject({
      method: 'PUT',
      url: files(query),
      payload,
      headers: { 'content-type': 'application/octet-stream', ...headers },
    });

  test('PUT writes the body as the file; GET reads it back as octet-stream, uncached', async () => {
    const put = await upload('?path=/tmp/a.txt&mode=0600', 'hello');
    assert.equal(put.statusCode, 200, put.body);
    assert.equal(put.headers['content-type'], 'application/json; charset=utf-8');
    const get = await s.inject({ method: 'GET', url: files('?path=/tmp/a.txt') });
    assert.equal(get.statusCode, 200);
    assert.equal(get.body, 'hello');
    assert.equal(get.headers['content-type'], 'application/octet-stream');
    assert.equal(get.headers['cache-control'], 'no-store');
    const raw = await s.inject({ method: 'GET', url: files('?path=/tmp/a.txt&format=raw') });
    assert.equal(raw.body, 'hello');
  });

  test('an upload over SERVICE_MAX_FILE_BYTES is 413 file_too_large, the JSON body limit not applying', async () => {
    const res = await upload('?path=/tmp/big', 'x'.repeat(2048));
    assert.equal(res.statusCode, 413);
    assert.equal(errorBody(res).code, Errors.fileTooLarge.code);
  });

  test('a bad mode or format is 400 invalid_request', async () => {
    for (const mode of ['rwx', '0999', '12345']) {
      const res = await upload(`?path=/tmp/m&mode=${mode}`, 'x');
      assert.equal(res.statusCode, 400, mode);
      assert.equal(errorBody(res).code, Errors.invalidField.code, mode);
    }
    const format = await s.inject({ method: 'GET', url: files('?path=/tmp/a.txt&format=zip') });
    assert.equal(format.statusCode, 400);
    assert.equal(errorBody(format).code, Errors.invalidField.code);
  });

  test('a missing, relative, repeated, NUL or ".." path is 400 invalid_path on every route', async () => {
    const routes = [
      ['PUT', ''],
      ['GET', ''],
      ['DELETE', ''],
      ['GET', '/list'],
      ['GET', '/stat'],
      ['POST', '/mkdir'],
      ['POST', '/move'],
    ] as const;
    for (const query of [
      '',
      '?path=',
      '?path=tmp/x',
      '?path=/a&path=/b',
      '?path=/tmp/%00',
      '?path=/tmp/../etc',
    ]) {
      for (const [method, route] of routes) {
        const to = route === '/move' ? `${query ? '&' : '?'}to=/tmp/y` : '';
        const res = await s.inject({ method, url: files(`${route}${query}${to}`) });
        assert.equal(res.statusCode, 400, `${method} ${route}${query}: ${res.body}`);
        assert.equal(errorBody(res).code, Errors.invalidPath.code, `${method} ${route}${query}`);
      }
    }
    const to = await s.inject({ method: 'POST', url: files('/move?path=/tmp/a.txt&to=rel') });
    assert.equal(to.statusCode, 400);
    assert.equal(errorBody(to).code, Errors.invalidPath.code);
  });

  test('list, stat, mkdir and move answer JSON; delete is 204; a body on them is 400', async () => {
    await upload('?path=/tmp/m.txt', 'm');
    const mkdir = await s.inject({ method: 'POST', url: files('/mkdir?path=/tmp/d') });
    assert.equal(mkdir.statusCode, 200, mkdir.body);
    assert.deepEqual(JSON.parse(mkdir.body), { path: '/tmp/d' });
    const list = await s.inject({ method: 'GET', url: files('/list?path=/tmp') });
    assert.equal(list.statusCode, 200);
    assert.ok(Array.isArray((JSON.parse(list.body) as { entries: unknown[] }).entries));
    const stat = await s.inject({ method: 'GET', url: files('/stat?path=/tmp/m.txt') });
    assert.equal(stat.statusCode, 200, stat.body);
    assert.equal(stat.headers['content-type'], 'application/json; charset=utf-8');
    const move = await s.inject({
      method: 'POST',
      url: files('/move?path=/tmp/m.txt&to=/tmp/n.txt'),
    });
    assert.equal(move.statusCode, 200, move.body);
    assert.deepEqual(JSON.parse(move.body), { path: '/tmp/n.txt' });
    for (const [method, route] of [
      ['POST', '/mkdir?path=/tmp/e'],
      ['POST', '/move?path=/tmp/n.txt&to=/tmp/o.txt'],
      ['DELETE', '?path=/tmp/n.txt'],
    ] as const) {
      const res = await s.inject({ method, url: files(route), payload: {} });
      assert.equal(res.statusCode, 400, route);
      assert.equal(errorBody(res).code, Errors.bodyNotAllowed.code, route);
    }
    const flag = await s.inject({ method: 'DELETE', url: files('?path=/tmp/n.txt&recursive=yes') });
    assert.equal(flag.statusCode, 400);
    assert.equal(errorBody(flag).code, Errors.invalidField.code);
    const del = await s.inject({ method: 'DELETE', url: files('?path=/tmp/n.txt&recursive=1') });
    assert.equal(del.statusCode, 204);
    assert.equal(del.body, '');
  });

  test('what is not there is 404 file_not_found', async () => {
    for (const [method, route] of [
      ['GET', '?path=/tmp/none'],
      ['GET', '/stat?path=/tmp/none'],
      ['DELETE', '?path=/tmp/none'],
      ['POST', '/move?path=/tmp/none&to=/tmp/x'],
    ] as const) {
      const res = await s.inject({ method, url: files(route) });
      assert.equal(res.statusCode, 404, route);
      assert.equal(errorBody(res).code, Errors.fileNotFound.code, route);
    }
  });

  test("the guest's refusal is 403 permission_denied", async () => {
    const mkdir = FakeFiles.prototype.mkdir;
    FakeFiles.prototype.mkdir = () =>
      Promise.reject(new FileOpError('permission_denied', '/proc/x', 'read-only file system'));
    try {
      const res = await s.inject({ method: 'POST', url: files('/mkdir?path=/proc/x') });
      assert.equal(res.statusCode, 403);
      assert.equal(errorBody(res).code, Errors.permissionDenied.code);
    } finally {
      FakeFiles.prototype.mkdir = mkdir;
    }
  });

  test('every route of this area was exercised', () => assertAreaCovered('files'));
});
