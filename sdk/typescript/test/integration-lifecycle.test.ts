/**
 * The API beyond exec, fork and merge against the real hostd (SERVICE_HOSTD_URL): templates,
 * a sandbox's env and an exec's env and cwd, rich outputs, snapshots, pause and resume, and an
 * egress rule. Skipped without SERVICE_HOSTD_URL; each test skips itself while the server lacks
 * its feature (a route answering route_not_found, or a field it rejects as unknown).
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, describe, test, type TestContext } from 'node:test';
import {
  Sandbox,
  Snapshot,
  SnapshotNotFoundError,
  Template,
  TemplateNotFoundError,
  isHostdError,
} from '../src/index.js';
import { lacks, type Feature } from './helpers/features.js';
import { LIVE_TIMEOUT_MS, skipLive } from './helpers/live.js';

describe(
  'lifecycle against a real hostd',
  { skip: skipLive, timeout: 10 * LIVE_TIMEOUT_MS },
  () => {
    const made = new Set<Sandbox>();
    const snapshots = new Set<Snapshot>();
    after(async () => {
      for (const s of made) {
        await s.delete().catch((e: unknown) => {
          if (!isHostdError(e, 'not_found')) throw e;
        });
      }
      for (const s of snapshots) {
        await s.delete().catch((e: unknown) => {
          if (!isHostdError(e, 'not_found')) throw e;
        });
      }
    });

    async function create(opts: Parameters<typeof Sandbox.create>[0] = {}): Promise<Sandbox> {
      const s = await Sandbox.create(opts);
      made.add(s);
      return s;
    }

    /** True when the server has every feature; otherwise skips `t` saying which it lacks. */
    async function has(t: TestContext, ...features: Feature[]): Promise<boolean> {
      for (const feature of features) {
        const lacking = await lacks(feature);
        if (lacking) {
          t.skip(lacking);
          return false;
        }
      }
      return true;
    }

    test(
      'templates: a default, get by name, unknown names',
      { timeout: LIVE_TIMEOUT_MS },
      async (t) => {
        if (!(await has(t, 'templates'))) return;
        const list = await Template.list();
        assert.ok(list.length >= 1);
        const first = list[0]!;
        assert.equal(first.default, true);
        assert.deepEqual(await Template.get(first.name), first);
        await assert.rejects(Template.get('hostd-sdk-no-such-template'), TemplateNotFoundError);
        await assert.rejects(
          Sandbox.create({ template: 'hostd-sdk-no-such-template' }),
          TemplateNotFoundError,
        );
      },
    );

    test(
      'a sandbox’s env, and an exec’s own env and cwd',
      { timeout: LIVE_TIMEOUT_MS },
      async (t) => {
        if (!(await has(t, 'create-options', 'exec-options'))) return;
        const s = await create({ env: { GREETING: 'hi', SHARED: 'sandbox' } });
        assert.equal((await s.run('import os; print(os.environ["GREETING"])')).stdout, 'hi\n');
        assert.equal((await s.run('echo "$GREETING"', { language: 'bash' })).stdout, 'hi\n');
        const once = await s.run('import os; print(os.environ["SHARED"], os.getcwd())', {
          env: { SHARED: 'exec' },
          cwd: '/tmp',
        });
        assert.equal(once.stdout, 'exec /tmp\n');
        const after = await s.run('import os; print(os.environ["SHARED"], os.getcwd())');
        assert.equal(after.stdout, 'sandbox /root\n', 'an exec’s env and cwd last one exec');
      },
    );

    test(
      'rich outputs come as displays with display: true',
      { timeout: LIVE_TIMEOUT_MS },
      async (t) => {
        if (!(await has(t, 'exec-options'))) return;
        const s = await create();
        const code = `class Bold:
    def _repr_html_(self): return "<b>bold</b>"
    def __repr__(self): return "Bold()"
display(Bold())
Bold()`;
        const rich = await s.run(code, { display: true });
        assert.equal(rich.exitCode, 0, rich.stderr);
        assert.deepEqual(
          rich.displays.map((d) => [d.html, d.text]),
          [
            ['<b>bold</b>', 'Bold()'],
            ['<b>bold</b>', 'Bold()'],
          ],
        );
        const plain = await s.run('Bold()');
        assert.deepEqual([plain.stdout, plain.displays], ['Bold()\n', []]);
      },
    );

    test(
      'a snapshot makes sandboxes in its state, until it is deleted',
      { timeout: LIVE_TIMEOUT_MS },
      async (t) => {
        if (!(await has(t, 'snapshots'))) return;
        const s = await create();
        await s.run('kept = 41');
        const snap = await s.snapshot();
        snapshots.add(snap);
        assert.match(snap.id, /^snap_/);
        assert.equal(snap.info.source_sandbox_id, s.id);
        await s.run('kept = 0');
        const copy = await create({ snapshot: snap });
        assert.equal((await copy.run('print(kept + 1)')).stdout, '42\n');
        assert.equal((await copy.info()).snapshot_id, snap.id);
        assert.ok((await Snapshot.list()).some((x) => x.id === snap.id));
        assert.equal((await Snapshot.get(snap.id)).id, snap.id);
        await snap.delete();
        await assert.rejects(Snapshot.get(snap.id), SnapshotNotFoundError);
        await assert.rejects(Sandbox.create({ snapshot: snap.id }), SnapshotNotFoundError);
        assert.equal((await copy.run('print(kept)')).stdout, '41\n', 'its sandboxes keep running');
      },
    );

    test(
      'pause and resume keep the state; a paused sandbox resumes on use',
      { timeout: LIVE_TIMEOUT_MS },
      async (t) => {
        if (!(await has(t, 'pause'))) return;
        const s = await create();
        await s.run('kept = "yes"');
        await s.pause();
        assert.equal((await s.info()).state, 'paused');
        await s.pause();
        await s.resume();
        assert.equal((await s.info()).state, 'ready');
        assert.equal((await s.run('print(kept)')).stdout, 'yes\n');
        await s.pause();
        assert.equal((await s.run('print(kept)')).stdout, 'yes\n');
      },
    );

    test(
      'allowOut host.hostd.internal:PORT reaches a server on this host',
      { timeout: LIVE_TIMEOUT_MS },
      async (t) => {
        if (!(await has(t, 'create-options'))) return;
        const server = createServer((_req, res) => res.end('from the host'));
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
        try {
          const { port } = server.address() as AddressInfo;
          const fetch = `import urllib.request\nprint(urllib.request.urlopen("http://host.hostd.internal:${port}/", timeout=10).read().decode())`;
          const open = await create({ network: { allowOut: [`host.hostd.internal:${port}`] } });
          const r = await open.run(fetch);
          assert.deepEqual([r.exitCode, r.stdout], [0, 'from the host\n'], r.stderr);
          const closed = await create();
          assert.notEqual((await closed.run(fetch)).exitCode, 0, 'no network without a rule');
        } finally {
          server.close();
        }
      },
    );
  },
);
