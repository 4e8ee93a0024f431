/**
 * The files of a FakeMachine: kept in its key-value memory under `file:<path>`, so that forks,
 * snapshots and pauses carry them as they carry the rest of its state. Enough of GuestFiles for
 * core's file lane; tar streams are not faked. Operations can be held (FakeHypervisor.holdFiles)
 * to order them against execs and forks.
 */
import { PassThrough, Readable } from 'node:stream';
import {
  FileChannelError,
  FileOpError,
  type Download,
  type ExtractResult,
  type FileEntry,
  type GuestFiles,
  type Upload,
  type WriteResult,
} from '../../src/vm/machine.js';

const PREFIX = 'file:';

export class FakeFiles implements GuestFiles {
  constructor(
    private readonly memory: Map<string, string>,
    /** Resolves when held operations may go on. */
    private readonly gate: () => Promise<void>,
  ) {}

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
    const dir = path.endsWith('/') ? path : `${path}/`;
    return [...this.memory.keys()]
      .filter((k) => k.startsWith(PREFIX + dir))
      .map((k) => this.entry(k.slice(PREFIX.length)))
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  async stat(path: string): Promise<FileEntry> {
    await this.gate();
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
    if (!this.memory.delete(PREFIX + path)) {
      throw new FileOpError('file_not_found', path, 'no such file');
    }
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
