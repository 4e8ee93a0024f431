/**
 * Runs a guest-side server of a framed port (guest/agent/files_server.py, net_relay.py) on
 * this machine, listening on a unix socket as QEMU's chardev does in a VM, so host channels
 * are tested against the real guest code without a VM.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { ROOT } from './root.js';

const AGENT_DIR = join(ROOT, 'guest', 'agent');

export class GuestServer {
  private stderr = '';

  private constructor(
    private readonly proc: ChildProcess,
    readonly dir: string,
    readonly socketPath: string,
    /** The JSON line the server printed once listening. */
    readonly info: Record<string, unknown>,
  ) {
    proc.stderr?.on('data', (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-20_000);
    });
  }

  /** Starts `script --listen SOCKET ...args` and waits for its first stdout line. */
  static async start(script: string, args: string[] = []): Promise<GuestServer> {
    const dir = mkdtempSync(join(tmpdir(), 'hostd-guest-'));
    const socketPath = join(dir, 'port.sock');
    const proc = spawn('python3', [join(AGENT_DIR, script), '--listen', socketPath, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const lines = createInterface({ input: proc.stdout! });
    const first = await Promise.race([
      once(lines, 'line').then(([line]) => line as string),
      once(proc, 'exit').then(([code]) => {
        throw new Error(`${script} exited with ${String(code)} before listening`);
      }),
    ]);
    return new GuestServer(proc, dir, socketPath, JSON.parse(first) as Record<string, unknown>);
  }

  get log(): string {
    return this.stderr;
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      const exited = once(this.proc, 'exit');
      this.proc.kill('SIGKILL');
      await exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Connects to a unix socket that is already listening, as hostd connects to QEMU's. */
export async function connectUnix(path: string): Promise<Socket> {
  const socket = connect(path);
  await once(socket, 'connect');
  return socket;
}
