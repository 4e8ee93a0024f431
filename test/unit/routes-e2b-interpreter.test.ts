/**
 * Route tests of the code interpreter as the E2B front serves it (docs/e2b.md, Code
 * interpreter; `E2b-Sandbox-Port: 49999`), over a manager on the fake hypervisor through
 * `inject()`: its tokens (the access or the traffic token, in either header), `/execute`'s
 * validation and its NDJSON lines, `/contexts`, and the error answers whose status line says
 * why (the SDKs show only that line). What cells do in a real kernel, and that the published
 * `@e2b/code-interpreter` reads these answers, is test/integration/e2b-interpreter.test.ts's.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import {
  e2bErrorBody,
  ndjsonLines,
  startE2bServer,
  type E2bSandbox,
  type TestE2bServer,
} from '../helpers/e2b-server.js';
import { E2B_ROUTE_AREAS, assertAreaCovered } from '../helpers/routes.js';

const JSON_TYPE = { 'content-type': 'application/json' };
const json = <T = unknown>(res: { body: string }): T => JSON.parse(res.body) as T;

/** The interpreter routes that take a token, as `[method, url]`. */
const TOKEN_ROUTES = Object.keys(E2B_ROUTE_AREAS)
  .filter((r) => r.startsWith('interpreter ') && !r.endsWith(' /health'))
  .map((r) => r.split(' ').slice(1) as ['GET' | 'POST' | 'DELETE', string])
  .map(([m, url]) => [m, url.replace(':context', 'c1')] as const);

describe('the code interpreter on the E2B front', () => {
  let s: TestE2bServer;
  let sbx: E2bSandbox;
  let other: E2bSandbox;
  before(async () => {
    s = await startE2bServer();
    sbx = await s.sandbox();
    other = await s.sandbox();
  });
  after(() => s.close());

  const execute = (body: unknown, headers = {}) =>
    s.interpreter(sbx, {
      method: 'POST',
      url: '/execute',
      headers: { ...JSON_TYPE, ...headers },
      payload: JSON.stringify(body),
    });
  /** `/execute`'s lines without their timestamps. */
  const lines = async (body: unknown) => {
    const res = await execute(body);
    assert.equal(res.statusCode, 200, res.body);
    assert.equal(res.headers['cache-control'], 'no-store');
    return ndjsonLines(res).map(({ timestamp, ...line }) => {
      if (timestamp !== undefined) assert.ok(!Number.isNaN(Date.parse(String(timestamp))));
      return line;
    });
  };

  describe('tokens', () => {
    test('every route but /health takes the access or traffic token, of this sandbox only', async () => {
      for (const [method, url] of TOKEN_ROUTES) {
        for (const headers of [
          { 'x-access-token': undefined },
          { 'x-access-token': other.accessToken },
          { 'x-access-token': undefined, 'e2b-traffic-access-token': other.trafficToken },
        ]) {
          const res = await s.interpreter(sbx, { method, url, headers });
          assert.equal(res.statusCode, 401, `${method} ${url} ${JSON.stringify(headers)}`);
          assert.equal(e2bErrorBody(res).error_code, Errors.invalidAccessToken.code);
        }
      }
      for (const headers of [
        { 'x-access-token': sbx.trafficToken },
        { 'x-access-token': undefined, 'e2b-traffic-access-token': sbx.trafficToken },
        { 'x-access-token': undefined, 'e2b-traffic-access-token': sbx.accessToken },
      ]) {
        const res = await s.interpreter(sbx, { url: '/contexts', headers });
        assert.equal(res.statusCode, 200, JSON.stringify(headers));
      }
    });

    test('/health is "OK" without a token; a sandbox that is not running is 502', async () => {
      const health = await s.interpreter(sbx, {
        url: '/health',
        headers: { 'x-access-token': undefined },
      });
      assert.deepEqual([health.statusCode, json(health)], [200, 'OK']);
      const gone = await s.sandbox();
      assert.equal(
        (await s.inject({ method: 'DELETE', url: `/sandboxes/${gone.id}` })).statusCode,
        204,
      );
      const res = await s.interpreter(gone, { url: '/health' });
      assert.equal(res.statusCode, 502);
      assert.deepEqual(json(res), {
        code: 502,
        message: Errors.sandboxNotRunning.message(gone.id),
        error_code: Errors.sandboxNotRunning.code,
        sandboxId: gone.id,
      });
      const unknown = await s.interpreter(sbx, { url: '/nope' });
      assert.equal(e2bErrorBody(unknown).error_code, Errors.routeNotFound.code);
    });
  });

  describe('/execute', () => {
    test("a cell's execution count, output, results and errors are NDJSON lines, end_of_execution last", async () => {
      assert.deepEqual(await lines({ code: 'print hi' }), [
        { type: 'number_of_executions', execution_count: 1 },
        { type: 'stdout', text: 'hi\n' },
        { type: 'end_of_execution' },
      ]);
      assert.deepEqual(await lines({ code: 'value 42', language: 'Python ' }), [
        { type: 'number_of_executions', execution_count: 2 },
        { type: 'result', is_main_result: true, text: '42', extra: {} },
        { type: 'end_of_execution' },
      ]);
      assert.deepEqual(await lines({ code: 'raise ValueError bad' }), [
        { type: 'number_of_executions', execution_count: 3 },
        { type: 'error', name: 'ValueError', value: 'bad', traceback: 'Traceback' },
        { type: 'end_of_execution' },
      ]);
      assert.deepEqual((await lines({ code: 'env K', env_vars: { K: 'v' } }))[1], {
        type: 'stdout',
        text: 'v\n',
      });
    });

    test('bash runs outside the contexts: no execution count', async () => {
      assert.deepEqual(await lines({ code: 'print hi', language: 'bash' }), [
        { type: 'stdout', text: 'hi\n' },
        { type: 'end_of_execution' },
      ]);
    });

    test('a bad body is 400; the status line says why, as the SDK shows only that line', async () => {
      const cases: [unknown, string][] = [
        [[1], Errors.bodyNotObject.code],
        [{}, Errors.invalidField.code],
        [{ code: 7 }, Errors.invalidField.code],
        [{ code: '1', context_id: 'c1', language: 'python' }, Errors.conflictingFields.code],
        [{ code: '1', context_id: 7 }, Errors.invalidField.code],
        [{ code: '1', env_vars: { K: 1 } }, Errors.invalidField.code],
      ];
      for (const [body, code] of cases) {
        const res = await execute(body);
        assert.equal(res.statusCode, 400, JSON.stringify(body));
        const error = e2bErrorBody(res);
        assert.equal(error.error_code, code, JSON.stringify(body));
        assert.equal(res.statusMessage, error.message);
      }
      const broken = await s.interpreter(sbx, {
        method: 'POST',
        url: '/execute',
        headers: JSON_TYPE,
        payload: '{"code":',
      });
      assert.equal(e2bErrorBody(broken).error_code, Errors.bodyNotJson.code);
    });

    test('a language without a kernel here is 501 saying so; an unknown context 404', async () => {
      const js = await execute({ code: '1', language: 'js' });
      assert.equal(js.statusCode, 501);
      assert.equal(e2bErrorBody(js).error_code, Errors.notSupported.code);
      assert.match(js.statusMessage, /^the javascript language is not supported by hostd/);
      for (const context of ['nope', 'default', '../x']) {
        const res = await execute({ code: '1', context_id: context });
        assert.equal(res.statusCode, 404, context);
        assert.equal(e2bErrorBody(res).error_code, Errors.contextNotFound.code, context);
      }
    });
  });

  describe('/contexts', () => {
    test('made in the home or cwd, listed default first and newest last, restarted, removed', async () => {
      const made = await s.interpreter(sbx, {
        method: 'POST',
        url: '/contexts',
        headers: JSON_TYPE,
        payload: JSON.stringify({ cwd: '/tmp' }),
      });
      assert.equal(made.statusCode, 200, made.body);
      const context = json<{ id: string; language: string; cwd: string }>(made);
      assert.deepEqual([context.language, context.cwd], ['python', '/tmp']);
      const listed = await s.interpreter(sbx, { url: '/contexts' });
      const all = json<{ id: string; cwd: string }[]>(listed);
      assert.deepEqual(all[0], { id: 'python', language: 'python', cwd: '/home/user' });
      assert.deepEqual(all.at(-1), context);

      const cell = await lines({ code: 'print in it', context_id: context.id });
      assert.deepEqual(cell[0], { type: 'number_of_executions', execution_count: 1 });
      for (const [method, url] of [
        ['POST', `/contexts/${context.id}/restart`],
        ['DELETE', `/contexts/${context.id}`],
      ] as const) {
        const res = await s.interpreter(sbx, { method, url });
        assert.deepEqual([res.statusCode, res.body], [200, 'null'], `${method} ${url}`);
      }
      for (const [method, url] of [
        ['DELETE', `/contexts/${context.id}`],
        ['POST', `/contexts/${context.id}/restart`],
        ['POST', '/contexts/default/restart'],
      ] as const) {
        const res = await s.interpreter(sbx, { method, url });
        assert.equal(res.statusCode, 404, `${method} ${url}`);
        assert.equal(e2bErrorBody(res).error_code, Errors.contextNotFound.code);
      }
    });

    test('a language other than python is 501; a bad cwd 400', async () => {
      for (const [body, status, code] of [
        [{ language: 'r' }, 501, Errors.notSupported.code],
        [{ cwd: 7 }, 400, Errors.invalidField.code],
      ] as const) {
        const res = await s.interpreter(sbx, {
          method: 'POST',
          url: '/contexts',
          headers: JSON_TYPE,
          payload: JSON.stringify(body),
        });
        assert.equal(res.statusCode, status, JSON.stringify(body));
        assert.equal(e2bErrorBody(res).error_code, code);
        assert.equal(res.statusMessage, json<{ message: string }>(res).message);
      }
    });
  });

  test('every route of the interpreter was exercised', () => assertAreaCovered('e2b-interpreter'));
});
