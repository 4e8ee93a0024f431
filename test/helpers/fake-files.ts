/**
 * The files of a FakeMachine: kept in its key-value memory under `file:<path>`, so that forks,
 * snapshots and pauses carry them as they carry the rest of its state. Enough of GuestFiles for
 * core's file lane; tar streams are not faked. Operations as a user resolve relative paths
 * against /root (root) or /home/user (user); any other user is unknown. Directories made by
 * mkdirAs are kept under `dir:<path>`. Operations can be held (FakeHypervisor.holdFiles)
 * to order them against execs and forks.
 */
import { PassThrough, Readable } from 'node:stream';
import {
  FileChannelError,
  FileOpError,
  type DetailedEntry,
  type Download,
  type ExtractResult,
  type MkdirResult,
  type MoveResult,
  type UserWriteResult,
  type FileEntry,
  type GuestFiles,
  type Upload,
  type WriteResult,
} from '../../src/vm/machine.js';

const PREFIX = 'file:';
const DIR = 'dir:';
const HOMES: Record<string, string> = { root: '/root', user: '/home/user' };

export class FakeFiles implements GuestFiles {
  constructor(
    private readonly memory: Map<string, string>,
    /** Resolves when held operations may go on. */
    private readonly gate: () => Promise<void>,
    /** Throws the fault a test injected into the next file operation (FakeHypervisor.failNext). */
    private readonly fault: () => void = () => undefined,
  ) {}

  /** Every operation, as `op path`, in the order they ran (the pool's files warm-up's). */
  readonly ops: string[] = [];

  /** Logs an operation and throws a fault injected into it. */
  private did(op: string, path: string): void {
    this.ops.push(`${op} ${path}`);
    this.fault();
  }

  writeFile(path: string, options: { signal?: AbortSignal } = {}): Upload<WriteResult> {
    const sink = new PassThrough();
    const chunks: Buffer[] = [];
    sink.on('data', (c: Buffer) => chunks.push(c));
    const done = new Promise<WriteResult>((resolve, reject) => {
      sink.on('error', reject);
      // As the real channel: a cancelled upload ends with nothing written.
      options.signal?.addEventListener('abort', () =>
        reject(new FileChannelError('cancelled', 'the upload was cancelled')),
      );
      sink.on('end', () => {
        void this.gate().then(() => {
          try {
            this.did('write', path);
          } catch (err) {
            reject(err);
            return;
          }
          const content = Buffer.concat(chunks);
          this.memory.set(PREFIX + path, content.toString('latin1'));
          resolve({ path, size: content.length });
        });
      });
    });
    return { sink, done };
  }

  async readFile(path: string): Promise<Download> {
    await this.gate();
    this.did('read', path);
    const content = this.memory.get(PREFIX + path);
    if (content === undefined) throw new FileOpError('file_not_found', path, 'no such file');
    const bytes = Buffer.from(content, 'latin1');
    return { size: bytes.length, stream: Readable.from([bytes]), done: Promise.resolve() };
  }

  tarOut(path: string): Promise<Download> {
    return Promise.reject(new FileOpError('io_error', path, 'the fake has no tar'));
  }

  tarIn(path: string): Upload<ExtractResult> {
    const sink = new PassThrough().resume();
    return { sink, done: Promise.reject(new FileOpError('io_error', path, 'the fake has no tar')) };
  }

  async list(path: string): Promise<FileEntry[]> {
    await this.gate();
    this.did('list', path);
    const dir = path.endsWith('/') ? path : `${path}/`;
    return [...this.memory.keys()]
      .filter((k) => k.startsWith(PREFIX + dir))
      .map((k) => this.entry(k.slice(PREFIX.length)))
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  async stat(path: string): Promise<FileEntry> {
    await this.gate();
    this.did('stat', path);
    if (!this.memory.has(PREFIX + path))
      throw new FileOpError('file_not_found', path, 'no such file');
    return this.entry(path);
  }

  async mkdir(path: string): Promise<string> {
    await this.gate();
    return path;
  }

  async remove(path: string): Promise<void> {
    await this.gate();
    this.did('remove', path);
    if (!this.memory.delete(PREFIX + path)) {
      throw new FileOpError('file_not_found', path, 'no such file');
    }
  }

  async move(source: string, destination: string): Promise<MoveResult> {
    await this.gate();
    const content = this.memory.get(PREFIX + source);
    if (content === undefined) throw new FileOpError('file_not_found', source, 'no such file');
    this.memory.delete(PREFIX + source);
    this.memory.set(PREFIX + destination, content);
    return { path: destination, entry: this.detailed(destination) };
  }

  writeFileAs(
    user: string,
    path: string,
    options: { signal?: AbortSignal; metadata?: Readonly<Record<string, string>> } = {},
  ): Upload<UserWriteResult> {
    const resolved = this.resolve(user, path);
    const { sink, done } = this.writeFile(resolved, options);
    const result = done.then((r): UserWriteResult => {
      const meta = options.metadata && Object.keys(options.metadata).length > 0;
      return meta ? { ...r, metadata: { ...options.metadata } } : r;
    });
    return { sink, done: result };
  }

  readFileAs(user: string, path: string): Promise<Download> {
    return this.readFile(this.resolve(user, path));
  }

  async statAs(user: string, path: string): Promise<DetailedEntry> {
    const resolved = this.resolve(user, path);
    await this.gate();
    if (this.memory.has(DIR + resolved)) return this.detailed(resolved, 'dir');
    if (!this.memory.has(PREFIX + resolved)) {
      throw new FileOpError('file_not_found', resolved, 'no such file');
    }
    return this.detailed(resolved);
  }

  async listAs(user: string, path: string, depth: number): Promise<DetailedEntry[]> {
    const resolved = this.resolve(user, path);
    await this.gate();
    const dir = resolved.endsWith('/') ? resolved : `${resolved}/`;
    const found: DetailedEntry[] = [];
    for (const key of this.memory.keys()) {
      const prefix = key.startsWith(PREFIX) ? PREFIX : key.startsWith(DIR) ? DIR : null;
      if (!prefix) continue;
      const p = key.slice(prefix.length);
      if (!p.startsWith(dir) || p.slice(dir.length).split('/').length > Math.max(1, depth)) {
        continue;
      }
      found.push(this.detailed(p, prefix === DIR ? 'dir' : 'file'));
    }
    return found.sort((a, b) => a.path.localeCompare(b.path));
  }

  async mkdirAs(user: string, path: string): Promise<MkdirResult> {
    const resolved = this.resolve(user, path);
    await this.gate();
    const created = !this.memory.has(DIR + resolved);
    this.memory.set(DIR + resolved, user);
    return { path: resolved, created, entry: this.detailed(resolved, 'dir') };
  }

  async removeAs(user: string, path: string): Promise<boolean> {
    const resolved = this.resolve(user, path);
    await this.gate();
    let removed = false;
    for (const key of [...this.memory.keys()]) {
      const p = key.startsWith(PREFIX)
        ? key.slice(PREFIX.length)
        : key.startsWith(DIR)
          ? key.slice(DIR.length)
          : null;
      if (p !== null && (p === resolved || p.startsWith(`${resolved}/`))) {
        this.memory.delete(key);
        removed = true;
      }
    }
    return removed;
  }

  private resolve(user: string, path: string): string {
    const home = HOMES[user];
    if (home === undefined) {
      throw new FileOpError('unknown_user', path, `invalid username: '${user}'`);
    }
    if (path === '' || path === '~') return home;
    if (path.startsWith('~/')) return `${home}/${path.slice(2)}`;
    return path.startsWith('/') ? path : `${home}/${path}`;
  }

  private detailed(path: string, type: 'file' | 'dir' = 'file'): DetailedEntry {
    const base =
      type === 'dir' ? { ...this.entry(path), type, size: 4096, mode: 0o755 } : this.entry(path);
    return {
      ...base,
      owner: 'user',
      group: 'user',
      permissions: type === 'dir' ? 'drwxr-xr-x' : '-rw-r--r--',
      mtime_ns: '1700000000123456789',
    };
  }

  private entry(path: string): FileEntry {
    return {
      name: path.slice(path.lastIndexOf('/') + 1),
      path,
      type: 'file',
      size: Buffer.byteLength(this.memory.get(PREFIX + path) ?? '', 'latin1'),
      mode: 0o644,
      mtime_ms: 0,
    };
  }
}
