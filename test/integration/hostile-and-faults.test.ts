/**
 * Hostile or broken code inside sandboxes, faults on the host, and configured limits. Each
 * must leave hostd serving every other sandbox and the affected one usable or clearly reported.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, statSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import {
  processGone,
  sandboxQemuPid,
  startHostd,
  type ErrorBody,
  type Hostd,
} from '../../testkit/hostd.js';
import { eventually } from '../../testkit/eventually.js';
import { download, listDir, statPath } from '../../testkit/files.js';
import { withBusyHost } from '../../testkit/host-load.js';
import { openExec, run, type ExecEvent } from '../../testkit/exec.js';
import { poolHolds } from '../../testkit/metrics.js';
import { sandboxInfo, untilSandbox, withSandbox, withSandboxes } from '../../testkit/sandboxes.js';
import { fail } from '../../src/errors.js';
import { VmError } from '../../src/vm/machine.js';
import { findProcessesUsing } from '../../src/state-dir.js';

let hostd: Hostd;
before(async () => {
  hostd = await startHostd({
    env: { SERVICE_MAX_EXEC_OUTPUT_BYTES: '2000000', SERVICE_POOL_SIZE: '1' },
  });
});
after(async () => {
  await hostd.stop();
});

/** hostd's own notices in a stream are stderr lines with this prefix (docs/api.md, Exec). */
const isNotice = (e: ExecEvent | undefined): boolean =>
  e?.type === 'stderr' && String(e.data).startsWith('hostd: ');

const rssMib = (pid: number): number =>
  Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;

/**
 * Whether a thread of guest process `pid` is blocked writing to one of its virtio ports: read
 * through the files API (a lane of its own), from the guest's /proc. That is where backpressure
 * ends up once hostd stops reading the VM.
 */
async function blockedOnPort(api: Hostd, id: string, pid: number): Promise<boolean> {
  const tasks = await listDir(api, id, `/proc/${pid}/task`);
  for (const task of tasks.body.entries ?? []) {
    const syscall = await download(api, id, `/proc/${pid}/task/${task.name}/syscall`);
    const [nr, fd] = (await syscall.text()).split(' ');
    if (syscall.status !== 200 || nr !== '1' || fd === undefined) continue; // 1: write
    const target = (await statPath(api, id, `/proc/${pid}/fd/${Number(fd)}`)).body.target;
    if (target?.startsWith('/dev/vport')) return true;
  }
  return false;
}

describe('hostile code', () => {
  test('infinite output to a client that does not read: hostd memory stays bounded', async () => {
    // Without the file's 2 MB output cap, which would end the exec before hostd could hold
    // more than that whatever it did.
    const uncapped = await startHostd({
      env: { SERVICE_MAX_EXEC_OUTPUT_BYTES: String(2 ** 40), SERVICE_POOL_SIZE: '0' },
    });
    try {
      await withSandbox(uncapped, async (id) => {
        const stream = await openExec(uncapped, id, {
          code: "import os\nprint(os.getpid(), flush=True)\nwhile True: print('x' * 1000)",
        });
        try {
          const pid = Number((await stream.next())!.data);
          const before = rssMib(uncapped.proc.pid!);
          // The client reads nothing more: hostd must stop taking output from the VM rather
          // than buffer it, until the REPL blocks on its port (seen three times in a row, not
          // a write that was just slow), having grown hostd's memory by a bounded amount.
          let streak = 0;
          await eventually(
            'the REPL to block writing its output',
            async () => (streak = (await blockedOnPort(uncapped, id, pid)) ? streak + 1 : 0) >= 3,
            { timeoutMs: 300_000, everyMs: 50 },
          );
          const grown = rssMib(uncapped.proc.pid!) - before;
          assert.ok(grown < 64, `hostd RSS grew ${grown.toFixed(1)} MiB while the client stalled`);
          // The client that reads again gets its events in order, none missing.
          let last = -1;
          for (let i = 0; i < 2000; i++) {
            const seq = (await stream.next())!.seq;
            if (last >= 0) assert.equal(seq, last + 1, 'events arrive in order, none missing');
            last = seq;
          }
        } finally {
          stream.abort();
        }
        assert.equal((await run(uncapped, id, 'print("alive")')).stdout, 'alive\n');
      });
    } finally {
      await uncapped.stop();
    }
  });

  test('output beyond SERVICE_MAX_EXEC_OUTPUT_BYTES interrupts the exec and says so', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, "kept = 1\nwhile True: print('y' * 1000)");
      assert.equal(r.exit, 125, 'the output cap, not a client cancel (130)');
      assert.ok(isNotice(r.events.at(-2)), 'a notice before the exit says why');
      assert.ok(r.stdout.length <= 2_100_000);
      assert.equal((await run(hostd, id, 'print(kept)')).stdout, '1\n');
    });
  });

  test('memory exhaustion in the guest kills the hog, not the sandbox', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'survivor = "ok"');
      const hog = await run(
        hostd,
        id,
        'python3 -c "a = []\nwhile True: a.append(bytearray(10**7))"',
        { language: 'bash' },
      );
      assert.equal(hog.exit, 137, "killed by the OOM killer of user code's cgroup (SIGKILL)");
      assert.equal((await run(hostd, id, 'print(survivor)')).stdout, 'ok\n');
    });
  });

  test('a Python cell that exhausts memory is stopped by the cap on user code: its exec ends at once with 137', async () => {
    await withSandbox(hostd, async (id) => {
      // Nothing else is asked of the sandbox meanwhile: the exit must come by itself.
      const hog = await run(
        hostd,
        id,
        'chunks = []\nfor i in range(32): chunks.append(bytearray(64 << 20))',
      );
      assert.equal(hog.exit, 137, JSON.stringify(hog.events.slice(-3)));
      // User code's own cgroup reached its cap and its OOM killer chose the REPL: the guest
      // as a whole never ran out of memory, which would have had the kernel reclaim the
      // pages every process runs from (the agent's included) for minutes before a kill.
      const events = await run(hostd, id, 'cat /sys/fs/cgroup/sandbox/memory.events', {
        language: 'bash',
      });
      assert.match(events.stdout, /^oom [1-9]/m, events.stdout);
      const next = await run(hostd, id, 'print("fresh")');
      assert.equal(next.stdout, 'fresh\n');
      assert.match(next.stderr, /the Python REPL exited \(code 137\)/);
    });
  });

  test('a bash fork bomb is contained, stopped by its timeout, and the sandbox stays usable, on a busy host too', async () => {
    await withSandboxes(hostd, async ({ create }) => {
      const id = await create();
      const other = await create();
      // The agent must get the vCPU to act on the timeout, however many processes of user
      // code want it and however little of the host the VM gets: twice, on a busy host.
      await withBusyHost(async () => {
        for (let round = 0; round < 2; round++) {
          const r = await run(hostd, id, 'bomb() { bomb | bomb & }; bomb; sleep 60', {
            language: 'bash',
            timeout: 3,
          });
          assert.equal(r.exit, 124, JSON.stringify(r.events.slice(-3)));
        }
      });
      // The guest's process cap contained it and the exec's end killed it all: the sandbox
      // works, and nothing the bomb started is left running.
      assert.equal((await run(hostd, id, 'print("still usable")')).stdout, 'still usable\n');
      // The bomb's processes are all bash and were sent SIGKILL; once they are gone, only the
      // shell counting them is left.
      await eventually(
        'no bash of the bomb left in the guest',
        async () =>
          (await run(hostd, id, 'pgrep -x bash | wc -l', { language: 'bash' })).stdout === '1\n',
        { timeoutMs: 60_000, everyMs: 200 },
      );
      assert.equal((await run(hostd, other, 'print("unaffected")')).stdout, 'unaffected\n');
    });
  });

  test('CPU spinners left running by the REPL: execs still answer, and a timeout still interrupts', async () => {
    await withSandbox(hostd, async (id) => {
      // Processes the REPL starts live on with it, in user code's cgroup, wanting the vCPU
      await run(
        hostd,
        id,
        'import subprocess\nspinners = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(8)]',
      );
      assert.equal((await run(hostd, id, 'print(len(spinners))')).stdout, '8\n');
      assert.equal(
        (await run(hostd, id, 'echo bash too', { language: 'bash' })).stdout,
        'bash too\n',
      );
      const slow = await run(hostd, id, 'import time\ntime.sleep(600)', { timeout: 2 });
      assert.equal(slow.exit, 124, JSON.stringify(slow.events.slice(-3)));
      const stopped = await run(
        hostd,
        id,
        'for p in spinners: p.kill(); p.wait()\nprint("stopped")',
      );
      assert.equal(stopped.stdout, 'stopped\n');
    });
  });

  test('malformed messages forged on the agent channel by guest root are ignored', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'mark = "intact"');
      // Steal the agent's port descriptor (guest code is root) and write garbage to hostd.
      const forge = [
        'import ctypes, os, subprocess',
        'pid = int(subprocess.check_output(["pgrep", "-f", "opt/hostd/agent.py"]).split()[0])',
        'fds = os.listdir(f"/proc/{pid}/fd")',
        'n = next(int(f) for f in fds if os.readlink(f"/proc/{pid}/fd/{f}").startswith("/dev/vport"))',
        'libc = ctypes.CDLL(None, use_errno=True)',
        'fd = libc.syscall(438, os.pidfd_open(pid), n, 0)  # pidfd_getfd',
        'assert fd >= 0, ctypes.get_errno()',
        'os.write(fd, b\'null\\n[1]\\n"x"\\n{"op":"out","id":"1"}\\n{"op":"out","id":1,"data":5}\\n{"op":"exit","id":null}\\n\')',
        'print("forged")',
      ].join('\n');
      const r = await run(hostd, id, forge);
      assert.match(r.stdout + r.stderr, /forged/);
      assert.equal((await hostd.request('GET', '/v1/healthz')).status, 200, 'hostd survived');
      assert.equal((await run(hostd, id, 'print(mark)')).stdout, 'intact\n');
    });
  });

  test('the guest has no network and no view of the host', async () => {
    await withSandbox(hostd, async (id) => {
      const links = await run(hostd, id, 'ls /sys/class/net', { language: 'bash' });
      assert.equal(links.stdout, 'lo\n');
      const net = await run(
        hostd,
        id,
        'import socket\ntry:\n    socket.create_connection(("10.0.2.2", 80), timeout=3)\n    print("connected")\nexcept OSError as e:\n    print("blocked", e.errno)',
      );
      assert.match(net.stdout, /^blocked/);
      const mounts = await run(hostd, id, 'cat /proc/mounts', { language: 'bash' });
      assert.doesNotMatch(mounts.stdout, /9p|virtiofs|nfs|\/dev\/shm\/hostd/);
      const look = await run(hostd, id, `[ -e ${hostd.stateDir} ] && echo visible || echo absent`, {
        language: 'bash',
      });
      assert.equal(look.stdout, 'absent\n');
    });
  });
});

describe('isolation of QEMU on the host', () => {
  test('QEMU runs under its seccomp filter, unprivileged when hostd is root; the state dir is private', async () => {
    const { statSync } = await import('node:fs');
    // The pool's VM, started: the tests before took pooled VMs, and a QEMU that the refill has
    // only just spawned may not have applied its seccomp filter (-sandbox on) yet.
    await poolHolds(hostd, 'python', 1);
    const pids = await findProcessesUsing(hostd.stateDir);
    assert.ok(pids.length > 0);
    for (const pid of pids) {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      assert.match(status, /^Seccomp:\s+2$/m, 'seccomp filter mode');
      const uid = Number(/^Uid:\s+(\d+)/m.exec(status)![1]);
      if (process.getuid!() === 0) assert.notEqual(uid, 0, 'QEMU must not run as root');
      else assert.equal(uid, process.getuid!());
    }
    const mode = statSync(hostd.stateDir).mode & 0o777;
    assert.ok(mode === 0o700 || mode === 0o710, `state dir mode ${mode.toString(8)}`);
  });
});

describe('faults on the host', () => {
  test('a QEMU killed with SIGKILL: 500 on the next call, DELETE works, others unaffected, pool refills', async () => {
    await withSandboxes(hostd, async ({ create }) => {
      const victim = await create();
      const pid = await sandboxQemuPid(hostd, victim);
      const bystander = await create();
      process.kill(pid, 'SIGKILL');
      const failed = await untilSandbox(
        hostd,
        victim,
        'the sandbox to fail',
        (s) => s.state === 'failed',
      );
      assert.equal(typeof failed.error, 'string');
      const res = await hostd.json<ErrorBody>('POST', `/v1/sandboxes/${victim}/exec`, {
        code: '1',
      });
      assert.equal(res.status, 500);
      assert.equal(res.body.code, 'executor_error');
      assert.equal((await run(hostd, bystander, 'print(2)')).stdout, '2\n');
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${victim}`)).status, 204);
      await poolHolds(hostd, 'python', 1);
    });
  });

  test("a paused sandbox whose saved memory was cut short: 500 with the failure's kind, no host path", async () => {
    await withSandboxes(hostd, async ({ create }) => {
      const id = await create();
      await run(hostd, id, 'x = 1');
      assert.equal((await hostd.request('POST', `/v1/sandboxes/${id}/pause`)).status, 200);
      const record = JSON.parse(
        readFileSync(join(hostd.dataDir, 'sandboxes', `${id}.json`), 'utf8'),
      ) as { paused: { id: string } };
      const delta = join(hostd.dataDir, 'paused', record.paused.id, 'memory.delta');
      truncateSync(delta, Math.floor(statSync(delta).size / 2));
      // connect() fails the request if the answer names the file or any host directory.
      const res = await hostd.json<ErrorBody>('POST', `/v1/sandboxes/${id}/exec`, { code: '1' });
      assert.equal(res.status, 500);
      const damaged = new VmError('state_corrupt', '').clientReason;
      assert.deepEqual(res.body, fail('vmOperationFailed', 'resume the sandbox', damaged).toBody());
      assert.equal((await sandboxInfo(hostd, id)).state, 'paused', 'its files are kept');
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    });
  });

  test('a pooled VM that died is replaced and never handed out', async () => {
    // The test before took the pooled VM; its replacement starts in the background.
    await poolHolds(hostd, 'python', 1);
    // Every VM of this hostd: the pool's (and the QEMUs started ahead for forks).
    const pids = await findProcessesUsing(hostd.stateDir);
    assert.ok(pids.length > 0, 'a pooled VM to kill');
    for (const pid of pids) process.kill(pid, 'SIGKILL');
    for (const pid of pids) await processGone('a killed QEMU', pid);
    await withSandbox(hostd, async (id) => {
      assert.equal((await run(hostd, id, 'print(3)')).stdout, '3\n');
    });
    await poolHolds(hostd, 'python', 1);
  });
});

describe('host resources too low', () => {
  test('create fails with 503 insufficient_resources and a Retry-After', async () => {
    const low = await startHostd({
      env: { SERVICE_MIN_FREE_MIB: '100000000', SERVICE_POOL_SIZE: '0' },
    });
    try {
      const res = await low.request('POST', '/v1/sandboxes', {});
      assert.equal(res.status, 503);
      assert.equal(((await res.json()) as ErrorBody).code, 'insufficient_resources');
      assert.ok(Number(res.headers.get('retry-after')) > 0, 'Retry-After is set');
    } finally {
      await low.stop();
    }
  });
});

describe('limits', () => {
  test('SERVICE_MAX_SANDBOXES caps creation with a 429', async () => {
    const small = await startHostd({ env: { SERVICE_MAX_SANDBOXES: '2', SERVICE_POOL_SIZE: '0' } });
    try {
      await withSandboxes(small, async ({ create }) => {
        const a = await create();
        await create();
        const c = await small.request('POST', '/v1/sandboxes', {});
        assert.equal(c.status, 429);
        assert.equal(((await c.json()) as ErrorBody).code, 'limit_reached');
        assert.ok(Number(c.headers.get('retry-after')) > 0, 'Retry-After is set');
        assert.equal((await small.request('DELETE', `/v1/sandboxes/${a}`)).status, 204);
        await create();
      });
    } finally {
      await small.stop();
    }
  });

  test('an idle sandbox is paused after SERVICE_IDLE_TIMEOUT_S, or deleted if told so; its VM stops', async () => {
    for (const action of ['pause', 'delete'] as const) {
      const idle = await startHostd({
        env: { SERVICE_IDLE_TIMEOUT_S: '2', SERVICE_IDLE_ACTION: action, SERVICE_POOL_SIZE: '0' },
      });
      try {
        await withSandboxes(idle, async ({ create }) => {
          const id = await create();
          const pid = await sandboxQemuPid(idle, id);
          const expected = action === 'pause' ? 'paused' : 'gone';
          // Listing does not count as using a sandbox; a GET of the sandbox itself would.
          const state = async (): Promise<string> =>
            (
              await idle.json<{ sandboxes: { id: string; state: string }[] }>(
                'GET',
                '/v1/sandboxes',
              )
            ).body.sandboxes.find((s) => s.id === id)?.state ?? 'gone';
          await eventually(
            `the idle sandbox to be ${expected}`,
            async () => (await state()) === expected,
            { timeoutMs: 60_000, everyMs: 100 },
          );
          await processGone("the idle sandbox's QEMU", pid);
        });
      } finally {
        await idle.stop();
      }
    }
  });
});
