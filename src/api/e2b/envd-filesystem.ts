/**
 * envd's `filesystem.Filesystem` service over Connect (docs/e2b.md, "Files"): what
 * `sandbox.files` calls besides reading and writing. Every call is made as the request's user
 * (default `user`): relative paths are that user's home's, what is made belongs to them
 * (core/sandbox-files.ts, "as a user").
 *
 * - `MakeDir` of a directory that exists is `already_exists` (the SDK's makeDir answers false);
 * - `ListDir` walks `depth` levels (0 counts as 1) in a pre-order walk sorted by name;
 * - `Remove` is rm -rf, and a missing path is no error;
 * - `WatchDir` streams `start` first, then one event per inotify event, until the client stops
 *   it or its `Connect-Timeout-Ms` passes; the polling watchers (`CreateWatcher`,
 *   `GetWatcherEvents`, `RemoveWatcher`, which E2B's Python SDK uses) keep the events of a
 *   watch until they are fetched.
 */
import { randomUUID } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { WatchEvent, WatchRun } from '../../core/sandbox-manager.js';
import { fail, type HostdError, toHostdError } from '../../errors.js';
import { ServerStream, sendUnary, streamRequest, unaryRequest } from './connect.js';
import type { E2bContext } from './context.js';
import {
  boolField,
  entryInfo,
  filesystemEvent,
  stringField,
  uintField,
  userOf,
} from './envd-messages.js';

const SERVICE = '/filesystem.Filesystem';
const KEEPALIVE = { keepalive: {} };
/** Events a polling watcher keeps until they are fetched; older ones are dropped beyond it. */
const WATCHER_BACKLOG = 10_000;

type Message = Record<string, unknown>;

export function registerFilesystemRoutes(app: FastifyInstance, ctx: E2bContext): void {
  const { files, processes } = ctx.manager;
  const sandboxId = (req: FastifyRequest): string => ctx.sandboxOf(req)!.id;
  const path = (msg: Message, name = 'path'): string => stringField(msg, name)!;

  app.post(`${SERVICE}/Stat`, async (req, reply) => {
    const msg = unaryRequest(req);
    const entry = await files.statAs(sandboxId(req), userOf(req), path(msg), clientGone(reply));
    return sendUnary(reply, { entry: entryInfo(entry) });
  });

  app.post(`${SERVICE}/MakeDir`, async (req, reply) => {
    const msg = unaryRequest(req);
    const made = await files.mkdirAs(sandboxId(req), userOf(req), path(msg), clientGone(reply));
    if (!made.created) throw fail('directoryExists', made.path);
    return sendUnary(reply, { entry: entryInfo(made.entry) });
  });

  app.post(`${SERVICE}/Move`, async (req, reply) => {
    const msg = unaryRequest(req);
    const moved = await files.move(
      sandboxId(req),
      path(msg, 'source'),
      path(msg, 'destination'),
      clientGone(reply),
      userOf(req),
    );
    return sendUnary(reply, { entry: entryInfo(moved.entry) });
  });

  app.post(`${SERVICE}/ListDir`, async (req, reply) => {
    const msg = unaryRequest(req);
    const depth = Math.max(1, uintField(msg, 'depth') ?? 1);
    const entries = await files.listAs(
      sandboxId(req),
      userOf(req),
      path(msg),
      depth,
      clientGone(reply),
    );
    return sendUnary(reply, { entries: entries.map(entryInfo) });
  });

  app.post(`${SERVICE}/Remove`, async (req, reply) => {
    const msg = unaryRequest(req);
    await files.removeAs(sandboxId(req), userOf(req), path(msg), clientGone(reply));
    return sendUnary(reply, {});
  });

  app.post(`${SERVICE}/WatchDir`, async (req, reply) => {
    const stream = new ServerStream(req, reply, { keepalive: KEEPALIVE, what: 'the watch' });
    if (!stream.open) return;
    let run: WatchRun | null = null;
    const stop = (): void => run?.detach();
    stream.signal.addEventListener('abort', stop, { once: true });
    try {
      const msg = streamRequest(req);
      const entries = boolField(msg, 'includeEntry') === true;
      run = await processes.watch(
        sandboxId(req),
        {
          path: path(msg),
          user: userOf(req),
          recursive: boolField(msg, 'recursive') === true,
          entries,
        },
        stream.signal,
      );
      if (stream.signal.aborted) run.detach();
      await stream.send({ start: {} });
      for await (const batch of run) {
        for (const event of batch)
          await stream.send({ filesystem: filesystemEvent(event, entries) });
      }
      stream.end();
    } catch (err) {
      stream.end(err);
    } finally {
      stream.signal.removeEventListener('abort', stop);
      run?.detach();
    }
  });

  const watchers = new Watchers();
  ctx.onSandboxStopped((id) => watchers.dropSandbox(id));

  app.post(`${SERVICE}/CreateWatcher`, async (req, reply) => {
    const msg = unaryRequest(req);
    const entries = boolField(msg, 'includeEntry') === true;
    const id = sandboxId(req);
    const run = await processes.watch(id, {
      path: path(msg),
      user: userOf(req),
      recursive: boolField(msg, 'recursive') === true,
      entries,
    });
    return sendUnary(reply, { watcherId: watchers.add(id, run, entries) });
  });

  app.post(`${SERVICE}/GetWatcherEvents`, async (req, reply) => {
    const msg = unaryRequest(req);
    const events = watchers.take(sandboxId(req), stringField(msg, 'watcherId')!);
    return sendUnary(reply, { events });
  });

  app.post(`${SERVICE}/RemoveWatcher`, async (req, reply) => {
    const msg = unaryRequest(req);
    watchers.remove(sandboxId(req), stringField(msg, 'watcherId')!);
    return sendUnary(reply, {});
  });
}

/** Aborts when the client went away before its answer (an operation stops waiting its turn). */
export function clientGone(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) controller.abort();
  });
  return controller.signal;
}

interface Watcher {
  readonly sandbox: string;
  readonly run: WatchRun;
  readonly entries: boolean;
  events: Message[];
  failure: HostdError | null;
}

/** Polling watchers: each drains its watch into a backlog that GetWatcherEvents empties. */
class Watchers {
  private readonly byId = new Map<string, Watcher>();

  add(sandbox: string, run: WatchRun, entries: boolean): string {
    const id = randomUUID();
    const watcher: Watcher = { sandbox, run, entries, events: [], failure: null };
    this.byId.set(id, watcher);
    void this.drain(watcher);
    return id;
  }

  take(sandbox: string, id: string): Message[] {
    const watcher = this.get(sandbox, id);
    if (watcher.failure) {
      this.remove(sandbox, id);
      throw watcher.failure;
    }
    const events = watcher.events;
    watcher.events = [];
    return events;
  }

  remove(sandbox: string, id: string): void {
    const watcher = this.get(sandbox, id);
    this.byId.delete(id);
    watcher.run.detach();
  }

  dropSandbox(sandbox: string): void {
    for (const [id, w] of this.byId) {
      if (w.sandbox === sandbox) {
        this.byId.delete(id);
        w.run.detach();
      }
    }
  }

  private get(sandbox: string, id: string): Watcher {
    const watcher = this.byId.get(id);
    if (!watcher || watcher.sandbox !== sandbox) throw fail('watcherNotFound', id);
    return watcher;
  }

  private async drain(watcher: Watcher): Promise<void> {
    try {
      for await (const batch of watcher.run) {
        watcher.events.push(...batch.map((e: WatchEvent) => filesystemEvent(e, watcher.entries)));
        if (watcher.events.length > WATCHER_BACKLOG) {
          watcher.events.splice(0, watcher.events.length - WATCHER_BACKLOG);
        }
      }
    } catch (err) {
      watcher.failure = toHostdError(err, `watcher of ${watcher.sandbox}`);
    }
  }
}
