/**
 * Fork and merge: copy-on-write children of a running sandbox, and adopting the winner.
 * Real hostd, real VMs; one hostd for the whole file.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdir } from 'node:fs/promises';
import {
  nothingLeft,
  processGone,
  qemuProcesses,
  sandboxQemuPid,
  startHostd,
  type Hostd,
  type ErrorBody,
} from '../../testkit/hostd.js';
import { eventually } from '../../testkit/eventually.js';
import { holdSandbox, run } from '../../testkit/exec.js';
import { forkStandbySettled } from '../../testkit/metrics.js';
import {
  untilSandbox,
  withSandboxes,
  type SandboxInfo,
  type SandboxScope,
} from '../../testkit/sandboxes.js';

let hostd: Hostd;
before(async () => {
  hostd = await startHostd({ env: { SERVICE_MAX_SANDBOXES: '48' } });
});
after(async () => {
  await hostd.stop();
  assert.deepEqual(await nothingLeft(hostd.stateDir), { qemu: 0, dirExists: false });
});

async function fork(id: string, n: number): Promise<string[]> {
  const res = await hostd.json<{ parent_id: string; children: { id: string; state: string }[] }>(
    'POST',
    `/v1/sandboxes/${id}/fork`,
    { n },
  );
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.equal(res.body.parent_id, id);
  assert.equal(res.body.children.length, n);
  for (const c of res.body.children) {
    assert.match(c.id, /^sbx_[0-9a-f]{32}$/);
    assert.equal(c.state, 'ready');
  }
  return res.body.children.map((c) => c.id);
}

const out = async (id: string, code: string, language = 'python'): Promise<string> => {
  const r = await run(hostd, id, code, { language });
  assert.equal(r.exit, 0, `exit ${r.exit}: ${r.stderr}`);
  return r.stdout.trim();
};

/**
 * A test around one fresh parent sandbox: `track` adopts the ids it forks. On failure every
 * sandbox is reported (id and VM log tail); all are deleted at the end.
 */
const scenario = (
  fn: (parent: string, track: SandboxScope['track']) => Promise<void>,
): Promise<void> => withSandboxes(hostd, async ({ create, track }) => fn(await create(), track));

/** Fork images of this hostd: one per fork while any of its children lives. */
/** Memory images of fork points: they live in the data directory (one `.mem` per fork). */
const forkImages = async (): Promise<string[]> =>
  (await readdir(`${hostd.dataDir}/images`)).filter(
    (f) => f.startsWith('fork-') && f.endsWith('.mem'),
  );

describe('fork', () => {
  test('children inherit variables, imports, open handles, files, cwd and background processes', async () => {
    await scenario(async (parent, track) => {
      await out(
        parent,
        [
          'import os, json, subprocess',
          'counter = 41',
          'f = open("/root/log.txt", "w"); f.write("parent;"); f.flush()',
          'os.makedirs("/root/work", exist_ok=True); os.chdir("/root/work")',
          'bg = subprocess.Popen(["sleep", "600"])',
        ].join('\n'),
      );
      const [child] = track(await fork(parent, 1));
      assert.equal(await out(child!, 'counter + 1'), '42');
      assert.equal(await out(child!, 'json.dumps([1])'), "'[1]'");
      await out(child!, 'f.write("child;"); f.flush()');
      assert.equal(await out(child!, 'open("/root/log.txt").read()'), "'parent;child;'");
      assert.equal(await out(child!, 'os.getcwd()'), "'/root/work'");
      assert.equal(
        await out(child!, 'bg.poll() is None and os.path.exists(f"/proc/{bg.pid}")'),
        'True',
      );
    });
  });

  test('changes are isolated: child from parent, parent from child, sibling from sibling', async () => {
    await scenario(async (parent, track) => {
      await out(parent, 'shared = "base"\nopen("/root/f", "w").write("base")');
      const [a, b] = track(await fork(parent, 2));
      await out(a!, 'shared = "a"\nopen("/root/f", "w").write("a")');
      await out(b!, 'shared = "b"\nopen("/root/f", "w").write("b")');
      await out(parent, 'shared = "p"\nopen("/root/f", "w").write("p")');
      for (const [id, want] of [
        [a!, 'a'],
        [b!, 'b'],
        [parent, 'p'],
      ] as const) {
        assert.equal(await out(id, 'print(shared, open("/root/f").read())'), `${want} ${want}`);
      }
    });
  });

  test("children get the host's clock, distinct os.urandom and reseeded generators; the parent keeps its", async () => {
    await scenario(async (parent, track) => {
      // Set the parent's clock back to 2001: children that merely kept the parent's clock
      // would be 25 years off; children set from the host's clock are not.
      await out(parent, 'import os, random, time\nimport numpy as np\nrandom.seed(1234)');
      await out(parent, 'np.random.seed(1234)\nnext_np = np.random.RandomState(1234).rand()');
      await out(parent, 'next_py = random.Random(1234).random()');
      await out(parent, 'time.clock_settime(time.CLOCK_REALTIME, 978307200)');
      assert.ok(Number(await out(parent, 'time.time()')) < 1e9, "the parent's clock went back");
      const forkedAt = Date.now();
      const kids = track(await fork(parent, 3));
      const seen = await Promise.all(
        kids.map((k) =>
          out(k, 'print(os.urandom(16).hex(), random.random(), time.time(), np.random.rand())'),
        ),
      );
      const answeredAt = Date.now();
      const column = (i: number): Set<string> => new Set(seen.map((s) => s.split(' ')[i]!));
      assert.equal(column(0).size, 3, 'os.urandom differs between siblings');
      assert.equal(column(1).size, 3, 'random is reseeded per child');
      assert.equal(column(3).size, 3, "numpy's global generator is reseeded per child");
      // The parent goes on: what it seeded still holds
      assert.equal(
        await out(parent, 'print(random.random() == next_py, np.random.rand() == next_np)'),
        'True True',
      );
      // A child reads its clock after it was set from the host's, so between the fork request
      // and the answers; the margin is for the time the host's clock takes to reach the guest.
      const marginMs = 60_000;
      for (const s of seen) {
        const t = Number(s.split(' ')[2]) * 1000;
        assert.ok(
          t >= forkedAt - marginMs && t <= answeredAt + marginMs,
          `guest clock ${new Date(t).toISOString()}, host ${new Date(answeredAt).toISOString()}`,
        );
      }
    });
  });

  test('forks of forks work to any depth; deleting a parent never harms its children', async () => {
    await scenario(async (root, track) => {
      await out(root, 'depth = 0');
      let current = root;
      for (let d = 1; d <= 3; d++) {
        const [next] = track(await fork(current, 1));
        await out(next!, `depth = ${d}`);
        current = next!;
      }
      assert.equal(await out(current, 'depth'), '3');
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${root}`)).status, 204);
      assert.equal(await out(current, 'depth + 1'), '4');
    });
  });

  test('fork waits its turn behind a running exec, and the parent keeps working after', async () => {
    await scenario(async (parent, track) => {
      await out(parent, 'steps = []');
      const hold = await holdSandbox(hostd, parent, {
        before: 'steps.append("exec-start")',
        after: 'steps.append("exec-end")',
      });
      const forked = fork(parent, 1);
      await untilSandbox(hostd, parent, 'the fork to queue behind the exec', (s) => s.queued === 1);
      hold.release();
      const [child] = track(await forked);
      assert.equal(
        await out(child!, 'steps'),
        "['exec-start', 'exec-end']",
        'the fork point is after the exec it waited for',
      );
      assert.equal(
        await out(parent, 'steps.append("after"); steps'),
        "['exec-start', 'exec-end', 'after']",
      );
    });
  });

  test('a fork that would exceed the sandbox limit starts no child and leaves the parent working', async () => {
    await scenario(async (parent, track) => {
      await out(parent, 'w = 1');
      const count = async (): Promise<number> =>
        (await hostd.json<{ sandboxes: unknown[] }>('GET', '/v1/sandboxes')).body.sandboxes.length;
      const before = await count();
      // The limit is 48: 32 children fit once, never twice.
      const first = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${parent}/fork`,
        { n: 32 },
      );
      assert.equal(first.status, 200);
      track(first.body.children.map((k) => k.id));
      const second = await hostd.json<ErrorBody>('POST', `/v1/sandboxes/${parent}/fork`, {
        n: 32,
      });
      assert.equal(second.status, 429);
      assert.equal(second.body.code, 'limit_reached');
      assert.equal(await count(), before + 32);
      for (const k of first.body.children) await hostd.request('DELETE', `/v1/sandboxes/${k.id}`);
      assert.equal(await count(), before);
      assert.equal(await out(parent, 'w'), '1');
    });
  });

  test("a child's machine has one IO-APIC, as its template's (the firmware's table says so)", async () => {
    await scenario(async (parent, track) => {
      // The ACPI MADT lists each IO-APIC as an entry of type 1; microvm's second one brought
      // 16 virtio-mmio transports nothing uses (docs/architecture.md, "Fork": one IO-APIC)
      const ioapics = [
        'madt = open("/sys/firmware/acpi/tables/APIC", "rb").read()',
        'at, found = 44, 0',
        'while at + 2 <= len(madt):',
        '    found += madt[at] == 1',
        '    at += max(madt[at + 1], 2)',
        'print(found)',
      ].join('\n');
      for (const id of [parent, ...track(await fork(parent, 1))]) {
        assert.equal(await out(id, ioapics), '1');
      }
    });
  });

  test('32 children run code concurrently; the fork image goes with the last child', async () => {
    await scenario(async (parent, track) => {
      await out(parent, 'import hashlib\nseed = b"x" * 1000000');
      // Images of the forks of the tests before may still be on their way out: the last
      // child's release removes its image in the background.
      const earlier = await forkImages();
      const kids = track(await fork(parent, 32));
      const results = await Promise.all(
        kids.map((k, i) => run(hostd, k, `print(${i}, hashlib.sha256(seed).hexdigest()[:12])`)),
      );
      results.forEach((r, i) => {
        assert.equal(r.exit, 0, r.stderr);
        assert.match(r.stdout, new RegExp(`^${i} [0-9a-f]{12}\\n$`));
      });
      const made = (await forkImages()).filter((f) => !earlier.includes(f));
      assert.equal(made.length, 1, 'one shared image for all 32 children');
      for (const k of kids) {
        assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${k}`)).status, 204);
      }
      await eventually(
        'no fork image left once its children are gone',
        async () => !(await forkImages()).includes(made[0]!),
      );
    });
  });
});

const settledStandby = (): Promise<number> => forkStandbySettled(hostd);

/**
 * QEMUs waiting for a fork: started on a spare image copy, not (yet) any sandbox's. A jailed
 * QEMU names it by its view's name, the image's path with '/' spelt '%' (vm/host/vm-view.ts).
 */
async function standbyPids(): Promise<number[]> {
  const qemus = await qemuProcesses(hostd.stateDir);
  return qemus.filter((p) => /\/images[/%]spare-/.test(p.cmd)).map((p) => p.pid);
}

/**
 * The standby QEMUs once there are `ready` of them. Those a fork left unused (on a spare copy
 * too: a command line keeps the image's first name) and those of deleted children are stopped
 * in the background, so a scan can still see some for a moment.
 */
const standbyOnce = (ready: number): Promise<number[]> =>
  eventually(`${ready} standby QEMUs on spare images`, async () => {
    const pids = await standbyPids();
    return pids.length === ready ? pids : null;
  });

describe('fork standby (QEMUs started ahead)', () => {
  test('after a fork, hostd keeps QEMUs started ahead; the next fork resumes them with the parent state', async () => {
    await scenario(async (parent, track) => {
      for (const k of track(await fork(parent, 3))) {
        await hostd.request('DELETE', `/v1/sandboxes/${k}`);
      }
      // As many as the last fork had children.
      const ready = await settledStandby();
      assert.equal(ready, 3);
      const waiting = await standbyOnce(ready);
      await out(parent, 'marker = "set after the standby QEMUs started"');
      const kids = track(await fork(parent, 3));
      for (const k of kids) {
        assert.ok(waiting.includes(await sandboxQemuPid(hostd, k)), 'child runs in a standby QEMU');
        assert.equal(await out(k, 'print(marker)'), 'set after the standby QEMUs started');
      }
      assert.equal(await settledStandby(), ready, 'refilled after the fork');
    });
  });

  test('a standby QEMU that died while waiting is passed over: the fork still succeeds', async () => {
    await scenario(async (parent, track) => {
      for (const k of track(await fork(parent, 2))) {
        await hostd.request('DELETE', `/v1/sandboxes/${k}`);
      }
      const [victim] = await standbyOnce(await settledStandby());
      assert.ok(victim, 'a standby QEMU to kill');
      process.kill(victim, 'SIGKILL');
      await processGone('the killed standby QEMU', victim);
      const kids = track(await fork(parent, 2));
      for (const k of kids) assert.equal(await out(k, 'print(6 * 7)'), '42');
      assert.equal(await out(parent, 'print("parent fine")'), 'parent fine');
    });
  });
});

describe('merge', () => {
  test('the parent id adopts the winner; the winner id is gone; siblings are untouched', async () => {
    await scenario(async (parent, track) => {
      await out(parent, 'who = "parent"');
      const [winner, sibling] = track(await fork(parent, 2));
      await out(winner!, 'who = "winner"');
      await out(sibling!, 'who = "sibling"');
      const res = await hostd.json<Record<string, unknown>>(
        'POST',
        `/v1/sandboxes/${parent}/merge_into/${winner}`,
      );
      assert.equal(res.status, 200);
      assert.deepEqual(res.body, { id: parent, state: 'ready', merged: winner });
      const info = await hostd.json<SandboxInfo>('GET', `/v1/sandboxes/${parent}`);
      assert.deepEqual(
        info.body.merged_from.map((m) => m.id),
        [winner],
        'the parent remembers the winner',
      );
      assert.equal(await out(parent, 'who'), "'winner'");
      assert.equal(await out(sibling!, 'who'), "'sibling'");
      for (const [m, p] of [
        ['GET', `/v1/sandboxes/${winner}`],
        ['POST', `/v1/sandboxes/${winner}/exec`],
        ['POST', `/v1/sandboxes/${parent}/merge_into/${winner}`],
      ] as const) {
        const r = await hostd.json<ErrorBody>(
          m,
          p,
          m === 'POST' && p.endsWith('exec') ? { code: '1' } : undefined,
        );
        assert.equal(r.status, 404, `${m} ${p}`);
        assert.equal(r.body.code, 'sandbox_not_found', `${m} ${p}`);
      }
    });
  });

  test("the parent's old VM is destroyed and its memory freed", async () => {
    await scenario(async (parent, track) => {
      const [winner] = track(await fork(parent, 1));
      const oldPid = await sandboxQemuPid(hostd, parent);
      assert.equal(
        (await hostd.request('POST', `/v1/sandboxes/${parent}/merge_into/${winner}`)).status,
        200,
      );
      await processGone("the parent's old QEMU", oldPid);
    });
  });

  test('merge waits for running execs on both; execs queued on the parent run on the adopted VM', async () => {
    await scenario(async (parent, track) => {
      await out(parent, 'name = "old"');
      const [winner] = track(await fork(parent, 1));
      await out(winner!, 'name = "new"');
      const running = await holdSandbox(hostd, winner!, {
        after: 'name = "set by the running exec"',
      });
      const merged = hostd.request('POST', `/v1/sandboxes/${parent}/merge_into/${winner}`);
      // The merge takes its place in both queues at once: behind the exec on the winner, and
      // holding the parent, so an exec sent to the parent now waits for the merge.
      await untilSandbox(
        hostd,
        winner!,
        'the merge to queue behind the exec',
        (s) => s.queued === 1,
      );
      await untilSandbox(hostd, parent, 'the merge to hold the parent', (s) => s.busy);
      const queuedOnParent = run(hostd, parent, 'print(name)');
      await untilSandbox(
        hostd,
        parent,
        'the exec to queue behind the merge',
        (s) => s.queued === 1,
      );
      running.release();
      assert.equal((await merged).status, 200);
      assert.equal((await queuedOnParent).stdout, 'set by the running exec\n');
    });
  });

  test('forking a sandbox that was merged into works', async () => {
    await scenario(async (parent, track) => {
      const [winner] = track(await fork(parent, 1));
      await out(winner!, 'gen = 2');
      const merged = await hostd.request('POST', `/v1/sandboxes/${parent}/merge_into/${winner}`);
      assert.equal(merged.status, 200);
      const [grandchild] = track(await fork(parent, 1));
      assert.equal(await out(grandchild!, 'gen + 1'), '3');
    });
  });
});
