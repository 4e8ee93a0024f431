/**
 * A sandbox's files live on a disk of its own, on the host's disk (docs/architecture.md,
 * Writable disks): they survive pause, snapshots and restarts of hostd, forks inherit them
 * copy-on-write with writes isolated both ways, merge hands the winner's to the parent, a file
 * far larger than guest RAM fits, and deleting a sandbox deletes its disk. Real VMs.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { eventually } from '../../testkit/eventually.js';
import { run } from '../../testkit/exec.js';
import { createSandbox, withSandboxes } from '../../testkit/sandboxes.js';

const out = async (h: Hostd, id: string, code: string, language = 'python'): Promise<string> => {
  const r = await run(h, id, code, { language });
  assert.equal(r.exit, 0, `exit ${r.exit}: ${r.stderr}`);
  return r.stdout.trim();
};

/** Writes `mib` MiB of random bytes to `path` in the guest, flushed; prints their sha256. */
const writeRandom = (path: string, mib: number): string =>
  `import hashlib, os\n` +
  `data = os.urandom(${mib} * 1024 * 1024)\n` +
  `with open(${JSON.stringify(path)}, "wb") as f:\n    f.write(data)\n` +
  `os.sync()\nprint(hashlib.sha256(data).hexdigest())`;
const sha = (path: string): string =>
  `import hashlib\nprint(hashlib.sha256(open(${JSON.stringify(path)}, "rb").read()).hexdigest())`;
const exists = (path: string): string =>
  `import os\nprint(os.path.exists(${JSON.stringify(path)}))`;
const memAvailableKib = `print(next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemAvailable:")))`;

/** Allocated bytes of each file in the data directory's disks/ folder. */
async function diskFiles(h: Hostd): Promise<Map<string, number>> {
  const dir = join(h.dataDir, 'disks');
  const files = new Map<string, number>();
  for (const name of await readdir(dir)) {
    const st = await stat(join(dir, name)).catch(() => null);
    if (st) files.set(name, st.blocks * 512);
  }
  return files;
}

describe('a sandbox disk', () => {
  let hostd: Hostd;
  before(async () => {
    hostd = await startHostd({ env: { SERVICE_POOL_SIZE: '1' } });
  });
  after(async () => {
    await hostd.stop();
  });

  test('files survive pause and resume', async () => {
    await withSandboxes(hostd, async ({ create }) => {
      const id = await create();
      const sum = await out(hostd, id, writeRandom('/root/data.bin', 8));
      assert.equal((await hostd.request('POST', `/v1/sandboxes/${id}/pause`)).status, 200);
      assert.equal(await out(hostd, id, sha('/root/data.bin')), sum);
    });
  });

  test('a snapshot keeps the files of its instant; copies and the source diverge', async () => {
    await withSandboxes(hostd, async ({ create, track }) => {
      const id = await create();
      await out(hostd, id, 'open("/tmp/v.txt", "w").write("one")');
      const snap = await hostd.json<{ snapshot_id: string }>(
        'POST',
        `/v1/sandboxes/${id}/snapshot`,
      );
      assert.equal(snap.status, 200);
      await out(hostd, id, 'open("/tmp/v.txt", "w").write("two")');
      const copy = track(await createSandbox(hostd, { snapshot: snap.body.snapshot_id }));
      assert.equal(await out(hostd, copy, 'print(open("/tmp/v.txt").read())'), 'one');
      await out(hostd, copy, 'open("/tmp/v.txt", "w").write("three")');
      assert.equal(await out(hostd, id, 'print(open("/tmp/v.txt").read())'), 'two');
      await hostd.request('DELETE', `/v1/snapshots/${snap.body.snapshot_id}`);
    });
  });

  test('forks inherit the files; writes are isolated both ways; merge gives the winner its files', async () => {
    await withSandboxes(hostd, async ({ create, track }) => {
      const parent = await create();
      const sum = await out(hostd, parent, writeRandom('/root/shared.bin', 4));
      const res = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${parent}/fork`,
        { n: 2 },
      );
      assert.equal(res.status, 200);
      const [a, b] = track(res.body.children.map((c) => c.id)) as [string, string];
      for (const c of [a, b]) assert.equal(await out(hostd, c, sha('/root/shared.bin')), sum);
      await out(hostd, a, 'open("/root/a.txt", "w").write("a")\nopen("/root/shared.bin", "wb")');
      await out(hostd, parent, 'open("/root/p.txt", "w").write("p")');
      assert.equal(await out(hostd, b, exists('/root/a.txt')), 'False');
      assert.equal(await out(hostd, b, exists('/root/p.txt')), 'False');
      assert.equal(await out(hostd, b, sha('/root/shared.bin')), sum);
      assert.equal(await out(hostd, parent, exists('/root/a.txt')), 'False');
      assert.equal(await out(hostd, parent, sha('/root/shared.bin')), sum);
      assert.equal(await out(hostd, a, exists('/root/p.txt')), 'False');

      const merged = await hostd.request('POST', `/v1/sandboxes/${parent}/merge_into/${a}`);
      assert.equal(merged.status, 200);
      assert.equal(await out(hostd, parent, 'print(open("/root/a.txt").read())'), 'a');
      assert.equal(await out(hostd, parent, exists('/root/p.txt')), 'False');
      assert.equal(
        await out(hostd, parent, 'import os\nprint(os.path.getsize("/root/shared.bin"))'),
        '0',
      );
      assert.equal(await out(hostd, b, exists('/root/a.txt')), 'False');
    });
  });

  test('a sandbox forked again and again keeps every file; its disk chain stays short', async () => {
    await withSandboxes(hostd, async ({ create, track }) => {
      const id = await create();
      let last = '';
      for (let i = 0; i < 10; i++) {
        await out(hostd, id, `open("/root/gen${i}.txt", "w").write("${i}")`);
        const res = await hostd.json<{ children: { id: string }[] }>(
          'POST',
          `/v1/sandboxes/${id}/fork`,
          { n: 1 },
        );
        assert.equal(res.status, 200);
        if (last) await hostd.request('DELETE', `/v1/sandboxes/${last}`);
        last = track(res.body.children[0]!.id);
      }
      const read = 'print("".join(open(f"/root/gen{i}.txt").read() for i in range(10)))';
      assert.equal(await out(hostd, last, read), '0123456789');
      assert.equal(await out(hostd, id, read), '0123456789');
      // Two sandboxes, each on a chain of at most 8 frozen layers (a merged one among them).
      // The layers of the deleted forks, and of the tests before, are removed in the background
      // once their last holder goes.
      const layers = async (): Promise<string[]> =>
        [...(await diskFiles(hostd)).keys()].filter((n) => /^layer-.*\.qcow2$/.test(n));
      await eventually('at most 9 layers on disk', async () => (await layers()).length <= 9);
    });
  });

  test('a 4 GiB file fits, on the host disk, leaving guest RAM as it was', async () => {
    await withSandboxes(hostd, async ({ create }) => {
      const id = await create();
      const before = Number(await out(hostd, id, memAvailableKib));
      const disksBefore = [...(await diskFiles(hostd)).values()].reduce((x, y) => x + y, 0);
      // fallocate reserves the whole 4 GiB in the guest's filesystem; dd writes real data at its end.
      await out(
        hostd,
        id,
        'fallocate -l 4G /root/big && dd if=/dev/urandom of=/root/big bs=1M count=64 seek=4032 conv=notrunc status=none && sync && stat -c %s /root/big',
        'bash',
      ).then((size) => assert.equal(Number(size), 4 * 1024 ** 3));
      const afterKib = Number(await out(hostd, id, memAvailableKib));
      assert.ok(
        before - afterKib < 64 * 1024,
        `MemAvailable fell from ${before} KiB to ${afterKib} KiB`,
      );
      const disksAfter = [...(await diskFiles(hostd)).values()].reduce((x, y) => x + y, 0);
      assert.ok(
        disksAfter - disksBefore >= 64 * 1024 * 1024,
        `the data directory's disks grew by ${disksAfter - disksBefore} bytes only`,
      );
    });
  });

  test('deleting a sandbox deletes its disk', async () => {
    const id = await createSandbox(hostd);
    const before = await diskFiles(hostd);
    await out(hostd, id, writeRandom('/root/mine.bin', 32));
    const grown = [...(await diskFiles(hostd)).entries()].filter(
      ([name, bytes]) => bytes - (before.get(name) ?? 0) >= 32 * 1024 * 1024,
    );
    assert.equal(grown.length, 1, 'one overlay holds what the sandbox wrote');
    const [overlay] = grown[0]!;
    assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    await eventually(
      'the overlay to be deleted',
      async () => !(await diskFiles(hostd)).has(overlay),
    );
  });
});

test('files and forks survive a SIGTERM restart and a SIGKILL re-adoption of hostd', async () => {
  // Shared by the hostds, so none removes it when it stops.
  const dataDir = await mkdtemp('/var/tmp/hostd-test-data-');
  // The same runtime directory too: a hostd re-adopts the VMs named there.
  const stateDir = await mkdtemp('/dev/shm/hostd-test-');
  const env = { SERVICE_POOL_SIZE: '0' };
  let h = await startHostd({ env, dataDir, stateDir });
  try {
    const parent = await createSandbox(h);
    const sum = await out(h, parent, writeRandom('/root/kept.bin', 4));
    const res = await h.json<{ children: { id: string }[] }>(
      'POST',
      `/v1/sandboxes/${parent}/fork`,
      { n: 1 },
    );
    const child = res.body.children[0]!.id;
    await out(h, child, 'open("/root/child.txt", "w").write("c")');
    assert.equal(await h.stop('SIGTERM'), 0);

    h = await startHostd({ env, dataDir, stateDir });
    assert.equal(await out(h, parent, sha('/root/kept.bin')), sum);
    assert.equal(await out(h, child, 'print(open("/root/child.txt").read())'), 'c');
    assert.equal(await out(h, parent, exists('/root/child.txt')), 'False');
    await h.stop('SIGKILL');

    h = await startHostd({ env, dataDir, stateDir });
    assert.equal(await out(h, child, sha('/root/kept.bin')), sum);
    // The adopted VM captures again: a fork of it sees its files.
    const again = await h.json<{ children: { id: string }[] }>(
      'POST',
      `/v1/sandboxes/${child}/fork`,
      { n: 1 },
    );
    assert.equal(again.status, 200);
    const grandchild = again.body.children[0]!.id;
    assert.equal(await out(h, grandchild, 'print(open("/root/child.txt").read())'), 'c');
  } finally {
    await h.stop();
    await rm(dataDir, { recursive: true, force: true });
    await rm(stateDir, { recursive: true, force: true });
  }
});
