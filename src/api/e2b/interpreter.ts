/**
 * The code interpreter (docs/e2b.md, Code interpreter): E2B's `POST /execute` and `/contexts`,
 * on `E2b-Sandbox-Port: 49999`. Nothing here runs code itself: `/execute` is a native notebook
 * exec (docs/api.md, Notebook mode) in a REPL context (Contexts), its events renamed into
 * E2B's lines (interpreter-lines.ts); `/contexts` are the native context requests.
 *
 * E2B's default Python context is the REPL context `python`, made the first time a sandbox
 * needs it, in `/home/user` as E2B's kernels are (the REPL's own `default` context stays the
 * native API's and is not listed here). The front's hook has found and authorized the sandbox
 * before a route runs (server.ts, policy `traffic`).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ExecRun } from '../../core/exec-run.js';
import { fail, isError, toHostdError, type HostdError } from '../../errors.js';
import { clientGone } from '../routes/files.js';
import { CONTEXT_ID, optionalEnv, parseContextCreate } from '../validate.js';
import type { E2bContext } from './context.js';
import { e2bLines, reasonPhrase, type E2bLine } from './interpreter-lines.js';

/** The REPL context that is E2B's default Python context. */
export const PYTHON_CONTEXT = 'python';
/** Where E2B's kernels run (the `user` account's home, in every template). */
const HOME = '/home/user';
/** E2B's server writes a keepalive line after this much silence. */
const KEEPALIVE_MS = 5_000;
/**
 * An exec waiting for its sandbox's turn sends its headers after this long anyway: the SDKs
 * give up on headers after `requestTimeoutMs` (60 s), E2B answers 200 at once, and a cell queued
 * behind another may wait longer than that.
 */
const QUEUED_HEADERS_MS = 10_000;

type ContextParams = { context: string };

interface ExecuteBody {
  code: string;
  context?: string;
  /** Normalized: `python`, `bash`, `javascript`, ... */
  language: string;
  env?: Record<string, string>;
}

/** `/execute`'s body, as E2B's server reads it (unknown fields are ignored there too). */
function parseExecute(body: unknown): ExecuteBody {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw fail('bodyNotObject', 'the body');
  }
  const b = body as Record<string, unknown>;
  if (typeof b.code !== 'string') throw fail('invalidField', 'code', 'a string (required)', b.code);
  const contextId = b.context_id ?? undefined;
  const language = b.language ?? undefined;
  if (contextId !== undefined && language !== undefined) {
    throw fail('conflictingFields', 'context_id', 'language');
  }
  if (contextId !== undefined && typeof contextId !== 'string') {
    throw fail('invalidField', 'context_id', 'a string', contextId);
  }
  if (language !== undefined && typeof language !== 'string') {
    throw fail('invalidField', 'language', 'a string', language);
  }
  const env = optionalEnv({ env_vars: b.env_vars }, 'env_vars');
  return {
    code: b.code,
    language: normalizeLanguage(language),
    ...(contextId === undefined ? {} : { context: contextId }),
    ...(env === undefined ? {} : { env }),
  };
}

/** E2B's rule: trimmed, lowercased, empty is python, `js` and `ts` are their long names. */
function normalizeLanguage(language: string | undefined): string {
  const l = (language ?? '').trim().toLowerCase();
  if (l === '' || l === 'python') return 'python';
  if (l === 'js') return 'javascript';
  if (l === 'ts') return 'typescript';
  return l;
}

function unsupported(language: string): HostdError {
  return fail(
    'notSupported',
    `the ${language} language`,
    "hostd's code interpreter runs python (in contexts) and bash",
  );
}

/** A context id E2B may send; one that cannot be a REPL context is simply not found. */
function contextId(sandbox: string, context: string): string {
  // `default` is the native API's context, not one of E2B's
  if (!CONTEXT_ID.test(context) || context === 'default') {
    throw fail('contextNotFound', sandbox, context);
  }
  return context;
}

const isCwdError = (err: unknown): boolean =>
  isError(err, 'invalidField') && (err as HostdError).params[0] === 'cwd';

/** E2B's `Context`. */
function e2bContext(c: { id: string; cwd: string }): { id: string; language: string; cwd: string } {
  return { id: c.id, language: 'python', cwd: c.cwd };
}

/** The `message` of an E2B error body, if `payload` is one. */
function errorMessage(payload: string): string | undefined {
  try {
    const body = JSON.parse(payload) as unknown;
    if (typeof body !== 'object' || body === null) return undefined;
    const { message } = body as { message?: unknown };
    return typeof message === 'string' && message !== '' ? message : undefined;
  } catch {
    return undefined;
  }
}

export function registerInterpreterRoutes(app: FastifyInstance, ctx: E2bContext): void {
  const { manager } = ctx;

  // The code interpreter SDKs read the body of a 404 or 502 only; any other error becomes
  // `SandboxError("<status> <reason>")`. The reason phrase carries the error's message, so that
  // `language: 'js'` says why it is refused instead of "501 Not Implemented".
  app.addHook('onSend', async (_req, reply, payload) => {
    if (reply.statusCode >= 400 && typeof payload === 'string') {
      const message = errorMessage(payload);
      if (message !== undefined) reply.raw.statusMessage = reasonPhrase(message);
    }
    return payload;
  });
  const sandboxOf = (req: FastifyRequest): string => ctx.sandboxOf(req)!.id;

  /**
   * Creates a context in `/home/user` (or `cwd`); in the REPL's directory when the template has
   * no such home (one built before the `user` account).
   */
  const createIn = async (
    id: string,
    context: string | undefined,
    cwd: string | undefined,
    signal: AbortSignal,
  ) => {
    const options = context === undefined ? {} : { context };
    try {
      return await manager.contexts.create(id, { ...options, cwd: cwd ?? HOME }, signal);
    } catch (err) {
      if (cwd !== undefined || !isCwdError(err)) throw err;
      return manager.contexts.create(id, options, signal);
    }
  };

  /** Makes E2B's default Python context unless the sandbox has it. */
  const ensurePython = async (id: string, signal: AbortSignal): Promise<void> => {
    try {
      await createIn(id, PYTHON_CONTEXT, undefined, signal);
    } catch (err) {
      if (!isError(err, 'contextExists')) throw err;
    }
  };

  app.post('/execute', async (req, reply) => {
    const id = sandboxOf(req);
    const body = parseExecute(req.body);
    if (body.language !== 'python' && body.language !== 'bash') throw unsupported(body.language);
    const abort = new AbortController();
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) abort.abort();
    });
    const stream = new LineStream(reply);
    const early = setTimeout(() => stream.open(), QUEUED_HEADERS_MS);
    try {
      let run: ExecRun;
      if (body.language === 'bash') {
        // A fresh bash each time (E2B keeps one bash kernel: docs/e2b.md says how this differs)
        run = await manager.exec(id, {
          language: 'bash',
          code: body.code,
          cwd: HOME,
          ...(body.env ? { env: body.env } : {}),
          signal: abort.signal,
        });
      } else {
        const context = body.context === undefined ? PYTHON_CONTEXT : contextId(id, body.context);
        const cell = (): Promise<ExecRun> =>
          manager.exec(id, {
            language: 'python',
            code: body.code,
            context,
            notebook: true,
            ...(body.env ? { env: body.env } : {}),
            signal: abort.signal,
          });
        run = await cell();
        try {
          await run.started;
        } catch (err) {
          // The default context is made on first use; any other one must exist
          if (context !== PYTHON_CONTEXT || !isError(err, 'contextNotFound')) throw err;
          await ensurePython(id, abort.signal);
          run = await cell();
          await run.started;
        }
      }
      clearTimeout(early);
      await stream.pipe(run, req);
    } catch (err) {
      clearTimeout(early);
      if (!stream.opened) throw err; // not streaming yet: E2B's error answer
      stream.fail(toHostdError(err, req.id));
    }
  });

  app.post('/contexts', async (req, reply) => {
    const id = sandboxOf(req);
    const b = (req.body ?? {}) as Record<string, unknown>;
    const language = normalizeLanguage(typeof b.language === 'string' ? b.language : undefined);
    if (language !== 'python') throw unsupported(language);
    const { cwd } = parseContextCreate(b.cwd === undefined || b.cwd === null ? {} : { cwd: b.cwd });
    const signal = clientGone(reply);
    // The default one first, so that E2B's order holds: defaults, then the user's, newest last
    await ensurePython(id, signal);
    return e2bContext(await createIn(id, undefined, cwd, signal));
  });

  app.get('/contexts', async (req, reply) => {
    const id = sandboxOf(req);
    const signal = clientGone(reply);
    await ensurePython(id, signal);
    const contexts = await manager.contexts.list(id, signal);
    return contexts.filter((c) => c.id !== 'default').map(e2bContext);
  });

  app.delete<{ Params: ContextParams }>('/contexts/:context', async (req, reply) => {
    const id = sandboxOf(req);
    await manager.contexts.delete(id, contextId(id, req.params.context), clientGone(reply));
    return reply.code(200).type('application/json').send('null');
  });

  app.post<{ Params: ContextParams }>('/contexts/:context/restart', async (req, reply) => {
    const id = sandboxOf(req);
    await manager.contexts.restart(id, contextId(id, req.params.context), clientGone(reply));
    return reply.code(200).type('application/json').send('null');
  });

  // E2B's server answers this on its own port; the SDKs ask envd's, but scripts in a sandbox
  // and health checks ask this one.
  app.get('/health', { config: { e2bToken: 'none' } }, async (_req, reply) =>
    reply.code(200).type('application/json').send('"OK"'),
  );
}

/**
 * `/execute`'s answer: 200 and NDJSON lines, each flushed as it is written, a keepalive after
 * 5 s of silence, `end_of_execution` last. Slow clients hold the exec back (the native stream's
 * backpressure).
 */
class LineStream {
  opened = false;
  private lastWrite = Date.now();
  private keepalive: NodeJS.Timeout | undefined;

  constructor(private readonly reply: FastifyReply) {}

  /** Sends the status and headers (once). */
  open(): void {
    if (this.opened) return;
    this.opened = true;
    this.reply.hijack();
    const res = this.reply.raw;
    res.socket?.setNoDelay(true);
    res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
    res.flushHeaders();
    this.keepalive = setInterval(() => {
      if (Date.now() - this.lastWrite >= KEEPALIVE_MS) void this.write({ type: 'keepalive' });
    }, KEEPALIVE_MS).unref();
  }

  /** Writes the exec's events as E2B's lines, then ends the answer. */
  async pipe(run: ExecRun, req: FastifyRequest): Promise<void> {
    this.open();
    try {
      for await (const event of run) {
        if (this.reply.raw.destroyed) break;
        for (const line of e2bLines(event)) await this.write(line);
      }
    } catch (err) {
      req.log.error({ err }, 'execute stream failed');
    } finally {
      run.discard();
      this.end();
    }
  }

  /** A failure once the answer is streaming: an error line, as E2B reports a lost kernel. */
  fail(err: HostdError): void {
    void this.write({ type: 'error', name: err.code, value: err.message, traceback: '' });
    this.end();
  }

  private end(): void {
    clearInterval(this.keepalive);
    const res = this.reply.raw;
    if (res.destroyed || res.writableEnded) return;
    res.end(JSON.stringify({ type: 'end_of_execution' }) + '\n');
  }

  private async write(line: E2bLine): Promise<void> {
    const res = this.reply.raw;
    if (res.destroyed || res.writableEnded) return;
    this.lastWrite = Date.now();
    if (res.write(JSON.stringify(line) + '\n')) return;
    await new Promise<void>((resolve) => {
      const done = (): void => {
        res.off('drain', done);
        res.off('close', done);
        resolve();
      };
      res.on('drain', done);
      res.on('close', done);
    });
  }
}
