/**
 * examples/e2b (README, "Code written for E2B") runs against a real hostd as a user runs it:
 * E2B's published SDKs, unmodified, in a process of its own whose environment holds nothing
 * but PATH, HOME, E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, against a hostd that checks
 * the key. The example checks every answer itself and exits non-zero on the first that is
 * wrong; here it must exit 0 and leave no sandbox behind.
 *
 * The example is compiled with the rest (tsconfig.json includes examples/e2b/src) into
 * dist/examples/e2b/src/main.js, where Node finds the root's node_modules, whose `e2b` and
 * `@e2b/code-interpreter` are the versions examples/e2b/package.json pins (a unit test keeps
 * them equal): CI needs no install of its own for it.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { ROOT } from '../../testkit/root.js';
import { E2B_TEST_KEY } from '../../testkit/e2b.js';
import { reportFailure } from '../../testkit/sandboxes.js';

let hostd: Hostd;

before(async () => {
  // The python template (E2B's code-interpreter-v1 here), with a key, as a shared host has.
  hostd = await startHostd({
    env: { SERVICE_POOL_SIZE: '1', SERVICE_API_KEYS: E2B_TEST_KEY },
    apiKey: E2B_TEST_KEY,
  });
});

after(async () => {
  await hostd?.stop();
});

/** Runs the compiled example to its end; its output (both streams) is kept for the report. */
function runExample(
  env: Record<string, string>,
  signal: AbortSignal,
): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, [join(ROOT, 'dist/examples/e2b/src/main.js')], {
    cwd: tmpdir(),
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
    // A test that times out takes the example with it.
    signal,
    killSignal: 'SIGKILL',
  });
  let output = '';
  child.stdout.setEncoding('utf8').on('data', (s: string) => (output += s));
  child.stderr.setEncoding('utf8').on('data', (s: string) => (output += s));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, output }));
  });
}

test('examples/e2b passes against hostd with only the E2B variables and the key set', async (t) => {
  const { code, output } = await runExample(
    {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: process.env.HOME ?? tmpdir(),
      E2B_API_URL: hostd.e2bUrl,
      E2B_SANDBOX_URL: hostd.e2bUrl,
      E2B_API_KEY: E2B_TEST_KEY,
    },
    t.signal,
  );
  const left = (await hostd.json<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes')).body
    .sandboxes;
  if (code !== 0 || left.length > 0) {
    for (const s of left) await reportFailure(hostd, s.id);
    await Promise.all(left.map((s) => hostd.request('DELETE', `/v1/sandboxes/${s.id}`)));
  }
  assert.equal(code, 0, `the example failed:\n${output}`);
  assert.match(output, /^all checks passed$/m);
  assert.deepEqual(
    left.map((s) => s.id),
    [],
    'the example kills every sandbox it made',
  );
});
