/**
 * A SandboxManager on the fake hypervisor, as core's unit tests set it up, and the two ways
 * they drive an exec: to its end, or held running until the test lets it go.
 */
import { Writable } from 'node:stream';
import { pino, type Logger } from 'pino';
import type { ExecEvent } from '../../src/core/exec-run.js';
import {
  SandboxManager,
  type ManagerObserver,
  type ManagerOptions,
} from '../../src/core/sandbox-manager.js';
import { FakeHypervisor } from './fake-hypervisor.js';
import { FakeImages, plan } from './fake-images.js';

const PLENTY = { memAvailableMib: 1e6, dataDirFreeMib: 1e6 };

export function setupOptions(free = { ...PLENTY }): ManagerOptions {
  return {
    templates: [
      plan('python', { memoryMib: 512, vcpus: 1, poolSize: 2 }),
      plan('slim', { memoryMib: 256, vcpus: 1, poolSize: 0 }),
    ],
    images: new FakeImages(['python', 'slim']),
    maxSandboxes: 10,
    maxQueuedExecs: 3,
    idleTimeoutS: 0,
    minFreeMib: 100,
    maxExecOutputBytes: 1024,
    forkStandbyMax: 4,
    hostFree: () => free,
    refillPauses: { afterTakeMs: 1, afterFailureMs: 1, whileShortMs: 1 },
    egress: { apiPort: 7070, hostAddresses: ['127.0.0.1'] },
    maxFileBytes: 1024,
  };
}

export function setup(
  overrides: Partial<ManagerOptions> = {},
  log: Logger = pino({ level: 'silent' }),
  observer?: ManagerObserver,
): {
  manager: SandboxManager;
  hv: FakeHypervisor;
  free: { memAvailableMib: number; dataDirFreeMib: number };
} {
  const hv = new FakeHypervisor();
  const free = { ...PLENTY };
  const manager = new SandboxManager({ ...setupOptions(free), ...overrides }, hv, log, observer);
  return { manager, hv, free };
}

export async function started(
  overrides: Partial<ManagerOptions> = {},
  log?: Logger,
  observer?: ManagerObserver,
): Promise<ReturnType<typeof setup>> {
  const s = setup(overrides, log, observer);
  await s.manager.start();
  return s;
}

/** A logger that keeps its lines, parsed, for a test to read what hostd logged. */
export function capturedLog(): { log: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const l of chunk.toString('utf8').split('\n')) {
        if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
      }
      done();
    },
  });
  return { log: pino({ level: 'debug' }, sink), lines };
}

/** Runs one exec to its end and returns its events. */
export async function run(manager: SandboxManager, id: string, code: string): Promise<ExecEvent[]> {
  const events: ExecEvent[] = [];
  for await (const e of await manager.exec(id, { code, language: 'python' })) events.push(e);
  return events;
}

/** Starts an exec that runs until its client goes away (`stop()`), as a long cell would. */
export async function hang(manager: SandboxManager, id: string): Promise<{ stop(): void }> {
  const ac = new AbortController();
  const run = await manager.exec(id, { code: 'hang', language: 'python', signal: ac.signal });
  return { stop: () => (ac.abort(), run.discard()) };
}
