/**
 * Every request carries a well-formed `traceparent`: the active OpenTelemetry span's ids when
 * `@opentelemetry/api` is present and a span is active, fresh random ids otherwise (including
 * when the package is absent).
 */
import assert from 'node:assert/strict';
import { AsyncLocalStorage } from 'node:async_hooks';
import { cp, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import { Sandbox } from '../src/index.js';
import { setOtelLoaderForTests, traceparent } from '../src/trace.js';
import { defaultHandler, eventLine, startFakeHostd, type FakeHostd } from './helpers/fake-hostd.js';
import { PACKAGE_DIR } from './helpers/live.js';

const FORMAT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const ID = 'sbx_' + 'b'.repeat(32);

/** Runs one request of each kind against the fake and returns the traceparents it saw. */
async function everyKindOfRequest(
  fake: FakeHostd,
  sdk: { Sandbox: typeof Sandbox } = { Sandbox },
): Promise<string[]> {
  fake.handle((req, res) => {
    if (req.url.endsWith('/exec')) {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      return void res.end(eventLine('exit', 0, 0));
    }
    if (req.url.endsWith('/fork')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(
        JSON.stringify({
          parent_id: ID,
          children: [{ id: 'sbx_' + 'c'.repeat(32), state: 'ready' }],
        }),
      );
    }
    if (req.url.includes('/merge_into/')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(
        JSON.stringify({ id: ID, state: 'ready', merged: 'sbx_' + 'c'.repeat(32) }),
      );
    }
    if (req.method === 'DELETE') {
      res.writeHead(204);
      return void res.end();
    }
    if (req.url === '/v1/sandboxes' && req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end('{"sandboxes":[]}');
    }
    return defaultHandler(req, res, undefined as never);
  });
  const before = fake.requests.length;
  const s = await sdk.Sandbox.create({ baseUrl: fake.url });
  await s.run('1');
  const [child] = await s.fork(1);
  await s.merge(child!);
  await sdk.Sandbox.list({ baseUrl: fake.url });
  await s.delete();
  const seen = fake.requests.slice(before).map((r) => r.headers.traceparent);
  assert.equal(seen.length, 6);
  return seen.map((t) => {
    assert.equal(typeof t, 'string', 'traceparent header missing');
    return t as string;
  });
}

function assertFreshIds(headers: string[]): void {
  for (const h of headers) {
    const m = FORMAT.exec(h);
    assert.ok(m, `malformed traceparent ${h}`);
    assert.doesNotMatch(m[1]!, /^0+$/);
    assert.doesNotMatch(m[2]!, /^0+$/);
  }
  assert.equal(
    new Set(headers.map((h) => h.split('-')[1])).size,
    headers.length,
    'trace ids repeat',
  );
  assert.equal(
    new Set(headers.map((h) => h.split('-')[2])).size,
    headers.length,
    'span ids repeat',
  );
}

describe('traceparent', { timeout: 30_000 }, () => {
  let fake: FakeHostd;
  before(async () => {
    fake = await startFakeHostd();
  });
  after(() => fake.close());
  afterEach(() => setOtelLoaderForTests(null));

  test('is on every request, well-formed, with fresh ids each time (no active span)', async () => {
    assertFreshIds(await everyKindOfRequest(fake));
  });

  test('falls back to random ids when @opentelemetry/api cannot be loaded', async () => {
    setOtelLoaderForTests(() =>
      Promise.reject(new Error("Cannot find package '@opentelemetry/api'")),
    );
    assertFreshIds(await everyKindOfRequest(fake));
    assert.match(await traceparent(), FORMAT);
  });

  test('works from a copy of the SDK where @opentelemetry/api is not installed', async (t) => {
    const dir = await mkdtemp(join(tmpdir(), 'hostd-sdk-nootel-'));
    try {
      await cp(join(PACKAGE_DIR, 'dist', 'src'), join(dir, 'src'), { recursive: true });
      await writeFile(join(dir, 'package.json'), '{"type":"module"}');
      const entry = join(dir, 'src', 'index.js');
      try {
        createRequire(entry).resolve('@opentelemetry/api');
        t.skip(`@opentelemetry/api is resolvable from ${dir}; cannot test its absence here`);
        return;
      } catch {
        // Absent, as wanted.
      }
      const copy = (await import(pathToFileURL(entry).href)) as typeof import('../src/index.js');
      assertFreshIds(await everyKindOfRequest(fake, copy));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test("carries the active OpenTelemetry span's trace and span ids", async (t) => {
    const name = '@opentelemetry/api';
    let otel: OtelForTest;
    try {
      otel = (await import(name)) as OtelForTest;
    } catch {
      t.skip('@opentelemetry/api is not installed here (it is an optional peer dependency)');
      return;
    }
    setOtelLoaderForTests(null);
    const manager = new AlsContextManager(otel.ROOT_CONTEXT);
    assert.ok(
      otel.context.setGlobalContextManager(manager),
      'could not register a context manager',
    );
    try {
      const span = otel.trace.wrapSpanContext({
        traceId: '4bf92f3577b34da6a3ce929d0e0e4736',
        spanId: '00f067aa0ba902b7',
        traceFlags: 1,
      });
      const inSpan = await otel.context.with(otel.trace.setSpan(otel.context.active(), span), () =>
        everyKindOfRequest(fake),
      );
      assert.deepEqual(
        new Set(inSpan),
        new Set(['00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01']),
      );
      const unsampled = otel.trace.wrapSpanContext({
        traceId: '0af7651916cd43dd8448eb211c80319c',
        spanId: 'b7ad6b7169203331',
        traceFlags: 0,
      });
      const header = await otel.context.with(
        otel.trace.setSpan(otel.context.active(), unsampled),
        () => traceparent(),
      );
      assert.equal(header, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00');
      // Outside any span: random again.
      assertFreshIds(await everyKindOfRequest(fake));
    } finally {
      otel.context.disable();
    }
  });
});

/** The slice of @opentelemetry/api this test uses, typed here so it compiles without it. */
interface OtelForTest {
  ROOT_CONTEXT: unknown;
  context: {
    setGlobalContextManager(m: unknown): boolean;
    active(): unknown;
    with<T>(ctx: unknown, fn: () => T): T;
    disable(): void;
  };
  trace: {
    wrapSpanContext(sc: { traceId: string; spanId: string; traceFlags: number }): unknown;
    setSpan(ctx: unknown, span: unknown): unknown;
  };
}

/** A minimal OpenTelemetry ContextManager, as @opentelemetry/context-async-hooks provides. */
class AlsContextManager {
  readonly #als = new AsyncLocalStorage<unknown>();
  constructor(readonly root: unknown) {}
  active(): unknown {
    return this.#als.getStore() ?? this.root;
  }
  with<A extends unknown[], R>(
    ctx: unknown,
    fn: (...args: A) => R,
    thisArg?: unknown,
    ...args: A
  ): R {
    return this.#als.run(ctx, () => fn.apply(thisArg, args));
  }
  bind<T>(_ctx: unknown, target: T): T {
    return target;
  }
  enable(): this {
    return this;
  }
  disable(): this {
    this.#als.disable();
    return this;
  }
}
