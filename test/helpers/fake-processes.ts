/**
 * The processes of a FakeMachine (GuestProcesses, vm/channels/proc-channel.ts) for unit tests of
 * core: a process is a tiny program chosen by `cmd`, its output is what the test says, and every
 * stream ends with onLost when the machine dies or is destroyed, as the real channel's close.
 *
 *   `echo ARGS...`  prints its args on stdout and exits 0
 *   `cat`           echoes its stdin to stdout until stdin is closed, then exits 0
 *   `sleep`         runs until a signal (or the machine's end) ends it
 *   `exit N`        exits N at once
 * A user other than root, `user` or absent is unknown; a cwd `/missing` does not exist.
 */
import {
  ProcChannelError,
  ProcOpError,
  type GuestProcesses,
  type ProcessEnd,
  type ProcessInfo,
  type ProcessSelector,
  type ProcessSink,
  type ProcessSpec,
  type ProcStream,
  type WatchEvent,
  type WatchSink,
  type WatchSpec,
} from '../../src/vm/machine.js';

interface FakeProcess {
  readonly pid: number;
  readonly spec: ProcessSpec;
  readonly sinks: Set<ProcessSink>;
  stdinOpen: boolean;
  end: ProcessEnd | null;
}

export class FakeProcesses implements GuestProcesses {
  private nextPid = 100;
  readonly processes = new Map<number, FakeProcess>();
  /** Bytes handed back with consumed(), per pid. */
  readonly consumed = new Map<number, number>();
  /** Streams detached, by pid (watches: -1). */
  readonly detached: number[] = [];
  private readonly watches = new Set<WatchSink>();
  private lostReason: string | null = null;

  start(spec: ProcessSpec, sink: ProcessSink): ProcStream {
    const pid = this.nextPid++;
    const known = spec.user === undefined || spec.user === 'root' || spec.user === 'user';
    const proc: FakeProcess = {
      pid,
      spec,
      sinks: new Set([sink]),
      stdinOpen: spec.stdin,
      end: null,
    };
    queueMicrotask(() => {
      if (this.lostReason !== null) return sink.onLost(this.lostReason);
      if (!known)
        return sink.onError(new ProcOpError('unknown_user', `invalid username: '${spec.user}'`));
      if (spec.cwd === '/missing') {
        return sink.onError(
          new ProcOpError('invalid_cwd', "cwd '/missing' does not exist", '/missing'),
        );
      }
      this.processes.set(pid, proc);
      sink.onStarted(pid);
      if (spec.cmd === 'echo') {
        this.output(proc, 'stdout', `${spec.args.join(' ')}\n`);
        this.finish(proc, { exitCode: 0, signal: null, timedOut: false });
      } else if (spec.cmd === 'exit') {
        this.finish(proc, { exitCode: Number(spec.args[0]), signal: null, timedOut: false });
      }
    });
    return this.handle(pid, () => proc.sinks.delete(sink));
  }

  connect(selector: ProcessSelector, sink: ProcessSink): ProcStream {
    const proc = this.find(selector);
    queueMicrotask(() => {
      if (this.lostReason !== null) return sink.onLost(this.lostReason);
      if (!proc) return sink.onError(new ProcOpError('not_found', 'process not found'));
      sink.onStarted(proc.pid);
      proc.sinks.add(sink);
    });
    return this.handle(proc?.pid ?? -1, () => proc?.sinks.delete(sink));
  }

  watch(spec: WatchSpec, sink: WatchSink): ProcStream {
    queueMicrotask(() => {
      if (this.lostReason !== null) return sink.onLost(this.lostReason);
      if (spec.path === '/missing') {
        return sink.onError(new ProcOpError('file_not_found', '/missing: no such file'));
      }
      this.watches.add(sink);
      sink.onStarted(spec.path);
    });
    return this.handle(-1, () => this.watches.delete(sink));
  }

  async list(): Promise<ProcessInfo[]> {
    this.check();
    return [...this.processes.values()].map((p) => ({
      pid: p.pid,
      cmd: p.spec.cmd,
      args: [...p.spec.args],
      envs: { ...p.spec.envs },
      cwd: p.spec.cwd ?? '/root',
      user: p.spec.user ?? 'root',
      ...(p.spec.tag !== undefined ? { tag: p.spec.tag } : {}),
    }));
  }

  async input(selector: ProcessSelector, data: Buffer): Promise<void> {
    this.check();
    const proc = this.require(selector);
    if (!proc.stdinOpen) throw new ProcOpError('stdin_closed', 'stdin not enabled or closed');
    if (proc.spec.cmd === 'cat') this.output(proc, 'stdout', data.toString());
  }

  async closeStdin(selector: ProcessSelector): Promise<void> {
    this.check();
    const proc = this.require(selector);
    proc.stdinOpen = false;
    if (proc.spec.cmd === 'cat') this.finish(proc, { exitCode: 0, signal: null, timedOut: false });
  }

  async signal(selector: ProcessSelector, signal: number): Promise<void> {
    this.check();
    this.finish(this.require(selector), { exitCode: null, signal, timedOut: false });
  }

  /** Events for every open watch (the test plays the kernel); how many watches took them. */
  emitEvents(events: WatchEvent[]): number {
    for (const sink of this.watches) sink.onEvents(events, JSON.stringify(events).length);
    return this.watches.size;
  }

  /** Output of a running process (the test plays the program). */
  print(pid: number, text: string): void {
    this.output(this.processes.get(pid)!, 'stdout', text);
  }

  /** The machine is gone: every stream is lost with the channel's reason. */
  lose(reason: string): void {
    if (this.lostReason !== null) return;
    this.lostReason = reason;
    for (const p of this.processes.values()) for (const s of p.sinks) s.onLost(reason);
    for (const w of this.watches) w.onLost(reason);
    this.processes.clear();
    this.watches.clear();
  }

  private check(): void {
    if (this.lostReason !== null) throw new ProcChannelError('closed', this.lostReason);
  }

  private find(selector: ProcessSelector): FakeProcess | undefined {
    if ('pid' in selector) return this.processes.get(selector.pid);
    return [...this.processes.values()].find((p) => p.spec.tag === selector.tag);
  }

  private require(selector: ProcessSelector): FakeProcess {
    const proc = this.find(selector);
    if (!proc) throw new ProcOpError('not_found', 'process not found');
    return proc;
  }

  private output(proc: FakeProcess, stream: 'stdout' | 'stderr', text: string): void {
    const data = Buffer.from(text);
    for (const sink of proc.sinks) sink.onOutput(stream, data, data.length + 1);
  }

  private finish(proc: FakeProcess, end: ProcessEnd): void {
    proc.end = end;
    this.processes.delete(proc.pid);
    for (const sink of proc.sinks) sink.onEnd(end);
    proc.sinks.clear();
  }

  private handle(pid: number, drop: () => void): ProcStream {
    return {
      consumed: (bytes) => this.consumed.set(pid, (this.consumed.get(pid) ?? 0) + bytes),
      detach: () => {
        this.detached.push(pid);
        drop();
      },
    };
  }
}
