/**
 * Files: reading and writing a sandbox's files without code (docs/api.md, Files). Bodies stream
 * both ways: uploads are not parsed (the JSON body limit does not apply, SERVICE_MAX_FILE_BYTES
 * does) and downloads are piped from the guest as they come.
 */
import type { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { FileDownload, SandboxManager } from '../../core/sandbox-manager.js';
import { fail } from '../../errors.js';
import { parseFileMode, parseFlag, parseGuestPath, parseNoBody } from '../validate.js';

type IdParams = { id: string };
type FileQuery = {
  path?: unknown;
  mode?: unknown;
  format?: unknown;
  recursive?: unknown;
  to?: unknown;
};
type FileRequest = FastifyRequest<{ Params: IdParams; Querystring: FileQuery }>;

const TAR = 'application/x-tar';
/** The upload route: the server's pre-body check applies SERVICE_MAX_FILE_BYTES to it. */
export const UPLOAD_ROUTE = '/v1/sandboxes/:id/files';

export function registerFileRoutes(app: FastifyInstance, manager: SandboxManager): void {
  const { files } = manager;

  app.put<{ Params: IdParams; Querystring: FileQuery }>(UPLOAD_ROUTE, async (req, reply) => {
    const path = parseGuestPath(req.query.path);
    const body = uploadBody(req);
    const signal = clientGone(reply);
    if (isTar(req)) return files.extract(req.params.id, path, body, signal);
    const mode = parseFileMode(req.query.mode);
    return files.write(req.params.id, path, mode, body, signal);
  });

  app.get<{ Params: IdParams; Querystring: FileQuery }>(UPLOAD_ROUTE, async (req, reply) => {
    const path = parseGuestPath(req.query.path);
    const format = req.query.format;
    if (format !== undefined && format !== 'tar' && format !== 'raw') {
      throw fail('invalidField', 'format', '"tar" or "raw"', format);
    }
    const signal = clientGone(reply);
    if (format === 'tar') {
      return sendDownload(reply, await files.tar(req.params.id, path, signal), TAR);
    }
    return sendDownload(
      reply,
      await files.read(req.params.id, path, signal),
      'application/octet-stream',
    );
  });

  app.get<{ Params: IdParams; Querystring: FileQuery }>(
    '/v1/sandboxes/:id/files/list',
    async (req, reply) => ({
      entries: await files.list(req.params.id, parseGuestPath(req.query.path), clientGone(reply)),
    }),
  );

  app.get<{ Params: IdParams; Querystring: FileQuery }>(
    '/v1/sandboxes/:id/files/stat',
    (req, reply) => files.stat(req.params.id, parseGuestPath(req.query.path), clientGone(reply)),
  );

  app.post<{ Params: IdParams; Querystring: FileQuery }>(
    '/v1/sandboxes/:id/files/mkdir',
    async (req, reply) => {
      parseNoBody(req.body, 'mkdir');
      const path = parseGuestPath(req.query.path);
      return { path: await files.mkdir(req.params.id, path, clientGone(reply)) };
    },
  );

  app.post<{ Params: IdParams; Querystring: FileQuery }>(
    '/v1/sandboxes/:id/files/move',
    async (req, reply) => {
      parseNoBody(req.body, 'move');
      const from = parseGuestPath(req.query.path);
      const to = parseGuestPath(req.query.to, 'to');
      const moved = await files.move(req.params.id, from, to, clientGone(reply));
      return { path: moved.path };
    },
  );

  app.delete<{ Params: IdParams; Querystring: FileQuery }>(UPLOAD_ROUTE, async (req, reply) => {
    parseNoBody(req.body, 'delete');
    const path = parseGuestPath(req.query.path);
    const recursive = parseFlag(req.query.recursive, 'recursive');
    await files.remove(req.params.id, path, recursive, clientGone(reply));
    return reply.code(204).send();
  });
}

/**
 * Upload bodies are taken as they come, whatever their type (octet-stream is the default; tar
 * is told by its Content-Type): the request stream itself becomes the body.
 */
export function rawBodyParser(app: FastifyInstance): void {
  app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));
}

function isTar(req: FileRequest): boolean {
  return (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase() === TAR;
}

/** The request's body stream; a request without a body uploads an empty file. */
function uploadBody(req: FileRequest): Readable {
  const body = req.body as Readable | undefined;
  return body && typeof body.pipe === 'function' ? body : req.raw;
}

/** Aborts when the client goes away before the answer is complete: the transfer stops. */
export function clientGone(reply: FastifyReply): AbortSignal {
  const abort = new AbortController();
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) abort.abort();
  });
  return abort.signal;
}

function sendDownload(reply: FastifyReply, download: FileDownload, type: string): FastifyReply {
  reply.type(type).header('cache-control', 'no-store');
  if (download.size !== null) reply.header('content-length', download.size);
  return reply.send(download.stream);
}
