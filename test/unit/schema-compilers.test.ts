/**
 * Fastify's schema compilers load when a route first needs one (api/schema-compilers.ts): a
 * server without route schemas never loads them, and a route with one validates and serializes
 * as with fastify's defaults.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import Fastify from 'fastify';
import { lazySchemaCompilers } from '../../src/api/schema-compilers.js';

const loaded = (name: string): boolean =>
  Object.keys(createRequire(import.meta.url).cache).some((f) => f.includes(`/${name}/`));

test('a server whose routes declare no schema loads no compiler', async () => {
  const app = Fastify({ schemaController: lazySchemaCompilers });
  app.post('/plain', async (req) => req.body);
  await app.ready();
  const res = await app.inject({ method: 'POST', url: '/plain', payload: { a: 1 } });
  assert.equal(res.json<{ a: number }>().a, 1);
  assert.equal(loaded('ajv-compiler'), false);
  assert.equal(loaded('fast-json-stringify-compiler'), false);
  await app.close();
});

test('a route with a schema validates its body and serializes its answer', async () => {
  const app = Fastify({ schemaController: lazySchemaCompilers });
  app.post(
    '/typed',
    {
      schema: {
        body: {
          type: 'object',
          required: ['n'],
          properties: { n: { type: 'integer' } },
        },
        response: { 200: { type: 'object', properties: { n: { type: 'integer' } } } },
      },
    },
    async (req) => ({ ...(req.body as object), extra: 'dropped by the serializer' }),
  );
  const bad = await app.inject({ method: 'POST', url: '/typed', payload: { n: 'x' } });
  assert.equal(bad.statusCode, 400);
  const ok = await app.inject({ method: 'POST', url: '/typed', payload: { n: 2 } });
  assert.deepEqual(ok.json(), { n: 2 });
  assert.equal(loaded('ajv-compiler'), true);
  assert.equal(loaded('fast-json-stringify-compiler'), true);
  await app.close();
});
