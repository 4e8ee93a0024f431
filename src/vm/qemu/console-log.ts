/**
 * A VM's guest console log (`vms/<vm>/console.log`): kernel and init messages, and whatever the
 * guest writes to /dev/console. QEMU sends the serial port to a socket and hostd writes the file
 * itself, so the file never holds more than its cap: when a write would pass it, the file is
 * rewritten with its last KEEP_BYTES first. (QEMU appending to the file while hostd truncated it
 * every 10 s let a flooding guest take it to 3 MiB between two truncations.)
 *
 * While hostd is not connected (it is restarting) QEMU drops what the guest writes (hostd
 * connects right after spawning QEMU, long before the guest runs, and the kernel prints its
 * earlier messages when its console starts); while hostd writes slower than the guest floods,
 * QEMU waits to send: the guest's serial port slows down, never hostd's memory grows.
 */
import { constants } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import type { Socket } from 'node:net';

/** A guest writing to its console without end must not fill host memory (tmpfs). */
export const CONSOLE_CAP_BYTES = 1024 * 1024;
/** What stays of the log when it reaches the cap: the last lines, which logTail() shows. */
export const KEEP_BYTES = 64 * 1024;
/** Read from the socket while a write runs, at most; beyond it reading pauses. */
const MAX_PENDING_BYTES = 256 * 1024;
/**
 * After reading, the socket rests this long: QEMU sends the console a byte per write, and
 * reading as they come cost hostd 17 ms of CPU per KiB of a flood (a wake-up, a read and a
 * write per few bytes). Meanwhile the bytes wait in the socket (QEMU waits when it is full).
 */
const REST_MS = 50;
/** How long logTail waits for the rest of what an exited QEMU sent. */
const LAST_WORDS_MS = 1000;

export class ConsoleLog {
  private size: number;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private writing: Promise<void> | null = null;
  private socket: Socket | null = null;
  private socketClosed: Promise<void> = Promise.resolve();
  private resting: NodeJS.Timeout | null = null;
  /** QEMU is gone: read what is left at once, without resting. */
  private hurry = false;
  private closed = false;
  /**
   * Why lines were lost, if they were: the file could not be written (the state directory's
   * tmpfs is full). The VM goes on; logTail says so.
   */
  lost: string | null = null;

  private constructor(
    private readonly file: FileHandle,
    size: number,
    private readonly cap: number,
  ) {
    this.size = size;
  }

  /**
   * Opens (or creates) the log at `path`, to go on where it is: a VM re-adopted after a restart
   * of hostd keeps its earlier lines. Refuses a link or anything but a regular file there: the
   * VM's directory is writable by QEMU's account, which must not make hostd write elsewhere.
   */
  static async open(path: string, cap = CONSOLE_CAP_BYTES): Promise<ConsoleLog> {
    const file = await open(
      path,
      constants.O_RDWR | constants.O_CREAT | constants.O_NOFOLLOW,
      0o600,
    );
    try {
      const st = await file.stat();
      if (!st.isFile()) throw new Error(`${path} is not a regular file`);
      return new ConsoleLog(file, st.size, cap);
    } catch (err) {
      await file.close();
      throw err;
    }
  }

  /** Writes what comes on `socket` (QEMU's console chardev) until it closes. */
  attach(socket: Socket): void {
    this.socket = socket;
    this.socketClosed = new Promise((resolve) => socket.once('close', () => resolve()));
    socket.on('readable', () => this.readAll());
    socket.on('error', () => undefined); // a reset is a close: QEMU is gone
  }

  /**
   * Resolves once everything read so far is in the file (logTail reads it then). With
   * `exited` (QEMU is gone), first reads what it sent before it went: a kernel's last words.
   */
  async flushed(exited = false): Promise<void> {
    if (exited && this.socket && !this.closed) {
      this.hurry = true;
      this.readAll();
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        this.socketClosed,
        new Promise((r) => (timer = setTimeout(r, LAST_WORDS_MS))),
      ]);
      clearTimeout(timer);
    }
    while (this.writing) await this.writing;
  }

  /** Stops reading, writes what was read, closes the file. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.resting) clearTimeout(this.resting);
    this.socket?.destroy();
    await this.flushed();
    await this.file.close();
  }

  /**
   * Takes what the socket holds, unless resting or behind on writing; after taking something
   * it rests (REST_MS), so that a flood is read in a few large pieces. An idle console costs
   * nothing: with nothing read there is no rest to end, and the next byte wakes it.
   */
  private readAll(): void {
    const socket = this.socket;
    if (!socket || this.closed || this.resting || this.pendingBytes >= MAX_PENDING_BYTES) return;
    let took = false;
    for (let chunk: Buffer | null; (chunk = socket.read() as Buffer | null) !== null;) {
      this.add(chunk);
      took = true;
    }
    if (took && !this.hurry) {
      this.resting = setTimeout(() => {
        this.resting = null;
        this.readAll();
      }, REST_MS);
      this.resting.unref();
    }
  }

  private add(chunk: Buffer): void {
    this.pending.push(chunk);
    this.pendingBytes += chunk.length;
    this.writing ??= this.drain().finally(() => {
      this.writing = null;
      this.readAll();
    });
  }

  private async drain(): Promise<void> {
    while (this.pending.length > 0) {
      let batch = Buffer.concat(this.pending);
      this.pending = [];
      this.pendingBytes = 0;
      const room = this.cap - KEEP_BYTES;
      if (batch.length > room) batch = batch.subarray(batch.length - room);
      try {
        if (this.size + batch.length > this.cap) await this.keepTail();
        await this.file.write(batch, 0, batch.length, this.size);
        this.size += batch.length;
      } catch (err) {
        this.lost = (err as NodeJS.ErrnoException).code ?? String(err);
      }
    }
  }

  /** Rewrites the file with its last KEEP_BYTES only. */
  private async keepTail(): Promise<void> {
    const keep = Math.min(KEEP_BYTES, this.size);
    const tail = Buffer.alloc(keep);
    const { bytesRead } = await this.file.read(tail, 0, keep, this.size - keep);
    await this.file.truncate(0);
    await this.file.write(tail, 0, bytesRead, 0);
    this.size = bytesRead;
  }
}
