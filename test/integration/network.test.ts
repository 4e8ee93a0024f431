/**
 * Network egress with real VMs (docs/api.md, Network): no network by default, allow-listed
 * connections to a server on this host through host.hostd.internal, hostd's own port closed
 * whatever the rules say, rules inherited by forks and snapshots and kept across a pause, and
 * bytes counted. Only this host is reached: CI machines have no general internet.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { sandboxInfo, withSandbox, withSandboxes } from '../../testkit/sandboxes.js';

let hostd: Hostd;
let server: Server;
let port: number;
let apiPort: number;

/** What curl in the sandbox got from `url`: the HTTP status, or 000 when it could not connect. */
async function curlStatus(id: string, url: string): Promise<string> {
  const r = await run(hostd, id, `curl -s -m 20 -o /dev/null -w '%{http_code}' ${url}`, {
    language: 'bash',
  });
  return r.stdout.trim();
}

before(async () => {
  server = createServer((req, res) => {
    res.end(`from the host: ${req.method} ${req.url}\n`);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as AddressInfo).port;
  hostd = await startHostd({ env: { SERVICE_POOL_SIZE: '2' } });
  apiPort = Number(new URL(hostd.url).port);
});
after(async () => {
  await hostd.stop();
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

describe('off by default', () => {
  test('a sandbox without rules reaches nothing, and is refused at once', async () => {
    await withSandbox(hostd, async (id) => {
      assert.equal(await curlStatus(id, `http://host.hostd.internal:${port}/`), '403');
      assert.equal(await curlStatus(id, 'http://192.0.2.1/'), '403');
      assert.deepEqual((await sandboxInfo(hostd, id)).network, {
        allow_out: [],
        bytes_out: 0,
        bytes_in: 0,
      });
    });
  });
});

describe('allow-listed', () => {
  test('host.hostd.internal:PORT reaches this host from Python and curl, and bytes are counted', async () => {
    await withSandboxes(hostd, async (scope) => {
      const id = await scope.create({ network: { allow_out: [`host.hostd.internal:${port}`] } });
      const py = await run(
        hostd,
        id,
        `import urllib.request\nprint(urllib.request.urlopen("http://host.hostd.internal:${port}/py", timeout=20).read().decode(), end="")`,
      );
      assert.equal(py.stdout, 'from the host: GET /py\n', py.stderr);
      const sh = await run(hostd, id, `curl -sS -m 20 http://host.hostd.internal:${port}/sh`, {
        language: 'bash',
      });
      assert.equal(sh.stdout, 'from the host: GET /sh\n', sh.stderr);
      const { network } = await sandboxInfo(hostd, id);
      assert.deepEqual(network.allow_out, [`host.hostd.internal:${port}`]);
      assert.ok(network.bytes_in > 0 && network.bytes_out > 0, JSON.stringify(network));
      // Another port of this host is not in the rules.
      assert.equal(await curlStatus(id, `http://host.hostd.internal:${apiPort}/v1/healthz`), '403');
    });
  });

  test("hostd's own API port is never reachable, even when listed", async () => {
    await withSandbox(hostd, async () => {
      const res = await hostd.json<{ id: string }>('POST', '/v1/sandboxes', {
        network: { allow_out: [`host.hostd.internal:${apiPort}`, '127.0.0.1', '*'] },
      });
      assert.equal(res.status, 200);
      const id = res.body.id;
      try {
        assert.notEqual(
          await curlStatus(id, `http://host.hostd.internal:${apiPort}/v1/healthz`),
          '200',
        );
        assert.notEqual(await curlStatus(id, `http://127.0.0.1:${apiPort}/v1/healthz`), '200');
      } finally {
        await hostd.request('DELETE', `/v1/sandboxes/${id}`);
      }
    });
  });

  test('"*" does not reach this host: private and loopback need an explicit rule', async () => {
    await withSandboxes(hostd, async (scope) => {
      const id = await scope.create({ network: { allow_out: ['*'] } });
      assert.equal(await curlStatus(id, `http://host.hostd.internal:${port}/`), '403');
      assert.equal(await curlStatus(id, 'http://10.1.2.3/'), '403');
    });
  });

  test('fork children and sandboxes from a snapshot inherit the rules; a pause keeps them', async () => {
    await withSandboxes(hostd, async (scope) => {
      const rules = [`host.hostd.internal:${port}`];
      const id = await scope.create({ network: { allow_out: rules } });
      const fork = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${id}/fork`,
        { n: 1 },
      );
      const [child] = scope.track(fork.body.children.map((c) => c.id));
      assert.deepEqual((await sandboxInfo(hostd, child!)).network.allow_out, rules);
      assert.equal(await curlStatus(child!, `http://host.hostd.internal:${port}/child`), '200');

      const snap = await hostd.json<{ snapshot_id: string }>(
        'POST',
        `/v1/sandboxes/${id}/snapshot`,
      );
      assert.equal(snap.status, 200);
      try {
        const restored = await scope.create({ snapshot: snap.body.snapshot_id });
        assert.deepEqual((await sandboxInfo(hostd, restored)).network.allow_out, rules);
        assert.equal(await curlStatus(restored, `http://host.hostd.internal:${port}/snap`), '200');
      } finally {
        await hostd.request('DELETE', `/v1/snapshots/${snap.body.snapshot_id}`);
      }

      assert.equal((await hostd.json('POST', `/v1/sandboxes/${id}/pause`)).status, 200);
      assert.equal(await curlStatus(id, `http://host.hostd.internal:${port}/resumed`), '200');
    });
  });

  test('a child gets a reset for the connection its parent held open, then connects anew', async () => {
    await withSandboxes(hostd, async (scope) => {
      const id = await scope.create({ network: { allow_out: [`host.hostd.internal:${port}`] } });
      // Connected, nothing sent yet: the guest's relay holds the connection when it is forked.
      const opened = await run(
        hostd,
        id,
        `import socket\nheld = socket.create_connection(("host.hostd.internal", ${port}), timeout=20)\nprint("open")`,
      );
      assert.equal(opened.stdout, 'open\n', opened.stderr);
      const fork = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${id}/fork`,
        { n: 1 },
      );
      const [child] = scope.track(fork.body.children.map((c) => c.id));
      const inChild = await run(
        hostd,
        child!,
        [
          'try:',
          '    held.sendall(b"GET /held HTTP/1.0\\r\\n\\r\\n")',
          '    print("answered" if held.recv(100) else "ended")',
          'except (ConnectionResetError, BrokenPipeError):',
          '    print("reset")',
        ].join('\n'),
      );
      assert.equal(inChild.stdout, 'reset\n', inChild.stderr);
      assert.equal(await curlStatus(child!, `http://host.hostd.internal:${port}/child`), '200');
      // The parent's connection is its own: it still works.
      const inParent = await run(
        hostd,
        id,
        'held.sendall(b"GET /parent HTTP/1.0\\r\\n\\r\\n")\nreply = b"".join(iter(lambda: held.recv(4096), b""))\nprint(reply.decode().splitlines()[-1])',
      );
      assert.equal(inParent.stdout, 'from the host: GET /parent\n', inParent.stderr);
    });
  });
});
