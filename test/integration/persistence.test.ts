/**
 * State that lasts (docs/api.md, Snapshots, Pause and resume, Restarts and crashes), with real
 * VMs: snapshots restore the whole state any number of times, a paused sandbox comes back with
 * its REPL state and open files, and a SIGTERM restart of hostd loses no sandbox.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startHostd, type ErrorBody, type Hostd } from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { createSandbox, withSandbox, withSandboxes } from '../../testkit/sandboxes.js';
import { metric } from '../../testkit/metrics.js';
import { mkdtemp, rm } from 'node:fs/promises';

interface SnapshotBody {
  snapshot_id: string;
  source_sandbox_id: string;
  template: string;
  size_bytes: number;
  sandboxes: number;
}

const out = async (h: Hostd, id: string, code: string): Promise<string> => {
  const r = await run(h, id, code);
  assert.equal(r.exit, 0, `exit ${r.exit}: ${r.stderr}`);
  return r.stdout.trim();
};

describe('snapshots and pause', () => {
  let hostd: Hostd;
  before(async () => {
    hostd = await startHostd({ env: { SERVICE_POOL_SIZE: '1' } });
  });
  after(async () => {
    await hostd.stop();
  });

  test('a snapshot restores variables and files, any number of times; the source runs on', async () => {
    await withSandbox(hostd, async (id) => {
      await out(hostd, id, 'x = 41\nopen("/root/note.txt", "w").write("kept")');
      const snap = await hostd.json<SnapshotBody>('POST', `/v1/sandboxes/${id}/snapshot`);
      assert.equal(snap.status, 200);
      assert.match(snap.body.snapshot_id, /^snap_[0-9a-f]{32}$/);
      assert.equal(snap.body.source_sandbox_id, id);
      assert.ok(snap.body.size_bytes > 0);
      await out(hostd, id, 'x = 0\nopen("/root/note.txt", "w").write("changed")');
      const copies: string[] = [];
      try {
        for (let i = 0; i < 2; i++) {
          copies.push(await createSandbox(hostd, { snapshot: snap.body.snapshot_id }));
          const copy = copies.at(-1)!;
          assert.equal(
            await out(hostd, copy, 'print(x + 1, open("/root/note.txt").read())'),
            '42 kept',
          );
        }
        assert.equal(await out(hostd, id, 'print(x)'), '0');
        const listed = await hostd.json<{ snapshots: SnapshotBody[] }>('GET', '/v1/snapshots');
        assert.ok(listed.body.snapshots.some((s) => s.snapshot_id === snap.body.snapshot_id));
        const one = await hostd.json<SnapshotBody>('GET', `/v1/snapshots/${snap.body.snapshot_id}`);
        assert.equal(one.body.sandboxes, 2);
        // Deleting the snapshot leaves its sandboxes running.
        const del = await hostd.request('DELETE', `/v1/snapshots/${snap.body.snapshot_id}`);
        assert.equal(del.status, 204);
        assert.equal(await out(hostd, copies[0]!, 'print(x)'), '41');
        const gone = await hostd.json<ErrorBody>('POST', '/v1/sandboxes', {
          snapshot: snap.body.snapshot_id,
        });
        assert.equal(gone.status, 404);
        assert.equal(gone.body.code, 'snapshot_not_found');
      } finally {
        for (const c of copies) await hostd.request('DELETE', `/v1/sandboxes/${c}`);
      }
    });
  });

  test('pause frees the VM; any exec resumes it with its variables and open file handles', async () => {
    await withSandbox(hostd, async (id) => {
      await out(hostd, id, 'f = open("/root/log.txt", "w")\nf.write("a")\nstate = {"n": 1}');
      const running = await hostd.json<{ memory_mib: number | null }>('GET', `/v1/sandboxes/${id}`);
      assert.ok(
        running.body.memory_mib !== null && running.body.memory_mib > 0,
        `a running sandbox has memory of its own: ${running.body.memory_mib}`,
      );
      const paused = await hostd.json<{ id: string; state: string }>(
        'POST',
        `/v1/sandboxes/${id}/pause`,
      );
      assert.deepEqual(paused.body, { id, state: 'paused' });
      const info = await hostd.json<{ state: string; memory_mib: number | null }>(
        'GET',
        `/v1/sandboxes/${id}`,
      );
      assert.equal(info.body.state, 'paused');
      assert.equal(info.body.memory_mib, null, 'a paused sandbox costs no memory');
      assert.equal(
        await out(
          hostd,
          id,
          'f.write("b"); f.close(); print(state["n"], open("/root/log.txt").read())',
        ),
        '1 ab',
      );
      const again = await hostd.json<{ state: string }>('GET', `/v1/sandboxes/${id}`);
      assert.equal(again.body.state, 'ready');
    });
  });

  test('sandboxes get their own random generators; a pause keeps what the user seeded', async () => {
    // Every sandbox of a template is a copy of one frozen VM, numpy's global generator included
    await withSandboxes(hostd, async ({ create }) => {
      const ids = [await create(), await create()];
      const draws = await Promise.all(
        ids.map((id) =>
          out(hostd, id, 'import random, numpy as np\nprint(np.random.rand(), random.random())'),
        ),
      );
      const [a, b] = draws.map((d) => d.split(' '));
      assert.notEqual(a![0], b![0], "numpy's global generator");
      assert.notEqual(a![1], b![1], 'random');
      const id = ids[0]!;
      await out(hostd, id, 'random.seed(7)\nnp.random.seed(7)');
      await out(hostd, id, 'want = (random.Random(7).random(), np.random.RandomState(7).rand())');
      const paused = await hostd.json('POST', `/v1/sandboxes/${id}/pause`);
      assert.equal(paused.status, 200);
      assert.equal(
        await out(hostd, id, 'print((random.random(), np.random.rand()) == want)'),
        'True',
      );
    });
  });

  test('a pause saves neither the cache of written files nor freed memory; both come back whole', async () => {
    await withSandbox(hostd, async (id) => {
      const MIB = 1 << 20;
      // 48 MiB written to a file (on the sandbox's disk, written back as the kernel does in
      // time, and in the guest's page cache), and a 48 MiB buffer filled and freed: before, a
      // pause saved both with the guest's RAM.
      await out(
        hostd,
        id,
        [
          'import hashlib, os',
          'data = os.urandom(48 << 20)',
          'with open("/root/big.bin", "wb") as f:\n    f.write(data)',
          'os.sync()',
          'digest = hashlib.sha256(data).hexdigest()',
          'del data',
        ].join('\n'),
      );
      const before = (await metric(hostd, 'hostd_storage_bytes')) ?? 0;
      await hostd.request('POST', `/v1/sandboxes/${id}/pause`);
      const paused = ((await metric(hostd, 'hostd_storage_bytes')) ?? 0) - before;
      // The file's 48 MiB on its disk and the few pages the sandbox changed, no more (was 150)
      assert.ok(paused < 80 * MIB, `the paused sandbox takes ${paused / MIB} MiB`);
      assert.equal(
        await out(
          hostd,
          id,
          'print(hashlib.sha256(open("/root/big.bin", "rb").read()).hexdigest() == digest)',
        ),
        'True',
      );
    });
  });

  test('a sandbox from a snapshot pauses whole: memory it freed comes back zero', async () => {
    await withSandbox(hostd, async (id) => {
      // 32 MiB of random bytes alive in the snapshot: data in its image, not holes
      await out(hostd, id, 'import mmap, os\ndata = os.urandom(32 << 20)\nkept = len(data)');
      const snap = await hostd.json<SnapshotBody>('POST', `/v1/sandboxes/${id}/snapshot`);
      assert.equal(snap.status, 200);
      let copy: string | null = null;
      try {
        copy = await createSandbox(hostd, { snapshot: snap.body.snapshot_id });
        // Freed, so zero (init_on_free) where the snapshot's image holds data: a pause that
        // took those pages from the image would hand the next allocation its old bytes.
        await out(hostd, copy, 'del data');
        const paused = await hostd.request('POST', `/v1/sandboxes/${copy}/pause`);
        assert.equal(paused.status, 200);
        const fresh = [
          'm = mmap.mmap(-1, 64 << 20)',
          'for i in range(0, len(m), 4096):\n    m[i] = 1',
          'print(kept, m[:].count(0) == len(m) - len(m) // 4096)',
        ].join('\n');
        assert.equal(await out(hostd, copy, fresh), `${32 << 20} True`);
      } finally {
        if (copy) await hostd.request('DELETE', `/v1/sandboxes/${copy}`);
        await hostd.request('DELETE', `/v1/snapshots/${snap.body.snapshot_id}`);
      }
    });
  });

  test('resume is explicit too, and a no-op on a running sandbox; forks of a paused one work', async () => {
    await withSandbox(hostd, async (id) => {
      await out(hostd, id, 'v = "kept"');
      await hostd.request('POST', `/v1/sandboxes/${id}/pause`);
      const resumed = await hostd.json<{ state: string }>('POST', `/v1/sandboxes/${id}/resume`);
      assert.equal(resumed.body.state, 'ready');
      const noop = await hostd.json<{ state: string }>('POST', `/v1/sandboxes/${id}/resume`);
      assert.equal(noop.body.state, 'ready');
      await hostd.request('POST', `/v1/sandboxes/${id}/pause`);
      const fork = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${id}/fork`,
        { n: 1 },
      );
      assert.equal(fork.status, 200);
      const child = fork.body.children[0]!.id;
      try {
        assert.equal(await out(hostd, child, 'print(v)'), 'kept');
      } finally {
        await hostd.request('DELETE', `/v1/sandboxes/${child}`);
      }
    });
  });
});

test('a SIGTERM restart loses no sandbox: each comes back paused and resumes with its state', async () => {
  // Shared by both hostds, so neither removes it when it stops.
  const dataDir = await mkdtemp('/var/tmp/hostd-test-data-');
  const first = await startHostd({ env: { SERVICE_POOL_SIZE: '0' }, dataDir });
  const ids: string[] = [];
  let second: Hostd | undefined;
  try {
    for (let i = 0; i < 8; i++) {
      const id = await createSandbox(first);
      ids.push(id);
      await out(first, id, `me = ${i}\nopen("/root/me.txt", "w").write(str(me * 10))`);
    }
    const snap = await first.json<SnapshotBody>('POST', `/v1/sandboxes/${ids[0]}/snapshot`);
    assert.equal(await first.stop('SIGTERM'), 0);
    second = await startHostd({ env: { SERVICE_POOL_SIZE: '0' }, dataDir });
    const listed = await second.json<{ sandboxes: { id: string; state: string }[] }>(
      'GET',
      '/v1/sandboxes',
    );
    assert.deepEqual(
      listed.body.sandboxes.map((s) => [s.id, s.state]).sort(),
      ids.map((id) => [id, 'paused']).sort(),
    );
    for (const [i, id] of ids.entries()) {
      assert.equal(
        await out(second, id, 'print(me, open("/root/me.txt").read())'),
        `${i} ${i * 10}`,
      );
    }
    const copy = await createSandbox(second, { snapshot: snap.body.snapshot_id });
    assert.equal(await out(second, copy, 'print(me)'), '0');
  } finally {
    await second?.stop();
    await rm(dataDir, { recursive: true, force: true });
  }
});
