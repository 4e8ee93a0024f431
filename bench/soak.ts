/**
 * The soak: 16 sandboxes run execs back to back for a fixed time while another loop creates,
 * forks and deletes sandboxes. Any non-2xx or any exec not ending in exit 0 is an error.
 * hostd's RSS is sampled before and after (when the bench started hostd itself).
 */
import { readFileSync } from 'node:fs';
import type { Api } from '../testkit/hostd.js';

function rssMib(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : 0;
}

export async function runSoak(
  c: Api,
  opts: { seconds: number; hostdPid?: number },
): Promise<Record<string, number | null>> {
  const call = (method: string, path: string, body?: unknown): Promise<Response> =>
    c.request(method, path, body);
  let errors = 0;
  let execs = 0;
  const errorSamples: string[] = [];
  const noteError = (what: string): void => {
    errors++;
    if (errorSamples.length < 5) errorSamples.push(what);
  };
  const createOne = async (): Promise<string | null> => {
    const res = await call('POST', '/v1/sandboxes', {});
    if (res.status !== 200) {
      noteError(`create ${res.status} ${await res.text()}`);
      return null;
    }
    return ((await res.json()) as { id: string }).id;
  };

  const workers = (await Promise.all(Array.from({ length: 16 }, createOne))).filter(
    (x): x is string => !!x,
  );
  const rssBefore = opts.hostdPid ? rssMib(opts.hostdPid) : null;
  const deadline = Date.now() + opts.seconds * 1000;

  const execLoop = async (id: string, n: number): Promise<void> => {
    let i = 0;
    while (Date.now() < deadline) {
      const res = await call('POST', `/v1/sandboxes/${id}/exec`, {
        code: `acc = globals().get("acc", 0) + ${n}\nprint(acc, ${i++})`,
      });
      const text = await res.text();
      if (res.status !== 200 || !text.includes('"type":"exit","data":0'))
        noteError(`exec ${res.status} ${text.slice(0, 200)}`);
      else execs++;
    }
  };
  const churn = async (): Promise<void> => {
    while (Date.now() < deadline) {
      const id = await createOne();
      if (!id) continue;
      const fork = await call('POST', `/v1/sandboxes/${id}/fork`, { n: 2 });
      if (fork.status !== 200) noteError(`fork ${fork.status} ${await fork.text()}`);
      else {
        const kids = ((await fork.json()) as { children: { id: string }[] }).children;
        const merge = await call('POST', `/v1/sandboxes/${id}/merge_into/${kids[0]!.id}`);
        if (merge.status !== 200) noteError(`merge ${merge.status}`);
        for (const k of kids.slice(1)) await call('DELETE', `/v1/sandboxes/${k.id}`);
      }
      const del = await call('DELETE', `/v1/sandboxes/${id}`);
      if (del.status !== 204) noteError(`delete ${del.status}`);
    }
  };
  const started = Date.now();
  await Promise.all([...workers.map((id, n) => execLoop(id, n)), churn()]);
  const elapsed = (Date.now() - started) / 1000;
  await Promise.all(workers.map((id) => call('DELETE', `/v1/sandboxes/${id}`)));
  const rssAfter = opts.hostdPid ? rssMib(opts.hostdPid) : null;
  if (errorSamples.length) console.error('soak errors (first 5):\n' + errorSamples.join('\n'));
  return {
    soak_seconds: Math.round(elapsed),
    soak_execs_per_s: Math.round((execs / elapsed) * 10) / 10,
    soak_errors: errors,
    soak_hostd_rss_growth_mib:
      rssBefore === null || rssAfter === null ? null : Math.round((rssAfter - rssBefore) * 10) / 10,
  };
}
