/**
 * What E2B's SDKs cost on top of hostd's own API (issue 24, docs/e2b.md "Speed"): the published
 * `@e2b/code-interpreter`'s `runCode('1+1')` and `e2b`'s `commands.run('true')` on one warm
 * sandbox, each beside the native exec of `print(1)` (measured as `exec_print_p50_ms` is: a
 * keep-alive node:http client) on the same sandbox, the three calls interleaved so that the
 * ratios compare calls made under the same load.
 */
import { Agent } from 'node:http';
import { Sandbox } from '@e2b/code-interpreter';
import type { Api } from '../testkit/hostd.js';
import { Skip } from './skip.js';
import { execHttp, now, pct, type Results } from './util.js';

/** Every figure e2bFigures reports (all skipped together when there is no E2B front). */
export const E2B_FIGURES = [
  'e2b_run_code_p50_ms',
  'e2b_commands_run_p50_ms',
  'e2b_exec_print_p50_ms',
  'e2b_run_code_ratio',
  'e2b_commands_run_ratio',
];

const WARMUP = 3;
const SAMPLES = 20;

/**
 * `e2bUrl`: the E2B front's origin ('' when unknown: a hostd the bench did not start and no
 * E2B_API_URL). `apiKey`: a key the front takes. `settle` waits until the host is at rest (the
 * pool refilled after the create).
 */
export async function e2bFigures(
  c: Api,
  e2bUrl: string,
  apiKey: string,
  settle: () => Promise<void>,
): Promise<Results> {
  if (!e2bUrl) throw new Skip('no E2B front (set E2B_API_URL with SERVICE_HOSTD_URL)');
  const connection = { apiKey, apiUrl: e2bUrl, sandboxUrl: e2bUrl, requestTimeoutMs: 300_000 };
  const sandbox = await Sandbox.create({ ...connection, timeoutMs: 900_000 });
  const keepAlive = new Agent({ keepAlive: true, maxSockets: 1 });
  try {
    await settle();
    const runCode: number[] = [];
    const commands: number[] = [];
    const native: number[] = [];
    for (let i = 0; i < WARMUP + SAMPLES; i++) {
      let t = now();
      const cell = await sandbox.runCode('1+1', { timeoutMs: 0 });
      const runCodeMs = now() - t;
      if (cell.text !== '2' || cell.error) {
        throw new Error(`runCode('1+1'): ${JSON.stringify(cell.toJSON()).slice(0, 300)}`);
      }
      t = now();
      const command = await sandbox.commands.run('true');
      const commandMs = now() - t;
      if (command.exitCode !== 0) throw new Error(`commands.run('true'): ${command.exitCode}`);
      t = now();
      await execHttp(c, keepAlive, sandbox.sandboxId, 'print(1)');
      const nativeMs = now() - t;
      if (i < WARMUP) continue;
      runCode.push(runCodeMs);
      commands.push(commandMs);
      native.push(nativeMs);
    }
    const [code, command, exec] = [pct(runCode, 50), pct(commands, 50), pct(native, 50)];
    return {
      e2b_run_code_p50_ms: code,
      e2b_commands_run_p50_ms: command,
      e2b_exec_print_p50_ms: exec,
      e2b_run_code_ratio: Math.round((code / exec) * 10) / 10,
      e2b_commands_run_ratio: Math.round((command / exec) * 10) / 10,
    };
  } finally {
    keepAlive.destroy();
    await sandbox.kill().catch(() => c.request('DELETE', `/v1/sandboxes/${sandbox.sandboxId}`));
  }
}
