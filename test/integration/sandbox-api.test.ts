/**
 * The sandbox lifecycle and HTTP surface, against a real hostd with real VMs.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import { nothingLeft, startHostd, type Hostd, type ErrorBody } from '../../testkit/hostd.js';
import { openExec, run } from '../../testkit/exec.js';
import { withSandbox, withSandboxes } from '../../testkit/sandboxes.js';

let hostd: Hostd;
before(async () => {
  hostd = await startHostd();
});
after(async () => {
  const code = await hostd.stop();
  assert.equal(code, 0, 'hostd exits 0 on SIGTERM');
  assert.deepEqual(await nothingLeft(hostd.stateDir), { qemu: 0, dirExists: false });
});

describe('create', () => {
  test('an empty body gives a ready sandbox with a sbx_ + 32 hex id', async () => {
    await withSandboxes(hostd, async ({ track }) => {
      const res = await hostd.json<{ id: string; state: string }>('POST', '/v1/sandboxes', {});
      assert.equal(res.status, 200);
      track(res.body.id);
      assert.match(res.body.id, /^sbx_[0-9a-f]{32}$/);
      assert.equal(res.body.state, 'ready');
      assert.deepEqual(Object.keys(res.body).sort(), ['id', 'state']);
    });
  });

  test('no body at all and {"template":"python"} work too', async () => {
    await withSandboxes(hostd, async ({ track }) => {
      const a = await hostd.request('POST', '/v1/sandboxes');
      assert.equal(a.status, 200);
      track(((await a.json()) as { id: string }).id);
      const b = await hostd.json<{ id: string }>('POST', '/v1/sandboxes', { template: 'python' });
      assert.equal(b.status, 200);
      track(b.body.id);
    });
  });

  test('ids are unique across many creates', async () => {
    await withSandboxes(hostd, async ({ create }) => {
      const ids = await Promise.all(Array.from({ length: 4 }, () => create()));
      assert.equal(new Set(ids).size, 4);
    });
  });
});

describe('describe, list and delete', () => {
  test('GET returns state, template and times; list includes it; DELETE is 204 then 404', async () => {
    await withSandboxes(hostd, async ({ create }) => {
      const id = await create();
      const one = await hostd.json<Record<string, unknown>>('GET', `/v1/sandboxes/${id}`);
      assert.equal(one.status, 200);
      assert.equal(one.body.id, id);
      assert.equal(one.body.state, 'ready');
      assert.equal(one.body.template, 'python');
      assert.equal(one.body.busy, false);
      assert.equal(one.body.queued, 0);
      assert.ok(!Number.isNaN(Date.parse(String(one.body.created_at))));
      const all = await hostd.json<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes');
      assert.ok(all.body.sandboxes.some((s) => s.id === id));

      const del = await hostd.request('DELETE', `/v1/sandboxes/${id}`);
      assert.equal(del.status, 204);
      assert.equal(await del.text(), '');
      for (const [method, path] of [
        ['GET', `/v1/sandboxes/${id}`],
        ['DELETE', `/v1/sandboxes/${id}`],
      ] as const) {
        const res = await hostd.json<ErrorBody>(method, path);
        assert.equal(res.status, 404);
        assert.equal(res.body.code, 'sandbox_not_found');
      }
      const gone = await hostd.json<ErrorBody>('POST', `/v1/sandboxes/${id}/exec`, {
        code: '1',
      });
      assert.equal(gone.status, 404);
      assert.equal(gone.body.code, 'sandbox_not_found');
    });
  });

  test('deleting a sandbox ends its running exec with an executor error', async () => {
    await withSandbox(hostd, async (id) => {
      const stream = await openExec(hostd, id, {
        code: 'import time\nprint("started", flush=True)\nwhile True: time.sleep(60)',
      });
      await stream.until('the cell to start', (e) => e.data === 'started');
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
      const exit = (await stream.rest()).at(-1)!;
      assert.equal(exit.type, 'exit');
      assert.equal(exit.data, -1);
      assert.equal(typeof exit.error, 'string');
    });
  });
});

describe('the HTTP surface', () => {
  test('a body over the limit is a 413 and the sandbox is untouched', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'x = 41');
      // hostd answers 413 from the Content-Length alone, before reading the body: announce
      // 5 MiB and send none, so no upload races with the answer (and the connection it closes).
      const { status, body } = await announceOversizedBody(
        `${hostd.url}/v1/sandboxes/${id}/exec`,
        5 * 1024 * 1024,
      );
      assert.equal(status, 413);
      assert.equal((JSON.parse(body) as ErrorBody).code, 'body_too_large');
      assert.equal((await run(hostd, id, 'x + 1')).stdout, '42\n');
    });
  });
});

/**
 * POSTs a JSON request whose headers announce `length` bytes, sends none of them, and resolves
 * with hostd's answer.
 */
function announceOversizedBody(
  url: string,
  length: number,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': length },
    });
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => {
        resolve({ status: res.statusCode ?? 0, body: text });
        req.destroy();
      });
    });
    req.on('error', reject);
    req.flushHeaders();
  });
}
