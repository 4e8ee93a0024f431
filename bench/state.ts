/**
 * Issue 14's figures: snapshots, pause and resume, and restarts or crashes of hostd, through
 * docs/api.md's routes (skipped while hostd does not serve them). The restart figures start a
 * second hostd of their own, on directories they remove, and only when pause is served.
 */
import { readdirSync, lstatSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { findProcessesUsing } from '../src/state-dir.js';
import { startHostd, type Api, type Hostd } from '../testkit/hostd.js';
import { createSandbox } from '../testkit/sandboxes.js';
import { expectOk, guarded, Skip } from './skip.js';
import { exec, now, pct, type Results } from './util.js';

/** Sandboxes the restart figures use; issue 14 names 32, the time scales with the count. */
const RESTART_N = Number(process.env.BENCH_RESTART_N ?? 8);

export async function stateFigures(c: Api, hostd: Hostd | null): Promise<Results> {
  const snapshots = await guarded(
    ['snapshot_request_ms', 'snapshot_pause_ms', 'create_from_snapshot_p50_ms'],
    () => snapshotFigures(c),
  );
  const pause = await guarded(['pause_ms', 'resume_ms', 'paused_sandbox_disk_mib'], () =>
    pauseFigures(c, hostd),
  );
  const restartNames = [
    'restart_32_sandboxes_s',
    'crash_readopt_32_sandboxes_s',
    'start_to_serving_cached_ms',
    'npm_start_to_serving_cached_s',
  ];
  const restart =
    typeof pause.pause_ms === 'number'
      ? await guarded(restartNames, () => restartFigures())
      : Object.fromEntries(restartNames.map((n) => [n, 'skipped: pause is not served']));
  return { ...snapshots, ...pause, ...restart };
}

async function snapshotFigures(c: Api): Promise<Results> {
  const id = await createSandbox(c);
  const made: string[] = [];
  try {
    await exec(c, id, 'state = list(range(1000))\nprint(len(state))');
    const t = now();
    const res = await c.request('POST', `/v1/sandboxes/${id}/snapshot`);
    const snap = JSON.parse(await expectOk(res, 'POST snapshot')) as {
      snapshot_id: string;
      pause_ms?: number;
    };
    const requestMs = now() - t;
    const creates: number[] = [];
    for (let i = 0; i < 5; i++) {
      const t1 = now();
      const child = await createSandbox(c, { snapshot: snap.snapshot_id });
      creates.push(now() - t1);
      made.push(child);
    }
    await c.request('DELETE', `/v1/snapshots/${snap.snapshot_id}`);
    return {
      snapshot_request_ms: Math.round(requestMs * 10) / 10,
      // Seen from outside, the pause is at most the request's time; hostd may report it.
      snapshot_pause_ms: snap.pause_ms ?? 'n/a: at most snapshot_request_ms',
      create_from_snapshot_p50_ms: pct(creates, 50),
    };
  } finally {
    await Promise.all([id, ...made].map((s) => c.request('DELETE', `/v1/sandboxes/${s}`)));
  }
}

/** Bytes allocated under `dir` (what it costs on disk), in MiB. */
function diskMib(dir: string): number {
  let blocks = 0;
  const walk = (d: string): void => {
    for (const name of readdirSync(d)) {
      const p = join(d, name);
      const st = lstatSync(p);
      blocks += st.blocks;
      if (st.isDirectory()) walk(p);
    }
  };
  walk(dir);
  return (blocks * 512) / 1024 / 1024;
}

/** Pause and resume of a sandbox with pandas imported (if present) and 100 MiB written. */
async function pauseFigures(c: Api, hostd: Hostd | null): Promise<Results> {
  const id = await createSandbox(c);
  try {
    await exec(
      c,
      id,
      [
        'import os',
        'try:\n    import pandas\nexcept ImportError:\n    pass',
        'with open("/tmp/written.bin", "wb") as f:\n    f.write(os.urandom(100 << 20))',
        'print(1)',
      ].join('\n'),
    );
    const disk0 = hostd ? diskMib(hostd.dataDir) : 0;
    let t = now();
    await expectOk(await c.request('POST', `/v1/sandboxes/${id}/pause`), 'POST pause');
    const pauseMs = now() - t;
    const disk1 = hostd ? diskMib(hostd.dataDir) : 0;
    t = now();
    await expectOk(await c.request('POST', `/v1/sandboxes/${id}/resume`), 'POST resume');
    const resumeMs = now() - t;
    await exec(c, id, 'print(os.path.getsize("/tmp/written.bin"))');
    return {
      pause_ms: Math.round(pauseMs),
      resume_ms: Math.round(resumeMs),
      paused_sandbox_disk_mib: hostd ? Math.round(disk1 - disk0) : null,
    };
  } finally {
    await c.request('DELETE', `/v1/sandboxes/${id}`);
  }
}

/**
 * SIGTERM with RESTART_N sandboxes holding state until every one answers after the next start,
 * then the same after SIGKILL; the second start's time to serving. Scaled to 32 linearly.
 */
async function restartFigures(): Promise<Results> {
  const stateDir = await mkdtemp('/dev/shm/hostd-bench-restart-');
  const dataDir = await mkdtemp('/var/tmp/hostd-bench-restart-');
  const env = { SERVICE_TEMPLATES: 'python', SERVICE_POOL_SIZE: '1' };
  let h: Hostd | null = await startHostd({ env, stateDir, dataDir });
  try {
    const ids: string[] = [];
    for (let i = 0; i < RESTART_N; i++) {
      const id = await createSandbox(h);
      await exec(h, id, `x = ${i}\nprint(x)`);
      ids.push(id);
    }
    const allAnswer = async (api: Api): Promise<void> => {
      await Promise.all(ids.map((id, i) => exec(api, id, `assert x == ${i}\nprint(x)`)));
    };
    let t = now();
    await h.stop('SIGTERM');
    const t1 = now();
    h = await startHostd({ env, stateDir, dataDir });
    const serving = now() - t1;
    await allAnswer(h);
    const restartS = (now() - t) / 1000;
    t = now();
    await h.stop('SIGKILL');
    h = await startHostd({ env, stateDir, dataDir });
    await allAnswer(h).catch((err: Error) => {
      throw new Skip(`sandboxes lost after SIGKILL (${err.message.slice(0, 80)})`);
    });
    const crashS = (now() - t) / 1000;
    // What a user waits for after a restart with everything cached: `npm start` (its setup
    // checks, no compile since dist/ is current) until hostd serves.
    await h.stop('SIGTERM');
    h = null;
    t = now();
    h = await startHostd({ env, stateDir, dataDir, command: ['npm', 'start', '--silent'] });
    const npmStartS = (now() - t) / 1000;
    const scale = 32 / RESTART_N;
    return {
      restart_measured_sandboxes: RESTART_N,
      restart_32_sandboxes_s: Math.round(restartS * scale * 10) / 10,
      crash_readopt_32_sandboxes_s: Math.round(crashS * scale * 10) / 10,
      start_to_serving_cached_ms: Math.round(serving),
      npm_start_to_serving_cached_s: Math.round(npmStartS * 100) / 100,
    };
  } finally {
    if (h) await h.stop('SIGTERM');
    // A hostd killed above may have left VMs that no later hostd adopted: they are ours.
    for (const pid of await findProcessesUsing(stateDir)) process.kill(pid, 'SIGKILL');
    await rm(stateDir, { recursive: true, force: true });
    await rm(dataDir, { recursive: true, force: true });
  }
}
