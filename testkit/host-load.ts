/**
 * A busy host, made on purpose: some defects show only when the VMs get a small share of the
 * host's CPU (under TCG a starved guest runs its code many times slower, and a guest process
 * that needs the CPU to answer in time may not get it). A test that specifies behaviour "however
 * loaded the host is" runs under `withBusyHost`, instead of hoping CI happens to be loaded.
 */
import { spawn } from 'node:child_process';
import { availableParallelism } from 'node:os';

/**
 * Runs `fn` while one process per host core spins; they are killed when it ends, failed or not.
 */
export async function withBusyHost<T>(fn: () => Promise<T>): Promise<T> {
  const spinners = Array.from({ length: availableParallelism() }, () =>
    spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' }),
  );
  try {
    return await fn();
  } finally {
    await Promise.all(
      spinners.map(
        (p) =>
          new Promise<void>((resolve) => {
            if (p.exitCode !== null || p.signalCode !== null) return resolve();
            p.once('exit', () => resolve());
            p.kill('SIGKILL');
          }),
      ),
    );
  }
}
