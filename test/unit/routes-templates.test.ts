/**
 * Route tests of the template routes (docs/api.md, Templates): the list, one template, its build
 * log as plain text, and what creates of a building or failed template get (503 with Retry-After,
 * 500 template_failed). On fake images (test/helpers/fake-images.ts) through `inject()`.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { eventually } from '../../testkit/eventually.js';
import { FakeImages, plan } from '../helpers/fake-images.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

describe('template routes', () => {
  let s: TestServer;
  const images = new FakeImages(['python']);
  images.failing.set('broken', 'build step "setup" failed (exit status 3)');
  images.logs.set('broken', 'step 1\nstep 2 failed\n');
  images.hold();
  before(async () => {
    s = await startServer({
      templates: [plan('python'), plan('broken'), plan('later', { poolSize: 0 })],
      images,
    });
    await eventually('a build to wait', () => images.waiting === 1);
  });
  after(() => (images.release(), s.close()));

  const state = async (name: string): Promise<string> =>
    (
      JSON.parse((await s.inject({ method: 'GET', url: `/v1/templates/${name}` })).body) as {
        state: string;
      }
    ).state;

  test('while a template builds, creates of it are 503 template_unavailable with Retry-After', async () => {
    assert.equal(await state('broken'), 'building');
    const res = await s.inject({
      method: 'POST',
      url: '/v1/sandboxes',
      payload: { template: 'broken' },
    });
    assert.equal(res.statusCode, 503);
    assert.equal(errorBody(res).code, Errors.templateUnavailable.code);
    assert.ok(Number(res.headers['retry-after']) > 0, String(res.headers['retry-after']));
  });

  test('GET /v1/templates lists every template with its state', async () => {
    const res = await s.inject({ method: 'GET', url: '/v1/templates' });
    assert.equal(res.statusCode, 200);
    assert.equal(res.headers['content-type'], 'application/json; charset=utf-8');
    const { templates } = JSON.parse(res.body) as { templates: { name: string; state: string }[] };
    assert.deepEqual(
      templates.map((t) => t.name),
      ['python', 'broken', 'later'],
    );
    assert.equal(templates[0]!.state, 'ready');
  });

  test('a failed build: GET says why, its log is plain text, creates are 500 template_failed', async () => {
    images.release();
    await eventually('the build to fail', async () => (await state('broken')) === 'failed');
    const one = await s.inject({ method: 'GET', url: '/v1/templates/broken' });
    assert.equal(one.statusCode, 200);
    assert.equal((JSON.parse(one.body) as { error: string }).error, images.failing.get('broken'));
    const log = await s.inject({ method: 'GET', url: '/v1/templates/broken/log' });
    assert.equal(log.statusCode, 200);
    assert.equal(log.headers['content-type'], 'text/plain; charset=utf-8');
    assert.equal(log.body, images.logs.get('broken'));
    const create = await s.inject({
      method: 'POST',
      url: '/v1/sandboxes',
      payload: { template: 'broken' },
    });
    assert.equal(create.statusCode, 500);
    assert.equal(errorBody(create).code, Errors.templateFailed.code);
  });

  test('an unknown template is 404 template_not_found, for GET and its log', async () => {
    for (const url of ['/v1/templates/no-such', '/v1/templates/no-such/log']) {
      const res = await s.inject({ method: 'GET', url });
      assert.equal(res.statusCode, 404, url);
      assert.equal(errorBody(res).code, Errors.templateNotFound.code, url);
    }
  });

  test('every route of this area was exercised', () => assertAreaCovered('templates'));
});
