/**
 * The E2B control plane (docs/e2b.md) driven by E2B's published `e2b` SDK, unmodified, pointed
 * at a real hostd by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY only: create, getInfo, list
 * (filters and pages), kill, isRunning, setTimeout and expiry, pause and connect, autoPause,
 * fork, snapshots, metrics, and hostd's errors as the SDK's error classes. What the JS SDK does
 * not send (the older endpoints the Python SDK uses, error bodies) is checked at the protocol
 * level in test/unit/routes-e2b-control.test.ts, without VMs.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { AuthenticationError, Sandbox, SandboxError, SandboxNotFoundError } from 'e2b';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { E2B_TEST_KEY, e2bRequest, pointE2bAt, withE2b } from '../../testkit/e2b.js';
import { eventually } from '../../testkit/eventually.js';
import { run } from '../../testkit/exec.js';
import { sandboxInfo } from '../../testkit/sandboxes.js';

let hostd: Hostd;

before(async () => {
  // python-slim only: E2B's `base` then means the default template (docs/e2b.md, Templates).
  // With a key, so that X-API-KEY is checked as it is on a shared host.
  hostd = await startHostd({
    env: {
      SERVICE_TEMPLATES: 'python-slim',
      SERVICE_POOL_SIZE: '2',
      SERVICE_API_KEYS: E2B_TEST_KEY,
    },
    apiKey: E2B_TEST_KEY,
    startTimeoutMs: 600_000,
  });
  pointE2bAt(hostd);
});

after(async () => {
  await hostd?.stop();
});

const running = (s: Sandbox): Promise<boolean> => s.isRunning();

describe('create, getInfo, kill', () => {
  test('a sandbox of the default template runs, says what it is, and is gone once killed', async () => {
    await withE2b(hostd, async (scope) => {
      const before = Date.now();
      const sbx = scope.track(await Sandbox.create({ metadata: { who: 'e2b-test' } }));
      assert.match(sbx.sandboxId, /^sbx_[0-9a-f]{32}$/);
      assert.equal(await sbx.isRunning(), true);
      const info = await sbx.getInfo();
      assert.equal(info.sandboxId, sbx.sandboxId);
      assert.equal(info.templateId, 'python-slim', 'base is the default template here');
      assert.deepEqual(info.metadata, { who: 'e2b-test' });
      assert.equal(info.state, 'running');
      assert.equal(info.cpuCount, 1);
      assert.equal(info.memoryMB, 512);
      assert.match(info.envdVersion, /^\d+\.\d+\.\d+$/);
      // E2B's default lifetime: 300 s from the create.
      const lifetime = info.endAt.getTime() - info.startedAt.getTime();
      assert.ok(Math.abs(lifetime - 300_000) < 5_000, `endAt - startedAt = ${lifetime} ms`);
      assert.ok(info.startedAt.getTime() >= before - 2_000);
      // The native API sees the same sandbox, with its metadata and lifetime.
      const native = await sandboxInfo(hostd, sbx.sandboxId);
      assert.deepEqual(native.metadata, { who: 'e2b-test' });
      assert.equal(native.timeout, 300);
      assert.equal(native.on_timeout, 'delete');

      assert.equal(await sbx.kill(), true);
      assert.equal(await sbx.isRunning(), false);
      assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'a second kill finds nothing');
      await assert.rejects(Sandbox.getInfo(sbx.sandboxId), { name: 'SandboxNotFoundError' });
      await assert.rejects(Sandbox.connect(sbx.sandboxId), { name: 'SandboxNotFoundError' });
    });
  });

  test('an unknown template is a SandboxError naming the known ones', async () => {
    await assert.rejects(Sandbox.create('no-such-template'), (err: Error) => {
      assert.equal(err.name, 'SandboxError');
      assert.match(err.message, /^404: .*no-such-template.*python-slim/);
      return true;
    });
  });

  test('envs reach the sandbox (seen natively: the data plane is tested apart)', async () => {
    await withE2b(hostd, async (scope) => {
      const sbx = scope.track(await Sandbox.create({ envs: { GREETING: 'hi' } }));
      const res = await run(hostd, sbx.sandboxId, 'echo "$GREETING"', { language: 'bash' });
      assert.equal(res.stdout, 'hi\n');
    });
  });
});

describe('list', () => {
  test('filters by metadata and state, pages with X-Next-Token, orders by start', async () => {
    await withE2b(hostd, async (scope) => {
      const tag = `list-${Date.now()}`;
      const a = scope.track(await Sandbox.create({ metadata: { tag, n: '1' } }));
      const b = scope.track(await Sandbox.create({ metadata: { tag, n: '2' } }));
      const c = scope.track(await Sandbox.create({ metadata: { tag, n: '3 with spaces&=' } }));
      await c.pause();

      const all = await Sandbox.list({ query: { metadata: { tag } } }).nextItems();
      assert.deepEqual(
        all.map((s) => s.sandboxId),
        [c.sandboxId, b.sandboxId, a.sandboxId],
        'newest first',
      );
      const one = await Sandbox.list({
        query: { metadata: { tag, n: '3 with spaces&=' } },
      }).nextItems();
      assert.deepEqual(
        one.map((s) => [s.sandboxId, s.state]),
        [[c.sandboxId, 'paused']],
      );
      const runningOnes = await Sandbox.list({
        query: { metadata: { tag }, state: ['running'] },
      }).nextItems();
      assert.deepEqual(
        runningOnes.map((s) => s.sandboxId).sort(),
        [a.sandboxId, b.sandboxId].sort(),
      );

      const pages = Sandbox.list({ limit: 1, order: 'asc', query: { metadata: { tag } } });
      const seen: string[] = [];
      while (pages.hasNext) {
        const page = await pages.nextItems();
        assert.equal(page.length, 1);
        seen.push(page[0]!.sandboxId);
      }
      assert.deepEqual(seen, [a.sandboxId, b.sandboxId, c.sandboxId]);
      assert.equal(pages.nextToken, undefined);

      const info = await a.getInfo();
      const later = await Sandbox.list({
        query: { metadata: { tag }, startedAfter: new Date(info.startedAt.getTime() + 1) },
      }).nextItems();
      assert.ok(!later.some((s) => s.sandboxId === a.sandboxId), 'startedAfter is a bound');
      const byTemplate = await Sandbox.list({
        query: { metadata: { tag }, template: info.templateId },
      }).nextItems();
      assert.equal(byTemplate.length, 3);
      const none = await Sandbox.list({
        query: { metadata: { tag }, template: 'unknown-template' },
      }).nextItems();
      assert.equal(none.length, 0);
    });
  });
});

describe('timeouts', () => {
  test('setTimeout shortens a lifetime: the sandbox is gone at its end', async () => {
    await withE2b(hostd, async (scope) => {
      const sbx = scope.track(await Sandbox.create());
      // First shortened from E2B's default 300 s to a minute, long enough that the getInfo
      // below still finds it on a busy host, which shows the new end...
      const lifetimeMs = 60_000;
      await sbx.setTimeout(lifetimeMs);
      const { endAt } = await sbx.getInfo();
      assert.ok(endAt.getTime() - Date.now() <= lifetimeMs);
      // ...then to a second, whose end the test waits for (not a minute of it: CI's time).
      await sbx.setTimeout(1_000);
      await eventually('the sandbox to end', async () => !(await running(sbx)), {
        timeoutMs: 60_000,
      });
      await assert.rejects(sbx.getInfo(), { name: 'SandboxNotFoundError' });
    });
  });

  test('connect extends a running lifetime but never shortens it', async () => {
    await withE2b(hostd, async (scope) => {
      const sbx = scope.track(await Sandbox.create({ timeoutMs: 300_000 }));
      const before = (await sbx.getInfo()).endAt.getTime();
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 10_000 });
      assert.equal((await sbx.getInfo()).endAt.getTime(), before, 'not shortened');
      await sbx.connect({ timeoutMs: 600_000 });
      assert.ok((await sbx.getInfo()).endAt.getTime() > before, 'extended');
    });
  });

  test('with lifecycle onTimeout pause, the end pauses it; connect resumes it', async () => {
    await withE2b(hostd, async (scope) => {
      const sbx = scope.track(
        await Sandbox.create({ timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } }),
      );
      assert.equal((await sbx.getInfo()).lifecycle?.onTimeout, 'pause');
      await eventually(
        'the sandbox to pause',
        async () => (await sbx.getInfo()).state === 'paused',
        { timeoutMs: 120_000 },
      );
      assert.equal(await sbx.isRunning(), false);
      await sbx.connect();
      assert.equal(await sbx.isRunning(), true);
    });
  });
});

describe('pause and connect', () => {
  test('a paused sandbox is not running until connect resumes it with its state', async () => {
    await withE2b(hostd, async (scope) => {
      const sbx = scope.track(await Sandbox.create());
      const id = sbx.sandboxId;
      assert.equal((await run(hostd, id, 'kept = 42')).exit, 0);
      assert.equal(await sbx.pause(), true);
      assert.equal(await sbx.isRunning(), false);
      assert.equal(await Sandbox.pause(id), false, 'pausing a paused sandbox says false');
      assert.equal((await sbx.getInfo()).state, 'paused');
      const resumed = await Sandbox.connect(id);
      assert.equal(resumed.sandboxId, id);
      assert.equal(await sbx.isRunning(), true);
      assert.equal((await run(hostd, id, 'print(kept)')).stdout, '42\n');
    });
  });
});

describe('fork', () => {
  test('count children run with the parent state and their own lifetime; the parent runs on', async () => {
    await withE2b(hostd, async (scope) => {
      const parent = scope.track(await Sandbox.create({ metadata: { role: 'parent' } }));
      assert.equal((await run(hostd, parent.sandboxId, 'x = "forked"')).exit, 0);
      const children = await parent.fork({ count: 2, timeoutMs: 120_000 });
      assert.equal(children.length, 2);
      for (const child of children) {
        assert.ok(child instanceof Sandbox, String(child));
        scope.track(child);
        assert.notEqual(child.sandboxId, parent.sandboxId);
        assert.equal(await child.isRunning(), true);
        const info = await child.getInfo();
        assert.ok(info.endAt.getTime() - Date.now() <= 120_000);
        assert.equal((await run(hostd, child.sandboxId, 'print(x)')).stdout, 'forked\n');
      }
      assert.equal(await parent.isRunning(), true);
      await assert.rejects(Sandbox.fork('sbx_' + '0'.repeat(32)), {
        name: 'SandboxNotFoundError',
      });
    });
  });
});

describe('snapshots', () => {
  test('a named snapshot is listed, creates sandboxes as a templateID, and is deleted once', async () => {
    await withE2b(hostd, async (scope) => {
      const sbx = scope.track(await Sandbox.create());
      assert.equal((await run(hostd, sbx.sandboxId, 'y = "snap"')).exit, 0);
      const name = `snap-${Date.now()}`;
      const snap = await sbx.createSnapshot({ name });
      assert.match(snap.snapshotId, /^snap_/);
      assert.ok(snap.names.some((n) => n.includes(name)));
      assert.equal(await sbx.isRunning(), true, 'the sandbox runs on');

      const byName = await Sandbox.listSnapshots({ name }).nextItems();
      assert.deepEqual(
        byName.map((s) => s.snapshotId),
        [snap.snapshotId],
      );
      assert.deepEqual(await Sandbox.listSnapshots({ name: `${name}-nope` }).nextItems(), []);
      const mine = await sbx.listSnapshots().nextItems();
      assert.ok(mine.some((s) => s.snapshotId === snap.snapshotId));

      const copy = scope.track(await Sandbox.create(snap.snapshotId));
      assert.equal((await run(hostd, copy.sandboxId, 'print(y)')).stdout, 'snap\n');
      assert.equal((await copy.getInfo()).templateId, snap.snapshotId);

      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false);
    });
  });
});

describe('metrics', () => {
  test('a running sandbox has samples within the asked window, none before it existed', async () => {
    await withE2b(hostd, async (scope) => {
      const start = new Date();
      const sbx = scope.track(await Sandbox.create());
      const metrics = await eventually(
        'a metrics sample',
        async () => {
          const m = await sbx.getMetrics({ start, end: new Date() });
          return m.length > 0 ? m : null;
        },
        { timeoutMs: 60_000, everyMs: 500 },
      );
      const m = metrics[0]!;
      assert.equal(m.cpuCount, 1);
      assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100);
      assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, `${m.memUsed} of ${m.memTotal}`);
      assert.equal(m.memTotal, 512 * 1024 * 1024);
      assert.ok(m.diskTotal > 0 && m.diskUsed >= 0);
      assert.ok(m.timestamp.getTime() >= start.getTime() - 10_000);
      const before = await sbx.getMetrics({
        start: new Date(start.getTime() - 3_600_000),
        end: new Date(start.getTime() - 1_800_000),
      });
      assert.deepEqual(before, []);
    });
  });
});

describe('errors reach the SDK as its error classes', () => {
  const unknown = 'sbx_' + '0'.repeat(32);

  test('a wrong or missing API key is an AuthenticationError', async () => {
    const wrong = `e2b_${'f'.repeat(40)}`;
    await assert.rejects(Sandbox.create({ apiKey: wrong }), AuthenticationError);
    await assert.rejects(Sandbox.list({ apiKey: wrong }).nextItems(), AuthenticationError);
    await assert.rejects(Sandbox.kill(unknown, { apiKey: wrong }), AuthenticationError);
    const bare = await e2bRequest(hostd, 'GET', '/v2/sandboxes', { apiKey: null });
    assert.equal(bare.status, 401);
    assert.deepEqual(bare.json, {
      code: 401,
      message: 'missing X-API-KEY header',
      error_code: 'missing_api_key',
    });
  });

  test('an unknown sandbox is SandboxNotFoundError wherever the SDK says so', async () => {
    await assert.rejects(Sandbox.getInfo(unknown), SandboxNotFoundError);
    await assert.rejects(Sandbox.setTimeout(unknown, 10_000), SandboxNotFoundError);
    await assert.rejects(Sandbox.pause(unknown), SandboxNotFoundError);
    await assert.rejects(Sandbox.getMetrics(unknown), SandboxNotFoundError);
    await assert.rejects(Sandbox.createSnapshot(unknown), SandboxNotFoundError);
    assert.equal(await Sandbox.deleteSnapshot('snap_' + '0'.repeat(32)), false);
  });

  test('bad values and what hostd does not offer are SandboxErrors with the status', async () => {
    await assert.rejects(Sandbox.create({ timeoutMs: 31 * 24 * 3600 * 1000 }), (err: Error) => {
      assert.ok(err instanceof SandboxError && !(err instanceof SandboxNotFoundError));
      assert.match(err.message, /^400: .*timeout/);
      return true;
    });
    await assert.rejects(Sandbox.create({ network: { denyOut: ['10.1.2.3'] } }), (err: Error) => {
      assert.ok(err instanceof SandboxError);
      assert.match(err.message, /^501: network\.denyOut .* is not supported by hostd/);
      return true;
    });
    await withE2b(hostd, async (scope) => {
      const sbx = scope.track(await Sandbox.create());
      await assert.rejects(sbx.updateNetwork({ allowOut: ['1.1.1.1'] }), (err: Error) => {
        assert.ok(err instanceof SandboxError);
        assert.match(err.message, /^501: updateNetwork is not supported by hostd/);
        return true;
      });
    });
  });
});
