/**
 * The web console's files as hostd serves them: without a key (the page asks for one before
 * its first API call), with a strict Content-Security-Policy and revalidated on every load,
 * while the API next to them still requires the key.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { pino } from 'pino';
import type { FastifyInstance } from 'fastify';
import { buildServer } from '../../src/api/server.js';
import { createMetrics } from '../../src/api/metrics.js';
import { CONSOLE_DIR } from '../../src/api/routes/console.js';
import type { SandboxManager } from '../../src/core/sandbox-manager.js';

let app: FastifyInstance;
before(async () => {
  app = await buildServer({
    manager: { list: () => [] } as unknown as SandboxManager,
    auth: { kind: 'keys', keys: ['secret'] },
    maxBodyBytes: 1024,
    maxFileBytes: 1024,
    logger: pino({ level: 'silent' }),
    metrics: createMetrics({ accel: 'tcg', version: 'test' }),
  });
  await app.ready();
});
after(() => app.close());

test('/ and /console redirect to /console/, which serves the page without a key', async () => {
  for (const url of ['/', '/console']) {
    const res = await app.inject({ method: 'GET', url });
    assert.equal(res.statusCode, 302, url);
    assert.equal(res.headers.location, '/console/');
  }
  const page = await app.inject({ method: 'GET', url: '/console/' });
  assert.equal(page.statusCode, 200);
  assert.match(String(page.headers['content-type']), /^text\/html/);
  assert.match(page.body, /<script type="module" src="js\/app\.js"><\/script>/);
});

test('every console file is served with a strict CSP, nosniff and revalidation', async () => {
  const files = readdirSync(CONSOLE_DIR, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && /\.(js|css|html)$/.test(e.name))
    .map((e) => join(e.parentPath, e.name).slice(CONSOLE_DIR.length));
  assert.ok(files.includes('js/app.js') && files.includes('console.css'), files.join(' '));
  for (const file of files) {
    const res = await app.inject({ method: 'GET', url: `/console/${file}` });
    assert.equal(res.statusCode, 200, file);
    const csp = String(res.headers['content-security-policy']);
    assert.match(csp, /default-src 'self'/, file);
    assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|https?:/, file);
    assert.equal(res.headers['x-content-type-options'], 'nosniff');
    assert.equal(res.headers['cache-control'], 'no-cache');
    assert.ok(res.headers.etag, `${file} has an ETag for revalidation`);
    if (file.endsWith('.js')) assert.match(String(res.headers['content-type']), /javascript/);
  }
});

test('the page has no inline script or style, which the CSP would block', async () => {
  const page = (await app.inject({ method: 'GET', url: '/console/index.html' })).body;
  assert.doesNotMatch(page, /<script(?![^>]*\bsrc=)[^>]*>/);
  assert.doesNotMatch(page, /\son[a-z]+=|<style|style=/i);
});

test('nothing outside console/ is served, and the API still requires the key', async () => {
  for (const url of [
    '/console/../package.json',
    '/console/%2e%2e/package.json',
    '/console/nope.js',
  ]) {
    const res = await app.inject({ method: 'GET', url });
    assert.equal(res.statusCode, 404, url);
    assert.equal(res.json().code, 'route_not_found', url);
  }
  const api = await app.inject({ method: 'GET', url: '/v1/sandboxes' });
  assert.deepEqual([api.statusCode, api.json().code], [401, 'missing_api_key']);
  const keyed = await app.inject({
    method: 'GET',
    url: '/v1/sandboxes',
    headers: { authorization: 'Bearer secret' },
  });
  assert.deepEqual(keyed.json(), { sandboxes: [] });
});
