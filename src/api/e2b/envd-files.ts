/**
 * envd's plain HTTP `/files` (docs/e2b.md, "Files"): `files.read` (`GET`) and `files.write`
 * (`POST`), and the URLs `uploadUrl()`/`downloadUrl()` sign.
 *
 * - As the `username` query parameter's user (default `user`): relative paths are that user's
 *   home's, and written files (and the directories made for them) are theirs.
 * - `POST` takes multipart/form-data, one or many `file` parts (each part's file name is its
 *   target path unless `?path=` names one for all), or a raw body (`application/octet-stream`,
 *   gzip with `Content-Encoding: gzip`) with `?path=`; files are written in place, one after
 *   the other, with the `X-Metadata-*` headers as their metadata. The answer lists them in order.
 * - Signed URLs carry no header at all: the sandbox is the running one whose access token
 *   reproduces `signature` (`v1_` + unpadded base64 of sha256 over
 *   `path:operation:user:token[:expiration]`), checked in constant time.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { posix } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { PassThrough, Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import busboy from 'busboy';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { fail, isError, toHostdError, type HostdError } from '../../errors.js';
import type { DataPlaneSandbox, E2bContext } from './context.js';
import { DEFAULT_USER } from './envd-messages.js';
import { clientGone } from './envd-filesystem.js';
import { e2bErrorBody } from './errors.js';

type Operation = 'read' | 'write';

interface FilesQuery {
  path?: string;
  username?: string;
  signature?: string;
  signature_expiration?: string;
}

/** envd's signature of a `/files` URL (E2B's SDK, sandbox/signature.ts). */
export function fileSignature(
  path: string,
  operation: Operation,
  user: string,
  token: string,
  expiration?: number,
): string {
  const raw = `${path}:${operation}:${user}:${token}${expiration !== undefined ? `:${expiration}` : ''}`;
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

function sameString(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

function queryOf(req: FastifyRequest): FilesQuery {
  const q = (req.query ?? {}) as Record<string, unknown>;
  const one = (name: keyof FilesQuery): string | undefined => {
    const v = q[name];
    const s = Array.isArray(v) ? v[0] : v;
    return typeof s === 'string' ? s : undefined;
  };
  return {
    path: one('path'),
    username: one('username'),
    signature: one('signature'),
    signature_expiration: one('signature_expiration'),
  };
}

/** The signature check: null when it holds for one of `tokens`, else why not. */
function signatureProblem(
  query: FilesQuery,
  operation: Operation,
  tokens: readonly string[],
): string | null {
  const signature = query.signature;
  if (signature === undefined || signature === '') {
    return 'missing signature query parameter';
  }
  let expiration: number | undefined;
  if (query.signature_expiration !== undefined && query.signature_expiration !== '') {
    expiration = Number(query.signature_expiration);
    if (!Number.isSafeInteger(expiration)) return 'invalid signature expiration';
  }
  const signed = (token: string): boolean =>
    sameString(
      fileSignature(query.path ?? '', operation, query.username ?? '', token, expiration),
      signature,
    );
  if (!tokens.some(signed)) return 'invalid signature';
  if (expiration !== undefined && expiration < Math.floor(Date.now() / 1000)) {
    return 'signature is already expired';
  }
  return null;
}

/**
 * The sandbox a `/files` request is for: the front's lookup when it sent the sandbox's headers
 * (with the token, or else a signature); for a signed URL fetched bare, the running sandbox
 * whose token reproduces its signature.
 */
function sandboxFor(ctx: E2bContext, req: FastifyRequest, operation: Operation): DataPlaneSandbox {
  const query = queryOf(req);
  const known = ctx.sandboxOf(req);
  if (known) {
    if (known.tokenChecked) return known;
    const why = signatureProblem(query, operation, known.accessTokens);
    if (why) throw fail('invalidSignature', why);
    return known;
  }
  if (query.signature === undefined || query.signature === '') {
    throw fail('invalidSignature', 'missing signature query parameter');
  }
  let why = 'invalid signature';
  for (const candidate of ctx.runningSandboxes()) {
    const problem = signatureProblem(query, operation, candidate.accessTokens);
    if (problem === null) return candidate;
    if (problem !== 'invalid signature') why = problem;
  }
  throw fail('invalidSignature', why);
}

/**
 * The id of the running sandbox of this node whose access token reproduces the signature of the
 * bare signed `/files` request `req` for `operation`, expired or not, or null when none does (in
 * cluster mode its URL may be another node's sandbox: cluster-hop.ts asks them, and the node it
 * is for answers, "signature is already expired" included).
 */
export function signedSandboxId(
  ctx: E2bContext,
  req: FastifyRequest,
  operation: 'read' | 'write',
): string | null {
  const query = queryOf(req);
  if (query.signature === undefined || query.signature === '') return null;
  const match = ctx.runningSandboxes().find((c) => {
    const problem = signatureProblem(query, operation, c.accessTokens);
    return problem === null || problem === 'signature is already expired';
  });
  return match?.id ?? null;
}

/**
 * envd's REST error, exactly as envd words it: `{code, message}` and nothing else (clients
 * compare the whole body, E2B's own signing tests among them). An unknown user is 401 there
 * ("error looking up user").
 */
function sendFilesError(reply: FastifyReply, err: unknown): FastifyReply {
  const e = toHostdError(err, reply.request.id);
  const { code, message } = e2bErrorBody(e);
  const status = isError(e, 'unknownUser') ? 401 : code;
  if (e.retryAfterS !== undefined) void reply.header('retry-after', String(e.retryAfterS));
  return reply.code(status).type('application/json').send({ code: status, message });
}

/** `X-Metadata-<key>: value` headers: keys lowercased, printable ASCII only (envd's rule). */
function metadataOf(req: FastifyRequest): Record<string, string> | undefined {
  const metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(req.headers)) {
    if (!name.startsWith('x-metadata-')) continue;
    const key = name.slice('x-metadata-'.length).toLowerCase();
    const value = Array.isArray(raw) ? raw.join(', ') : (raw ?? '');
    if (key === '' || !/^[\x20-\x7e]*$/.test(key) || !/^[\x20-\x7e]*$/.test(value)) {
      throw fail('invalidField', `X-Metadata-${key}`, 'printable ASCII', value);
    }
    metadata[key] = value;
  }
  return Object.keys(metadata).length ? metadata : undefined;
}

/** Keeps the connection until the sandbox stops, when the front did not (a bare signed URL). */
function watchStop(ctx: E2bContext, req: FastifyRequest, reply: FastifyReply, id: string): void {
  if (ctx.sandboxOf(req)) return;
  const unwatch = ctx.cutOnStop(id, req.raw.socket);
  reply.raw.once('close', unwatch);
}

export function registerFilesRoutes(app: FastifyInstance, ctx: E2bContext): void {
  const { files } = ctx.manager;
  const config = { e2bToken: 'access-or-signature' as const };

  app.get('/files', { config }, async (req, reply) => {
    try {
      const sandbox = sandboxFor(ctx, req, 'read');
      watchStop(ctx, req, reply, sandbox.id);
      const query = queryOf(req);
      if (query.path === undefined) throw fail('invalidField', 'path', 'a path', undefined);
      const user = query.username || DEFAULT_USER;
      const download = await files.readAs(sandbox.id, user, query.path, clientGone(reply));
      const name = posix.basename(query.path) || 'file';
      void reply
        .code(200)
        .header('content-type', 'application/octet-stream')
        .header('content-disposition', `inline; filename*=UTF-8''${encodeURIComponent(name)}`)
        .header('vary', 'Accept-Encoding');
      if (download.size !== null) void reply.header('content-length', String(download.size));
      return reply.send(download.stream);
    } catch (err) {
      return sendFilesError(reply, err);
    }
  });

  app.post('/files', { config }, async (req, reply) => {
    try {
      const sandbox = sandboxFor(ctx, req, 'write');
      watchStop(ctx, req, reply, sandbox.id);
      const query = queryOf(req);
      const user = query.username || DEFAULT_USER;
      const metadata = metadataOf(req);
      const signal = clientGone(reply);
      const write = async (path: string, body: Readable): Promise<Record<string, unknown>> => {
        const done = await files.writeAs(sandbox.id, user, path, body, signal, metadata);
        const info: Record<string, unknown> = {
          name: posix.basename(done.path),
          type: 'file',
          path: done.path,
        };
        if (done.metadata) info.metadata = done.metadata;
        return info;
      };
      const type = (req.headers['content-type'] ?? '').toLowerCase();
      const written = type.startsWith('multipart/form-data')
        ? await multipart(req, query.path, write)
        : [await raw(req, query.path, write)];
      return reply.code(200).type('application/json').send(written);
    } catch (err) {
      req.raw.resume(); // the rest of a refused body is read and dropped: the answer must go out
      return sendFilesError(reply, err);
    }
  });
}

/** A raw body (octet-stream, maybe gzip) written to `?path=`. */
async function raw(
  req: FastifyRequest,
  path: string | undefined,
  write: (path: string, body: Readable) => Promise<Record<string, unknown>>,
): Promise<Record<string, unknown>> {
  if (path === undefined || path === '') {
    throw fail('invalidField', 'path', 'given (a raw body upload needs ?path=)', undefined);
  }
  const encoding = String(req.headers['content-encoding'] ?? '').toLowerCase();
  if (encoding === 'gzip') {
    const gunzip = createGunzip();
    const body = new PassThrough();
    const flowing = pipeline(req.raw, gunzip, body).catch((err: unknown) => {
      body.destroy(err as Error);
    });
    try {
      return await write(path, body);
    } finally {
      await flowing;
    }
  }
  if (encoding !== '' && encoding !== 'identity') {
    throw fail('unsupportedMediaType', 'an upload without Content-Encoding, or gzip');
  }
  return write(path, req.raw);
}

/**
 * A multipart/form-data body: each `file` part written in turn (busboy hands the next part
 * only once the previous one was read), other fields ignored. Parts' file names are taken
 * whole (directories kept): they are the targets.
 */
function multipart(
  req: FastifyRequest,
  queryPath: string | undefined,
  write: (path: string, body: Readable) => Promise<Record<string, unknown>>,
): Promise<Record<string, unknown>[]> {
  return new Promise((resolve, reject) => {
    let parser: busboy.Busboy;
    try {
      parser = busboy({ headers: req.headers, preservePath: true });
    } catch (err) {
      reject(fail('malformedRequest', (err as Error).message));
      return;
    }
    const written: Record<string, unknown>[] = [];
    const seen = new Set<string>();
    let chain: Promise<void> = Promise.resolve();
    let failed: HostdError | null = null;
    const stop = (err: unknown): void => {
      if (failed) return;
      failed = toHostdError(err, req.id);
      req.raw.unpipe(parser);
      req.raw.resume();
      reject(failed);
    };
    // A `file` part without a file name (a form's plain text field) is content too, as envd
    // takes it: its target is `?path=`. busboy cuts text fields at 1 MiB: a longer one is
    // refused rather than written short
    parser.on('field', (field, value, info) => {
      if (field !== 'file') return;
      if (info.valueTruncated) {
        stop(fail('invalidField', 'file', 'a file part (a text field holds at most 1 MiB)', null));
        return;
      }
      take(Readable.from([Buffer.from(value)]), undefined);
    });
    parser.on('file', (field, stream, info) => {
      if (field !== 'file') {
        stream.resume();
        return;
      }
      take(stream, info.filename);
    });
    const take = (stream: Readable, filename: string | undefined): void => {
      if (failed) {
        stream.resume();
        return;
      }
      const target = queryPath || filename;
      if (!target) {
        stream.resume();
        stop(fail('invalidField', 'file', 'a part with a file name, or ?path=', filename));
        return;
      }
      if (seen.has(target)) {
        stream.resume();
        stop(fail('invalidField', 'file', 'parts with distinct paths', target));
        return;
      }
      seen.add(target);
      chain = chain.then(async () => {
        if (failed) return void stream.resume();
        try {
          written.push(await write(target, stream));
        } catch (err) {
          stream.resume();
          stop(err);
        }
      });
    };
    parser.on('error', (err: Error) => stop(fail('malformedRequest', err.message)));
    parser.on('close', () => {
      void chain.then(() => {
        if (failed) return;
        if (written.length === 0) {
          reject(fail('invalidField', 'file', 'at least one file part', undefined));
          return;
        }
        resolve(written);
      });
    });
    req.raw.pipe(parser);
  });
}
