/**
 * Hostile or broken code inside sandboxes, faults on the host, and configured limits. Each
 * must leave hostd serving every other sandbox and the affected one usable or clearly reported.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { sandboxQemuPid, startHostd, type Hostd } from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { createSandbox, withSandbox } from '../../testkit/sandboxes.js';
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

const rssMib = (pid: number): number =>
  Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;

describe('hostile code', () => {
  test('infinite output to a client that does not read: hostd memory stays bounded', async () => {
    await withSandbox(hostd, async (id) => {
      const ac = new AbortController();
      const res = await fetch(`${hostd.url}/v1/sandboxes/${id}/exec`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ code: "while True: print('x' * 1000)" }),
        signal: ac.signal,
      });
      const reader = res.body!.getReader();
      await reader.read();
      const before = rssMib(hostd.proc.pid!);
      await sleep(4000); // stalled client: nothing read
      const grown = rssMib(hostd.proc.pid!) - before;
      assert.ok(grown < 64, `hostd RSS grew ${grown.toFixed(1)} MiB while the client stalled`);
      // The client that reads gets its events in order.
      let last = -1;
      let buf = '';
      for (let chunks = 0; chunks < 50; chunks++) {
        const { value } = await reader.read();
        buf += new TextDecoder().decode(value);
        const lines = buf.split('\n');
        buf = lines.pop()!;
        for (const l of lines) {
          const seq = (JSON.parse(l) as { seq: number }).seq;
          if (last >= 0) assert.equal(seq, last + 1, 'events arrive in order, none missing');
          last = seq;
        }
      }
      ac.abort();
      assert.equal((await run(hostd, id, 'print("alive")')).stdout, 'alive\n');
    });
  });

  test('output beyond SERVICE_MAX_EXEC_OUTPUT_BYTES interrupts the exec and says so', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, "kept = 1\nwhile True: print('y' * 1000)");
      assert.equal(r.exit, 125, 'the output cap, not a client cancel (130)');
      assert.ok(r.stderr.includes('2000000'), 'the stderr notice names the cap');
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
        {
          language: 'bash',
          timeout: 60,
        },
      );
      assert.notEqual(hog.exit, 0);
      assert.equal((await run(hostd, id, 'print(survivor)')).stdout, 'ok\n');
    });
  });

  test('a bash fork bomb is contained, stopped by its timeout, and the sandbox stays usable', async () => {
    const id = await createSandbox(hostd);
    const other = await createSandbox(hostd);
    try {
      const r = await run(hostd, id, 'bomb() { bomb | bomb & }; bomb; sleep 60', {
        language: 'bash',
        timeout: 3,
      });
      assert.equal(r.exit, 124, JSON.stringify(r.events.slice(-3)));
      // The guest's process cap contained it and the exec's end killed it all: the sandbox
      // works, and nothing the bomb started is left running.
      assert.equal((await run(hostd, id, 'print("still usable")')).stdout, 'still usable\n');
      // The bomb's processes are all bash; only the shell counting them should be left.
      const left = await run(hostd, id, 'pgrep -x bash | wc -l', { language: 'bash' });
      assert.equal(left.stdout.trim(), '1', 'bash processes left in the guest');
      assert.equal((await run(hostd, other, 'print("unaffected")')).stdout, 'unaffected\n');
    } finally {
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
      await hostd.request('DELETE', `/v1/sandboxes/${other}`);
    }
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
      const look = await run(hostd, id, `ls ${hostd.stateDir} 2>&1 || true`, { language: 'bash' });
      assert.match(look.stdout, /No such file or directory/);
    });
  });
});

describe('isolation of QEMU on the host', () => {
  test('QEMU runs under its seccomp filter, unprivileged when hostd is root; the state dir is private', async () => {
    const { statSync } = await import('node:fs');
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
    const victim = await createSandbox(hostd);
    const pid = await sandboxQemuPid(hostd, victim);
    const bystander = await createSandbox(hostd);
    process.kill(pid, 'SIGKILL');
    await sleep(300);
    const res = await hostd.json<{ error: string }>('POST', `/v1/sandboxes/${victim}/exec`, {
      code: '1',
    });
    assert.equal(res.status, 500);
    assert.match(res.body.error, /unusable: the VM exited/);
    assert.equal((await run(hostd, bystander, 'print(2)')).stdout, '2\n');
    assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${victim}`)).status, 204);
    let ready = 0;
    for (let i = 0; i < 200 && ready < 1; i++) {
      const text = await (await hostd.request('GET', '/metrics')).text();
      ready = Number(/^hostd_pool_ready\{template="python"\} (\d+)/m.exec(text)?.[1] ?? 0);
      if (ready < 1) await sleep(100);
    }
    assert.equal(ready, 1, 'the pool refilled');
    await hostd.request('DELETE', `/v1/sandboxes/${bystander}`);
  });

  test('a pooled VM that dies is replaced and never handed out', async () => {
    const pids = await findProcessesUsing(hostd.stateDir);
    for (const pid of pids) process.kill(pid, 'SIGKILL'); // every VM of this hostd: the pool's
    await sleep(500);
    const id = await createSandbox(hostd);
    assert.equal((await run(hostd, id, 'print(3)')).stdout, '3\n');
    await hostd.request('DELETE', `/v1/sandboxes/${id}`);
  });
});

describe('host resources too low', () => {
  test('create and fork fail fast with 503 and a clear reason', async () => {
    const low = await startHostd({
      env: { SERVICE_MIN_FREE_MIB: '100000000', SERVICE_POOL_SIZE: '0' },
    });
    try {
      const started = Date.now();
      const res = await low.json<{ error: string }>('POST', '/v1/sandboxes', {});
      assert.equal(res.status, 503);
      assert.match(res.body.error, /not enough host memory: .* MiB available/);
      assert.ok(Date.now() - started < 2000, 'no hang');
    } finally {
      await low.stop();
    }
  });
});

describe('limits', () => {
  test('SERVICE_MAX_SANDBOXES caps creation with a 429', async () => {
    const small = await startHostd({ env: { SERVICE_MAX_SANDBOXES: '2', SERVICE_POOL_SIZE: '0' } });
    try {
      const a = await createSandbox(small);
      const b = await createSandbox(small);
      const c = await small.json<{ error: string }>('POST', '/v1/sandboxes', {});
      assert.equal(c.status, 429);
      assert.match(c.body.error, /sandbox limit reached: 2 alive, 1 requested, limit 2/);
      await small.request('DELETE', `/v1/sandboxes/${a}`);
      const d = await createSandbox(small);
      for (const id of [b, d]) await small.request('DELETE', `/v1/sandboxes/${id}`);
    } finally {
      await small.stop();
    }
  });

  test('an idle sandbox is deleted after SERVICE_IDLE_TIMEOUT_S', async () => {
    const idle = await startHostd({ env: { SERVICE_IDLE_TIMEOUT_S: '2', SERVICE_POOL_SIZE: '0' } });
    try {
      const id = await createSandbox(idle);
      // Listing does not count as using a sandbox; a GET of the sandbox itself would.
      const listed = async (): Promise<boolean> =>
        (
          await idle.json<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes')
        ).body.sandboxes.some((s) => s.id === id);
      let present = true;
      for (let i = 0; i < 40 && present; i++) {
        await sleep(250);
        present = await listed();
      }
      assert.equal(present, false);
      assert.equal((await idle.request('GET', `/v1/sandboxes/${id}`)).status, 404);
      assert.ok(idle.logs.some((l) => l.includes('deleting idle sandbox')));
    } finally {
      await idle.stop();
    }
  });
});
