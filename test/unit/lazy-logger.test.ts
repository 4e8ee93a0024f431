/**
 * The per-request logger made at its first use (src/api/lazy-logger.ts): a request that logs
 * nothing makes no pino child, and one that logs writes the lines the child would have.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyBaseLogger } from 'fastify';
import { LazyChildLogger } from '../../src/api/lazy-logger.js';
import { capturedLog } from '../helpers/manager.js';
import { startServer } from '../helpers/server.js';

const strip = (l: Record<string, unknown>): Record<string, unknown> => ({ ...l, time: 0 });

test('a lazy child writes what pino.child writes, and is made only at its first line', () => {
  const { log, lines } = capturedLog();
  const parent = log as unknown as FastifyBaseLogger;
  const lazy = new LazyChildLogger(parent, { reqId: 'req-7' }, {});
  assert.equal(lazy.materialized, false);
  assert.equal(lazy.level, 'debug', "the parent's level, read without making the child");
  assert.equal(lazy.materialized, false);

  const eager = parent.child({ reqId: 'req-7' }, {});
  for (const l of [lazy, eager]) {
    l.error({ err: new Error('boom'), n: 1 }, 'internal error');
    l.info('plain %s', 'text');
    l.warn({ a: 1 });
    l.debug('below nothing');
    l.trace('below the level');
  }
  assert.equal(lazy.materialized, true);
  assert.equal(lines.length, 8);
  const half = lines.length / 2;
  assert.deepEqual(lines.slice(0, half).map(strip), lines.slice(half).map(strip));
  assert.equal(lines[0]!.reqId, 'req-7');
  assert.equal(lines[1]!.msg, 'plain text');

  // Its own children carry both bindings, as a pino child's do.
  lazy.child({ sub: 2 }).info('nested');
  assert.deepEqual([lines.at(-1)!.reqId, lines.at(-1)!.sub], ['req-7', 2]);
});

test("a lazy child's level is the one its options give, and can be set", () => {
  const { log, lines } = capturedLog();
  const lazy = new LazyChildLogger(
    log as unknown as FastifyBaseLogger,
    { reqId: 'r' },
    {
      level: 'warn',
    },
  );
  assert.equal(lazy.level, 'warn');
  lazy.info('dropped');
  assert.equal(lines.length, 0);
  lazy.level = 'info';
  lazy.info('kept');
  assert.deepEqual(
    lines.map((l) => l.msg),
    ['kept'],
  );
});

test('a create that logs nothing through req.log makes no child logger', async () => {
  const { log, lines } = capturedLog();
  const s = await startServer({}, log);
  try {
    const seen: boolean[] = [];
    s.app.addHook('onResponse', async (req) => {
      seen.push(req.log instanceof LazyChildLogger && !req.log.materialized);
    });
    const created = await s.inject({ method: 'POST', url: '/v1/sandboxes', payload: {} });
    assert.equal(created.statusCode, 200);
    assert.deepEqual(seen, [true]);
  } finally {
    await s.close();
  }
  assert.ok(lines.some((l) => l.msg === 'sandbox ready'));
});
