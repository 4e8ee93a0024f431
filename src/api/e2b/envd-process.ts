/**
 * envd's `process.Process` service over Connect (docs/e2b.md, "Commands"): what
 * `sandbox.commands` calls. A translation of core's processes service (core/sandbox-processes.ts):
 *
 * - `Start` runs the command as the request's user (default `user`) with a stdin pipe unless
 *   `stdin` is false, and makes `Connect-Timeout-Ms` its lifetime: the guest kills it then,
 *   whether or not the client is still there, and the stream ends with `deadline_exceeded`;
 * - `Start` and `Connect` stream the `start` event first, then output, then one `end`; a client
 *   that goes away leaves the process running (`commands.connect` finds it again);
 * - `SendSignal` with SIGKILL ends everything the command started; `not_found` for a pid that
 *   does not run makes the SDK's `kill` answer false;
 * - PTYs are not offered: `Start` with `pty` and `Update` answer `unimplemented`.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { ProcessRun } from '../../core/sandbox-manager.js';
import { fail } from '../../errors.js';
import { ServerStream, sendUnary, streamRequest, unaryRequest } from './connect.js';
import type { E2bContext } from './context.js';
import {
  boolField,
  bytesField,
  endEvent,
  objectField,
  processInfo,
  selectorOf,
  stringField,
  stringMapField,
  userOf,
} from './envd-messages.js';

const SERVICE = '/process.Process';
const KEEPALIVE = { event: { keepalive: {} } };
/** Signal enum names (and numbers) envd accepts. */
const SIGNALS: Record<string, number> = {
  SIGNAL_SIGKILL: 9,
  SIGNAL_SIGTERM: 15,
  '9': 9,
  '15': 15,
};
const PTY_WHY = 'hostd runs commands with pipes, not terminals (docs/e2b.md)';

export function registerProcessRoutes(app: FastifyInstance, ctx: E2bContext): void {
  const { processes } = ctx.manager;
  const sandboxId = (req: FastifyRequest): string => ctx.sandboxOf(req)!.id;

  app.post(`${SERVICE}/Start`, async (req, reply) => {
    const stream = new ServerStream(req, reply, { keepalive: KEEPALIVE, what: 'the command' });
    if (!stream.open) return;
    try {
      const msg = streamRequest(req);
      if (msg.pty !== undefined && msg.pty !== null) throw fail('notSupported', 'PTY', PTY_WHY);
      const config = objectField(msg, 'process');
      if (!config) throw fail('invalidField', 'process', 'a process config', undefined);
      const args = config.args ?? [];
      if (!Array.isArray(args) || !args.every((a) => typeof a === 'string')) {
        throw fail('invalidField', 'process.args', 'a list of strings', args);
      }
      const cwd = stringField(config, 'cwd', false);
      const tag = stringField(msg, 'tag', false);
      const run = await processes.start(
        sandboxId(req),
        {
          cmd: stringField(config, 'cmd')!,
          args: args as string[],
          envs: stringMapField(config, 'envs'),
          ...(cwd !== undefined && cwd !== '' ? { cwd } : {}),
          user: userOf(req),
          // envd: absent or true keeps a stdin pipe open for SendInput and CloseStdin
          stdin: boolField(msg, 'stdin') ?? true,
          timeoutMs: stream.timeoutMs,
          ...(tag !== undefined ? { tag } : {}),
        },
        stream.signal,
      );
      await pump(stream, run, stream.timeoutMs);
    } catch (err) {
      stream.end(err);
    }
  });

  app.post(`${SERVICE}/Connect`, async (req, reply) => {
    const stream = new ServerStream(req, reply, { keepalive: KEEPALIVE, what: 'the connection' });
    if (!stream.open) return;
    try {
      const selector = selectorOf(streamRequest(req));
      const run = await processes.connect(sandboxId(req), selector, stream.signal);
      await pump(stream, run, 0);
    } catch (err) {
      stream.end(err);
    }
  });

  app.post(`${SERVICE}/List`, async (req, reply) => {
    unaryRequest(req);
    const list = await processes.list(sandboxId(req));
    return sendUnary(reply, { processes: list.map(processInfo) });
  });

  app.post(`${SERVICE}/SendInput`, async (req, reply) => {
    const msg = unaryRequest(req);
    const selector = selectorOf(msg);
    const input = objectField(msg, 'input');
    if (input?.pty !== undefined) throw fail('notSupported', 'PTY input', PTY_WHY);
    const data = input ? bytesField(input, 'stdin') : undefined;
    if (data === undefined)
      throw fail('notSupported', 'SendInput without stdin', 'nothing to send');
    await processes.sendInput(sandboxId(req), selector, data);
    return sendUnary(reply, {});
  });

  app.post(`${SERVICE}/CloseStdin`, async (req, reply) => {
    const selector = selectorOf(unaryRequest(req));
    await processes.closeStdin(sandboxId(req), selector);
    return sendUnary(reply, {});
  });

  app.post(`${SERVICE}/SendSignal`, async (req, reply) => {
    const msg = unaryRequest(req);
    const selector = selectorOf(msg);
    const signum = SIGNALS[String(msg.signal)];
    if (signum === undefined) {
      throw fail(
        'notSupported',
        `signal ${JSON.stringify(msg.signal)}`,
        'envd sends SIGKILL and SIGTERM only',
      );
    }
    await processes.signal(sandboxId(req), selector, signum);
    return sendUnary(reply, {});
  });

  app.post(`${SERVICE}/Update`, async (req) => {
    unaryRequest(req);
    throw fail('notSupported', 'resizing a PTY', PTY_WHY);
  });
}

/**
 * Streams a run: `start` first, then output, then its `end`. A command killed at its lifetime
 * ends the stream with `deadline_exceeded`, as envd's does.
 */
async function pump(stream: ServerStream, run: ProcessRun, timeoutMs: number): Promise<void> {
  const stop = (): void => run.detach();
  stream.signal.addEventListener('abort', stop, { once: true });
  try {
    await stream.send({ event: { start: { pid: run.pid } } });
    for await (const event of run) {
      if (event.type === 'end') {
        if (event.end.timedOut)
          return stream.end(fail('deadlineExceeded', 'the command', timeoutMs));
        await stream.send({ event: { end: endEvent(event.end) } });
        break;
      }
      await stream.send({ event: { data: { [event.type]: event.data.toString('base64') } } });
    }
    stream.end();
  } catch (err) {
    stream.end(err);
  } finally {
    stream.signal.removeEventListener('abort', stop);
    run.detach();
  }
}
