/**
 * A bug hostd did not catch ends it (exit 70) after a fatal log line, instead of serving on in
 * an unknown state: its VMs outlive it and the next start re-adopts them (src/fail-fast.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { CRASH_EXIT_CODE } from '../../src/fail-fast.js';
import { ROOT } from '../../testkit/root.js';

/** Runs `crash` (JavaScript) in a node that installed hostd's handlers; its exit and output. */
function crashWith(crash: string): Promise<{ code: number | null; out: string }> {
  const failFast = join(ROOT, 'dist', 'src', 'fail-fast.js');
  const pinoUrl = import.meta.resolve('pino');
  const script = `
    const { pino } = await import(${JSON.stringify(pinoUrl)});
    const { exitOnUncaught } = await import(${JSON.stringify(failFast)});
    exitOnUncaught(pino());
    ${crash}
    setTimeout(() => console.log('still serving'), 2000);
  `;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, out })));
}

test('an uncaught exception logs a fatal line and exits 70', async () => {
  const { code, out } = await crashWith("setTimeout(() => { throw new Error('a bug'); }, 1);");
  assert.equal(code, CRASH_EXIT_CODE);
  const line = JSON.parse(out.split('\n')[0]!) as { level: number; err: { message: string } };
  assert.equal(line.level, 60, 'fatal');
  assert.equal(line.err.message, 'a bug');
  assert.ok(!out.includes('still serving'));
});

test('an unhandled rejection does the same', async () => {
  const { code, out } = await crashWith("void Promise.reject(new Error('a lost promise'));");
  assert.equal(code, CRASH_EXIT_CODE);
  assert.match(out, /a lost promise/);
});
