/**
 * The E2B front in cluster mode (docs/cluster.md, docs/e2b.md "Cluster mode"): a request on any
 * node's E2B port for a sandbox another node holds is passed, one hop, to that node's E2B front
 * (its record's `e2b_url`) by the native API's forwarder (api/forward.ts): streamed both ways,
 * with its `X-API-KEY` or sandbox token, `traceparent` and the answer's error body as they are.
 * The node that holds the sandbox authorizes the request: sandbox tokens are HMACs under each
 * node's own secret, so only it can check them.
 *
 * Which sandbox a request names: the control plane's routes say it in the path
 * (`/sandboxes/:id/...`, `/v2/sandboxes/:id/connect`; `DELETE /templates/snap_...` names a
 * snapshot), sandbox traffic (envd, the code interpreter) in `E2b-Sandbox-Id`. A signed
 * `/files` URL fetched bare names none: the other nodes are asked whose signature it is. What
 * names nothing else (creates, lists) is answered here: control.ts places and gathers them.
 */
import type { ServerResponse } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { NodeRecord } from '../../core/cluster/records.js';
import { fail, isError, toHostdError, type HostdError } from '../../errors.js';
import { ClusterFront } from '../cluster-front.js';
import type { Target } from '../forward.js';
import { connectErrorJson, CONNECT_STATUS, e2bErrorBody, e2bStatus } from './errors.js';

/** What an E2B request names, so that the node holding it answers. */
export type E2bSubject =
  | { readonly kind: 'sandbox'; readonly id: string; readonly isDelete: boolean }
  | { readonly kind: 'snapshot'; readonly id: string };

/**
 * The sandbox or snapshot a request names, from its route (fastify's pattern), params and
 * `E2b-Sandbox-Id` header; null when it names none (answered by the node that received it).
 */
export function e2bSubject(
  kind: 'control' | 'data',
  method: string,
  route: string | undefined,
  params: Record<string, string | undefined>,
  sandboxHeader: string | undefined,
): E2bSubject | null {
  if (kind === 'data') {
    return sandboxHeader ? { kind: 'sandbox', id: sandboxHeader, isDelete: false } : null;
  }
  if (route === undefined) return null;
  const id = params.id;
  if (id === undefined || id === '') return null;
  if (route.startsWith('/sandboxes/:id') || route.startsWith('/v2/sandboxes/:id')) {
    return { kind: 'sandbox', id, isDelete: method === 'DELETE' && route === '/sandboxes/:id' };
  }
  if (route === '/templates/:id' && method === 'DELETE' && id.startsWith('snap_')) {
    return { kind: 'snapshot', id };
  }
  return null;
}

/**
 * E2B's control-plane routes that resume a paused sandbox (`connect`, the older `resume`): a
 * paused sandbox its node has no room for moves to a node with room first (docs/cluster.md), as
 * for the native API's resumes. Its traffic (envd, the interpreter) moves the same way when it
 * would resume it (E2BHopOptions.trafficMoves: a token of the cluster's, which the new node
 * accepts too); else it resumes where it is.
 */
const RESUMING_ROUTES = new Set([
  '/sandboxes/:id/connect',
  '/v2/sandboxes/:id/connect',
  '/sandboxes/:id/resume',
]);

/** True when this request is one of E2B's resumes (`RESUMING_ROUTES`). */
export function e2bResumes(
  kind: 'control' | 'data',
  method: string,
  route: string | undefined,
): boolean {
  return (
    kind === 'control' && method === 'POST' && route !== undefined && RESUMING_ROUTES.has(route)
  );
}

/**
 * The error for `what` (`sandbox <id>`, `snapshot <id>`) held by `node`, whose record names no
 * E2B front: it cannot be forwarded to. Written once, for every E2B route that forwards.
 */
export function noE2bFront(what: string, node: string): HostdError {
  return fail('nodeUnavailable', what, `${node} (it serves no E2B front)`);
}

/** A node's E2B front as a forwarding target, or null when the node has none. */
export function e2bTarget(node: NodeRecord): Target | null {
  return node.e2b_url ? { id: node.id, url: node.e2b_url } : null;
}

/**
 * Where peers reach the front that listens at `listening` (its address as fastify gave it):
 * that address, unless it binds every address, then the host of SERVICE_NODE_URL (`nodeUrl`)
 * with the front's port.
 */
export function peerE2bUrl(listening: string, nodeUrl: string): string {
  const own = new URL(listening);
  if (!['0.0.0.0', '[::]', '::', ''].includes(own.hostname)) return own.origin;
  const node = new URL(nodeUrl);
  node.port = own.port;
  return node.origin;
}

/**
 * A data-plane error for a sandbox the catalog knows is gone: lost with its node, E2B's proxy
 * says "not found" with a 502, as it does for a sandbox of this node that failed.
 */
function dataPlaneError(err: HostdError, id: string): HostdError {
  return err.code === 'sandbox_lost' ? fail('sandboxNotRunning', id) : err;
}

/** An E2B error on a raw response (the forwarder's, once the reply is hijacked). */
function writeE2bError(res: ServerResponse, err: HostdError, connect: boolean): void {
  let status: number;
  let body: unknown;
  if (connect) {
    const json = connectErrorJson(err, '');
    status = isError(err, 'sandboxNotRunning') ? 502 : CONNECT_STATUS[json.code];
    body = json;
  } else {
    status = e2bStatus(err);
    body = e2bErrorBody(err);
  }
  const text = JSON.stringify(body);
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'content-length': String(Buffer.byteLength(text)),
  };
  if (err.retryAfterS !== undefined) headers['retry-after'] = String(err.retryAfterS);
  res.writeHead(status, headers);
  res.end(text);
}

export interface E2bHopOptions {
  /** `control` or `data` for this request (server.ts's kinds). */
  kindOf(req: FastifyRequest): 'control' | 'data';
  /** The control plane's key check: a request without a valid key is answered here. */
  checkKey(req: FastifyRequest): HostdError | null;
  /** True when this request's errors are Connect's (envd's RPCs). */
  isConnect(req: FastifyRequest): boolean;
  /** Sends an error in the request's shape (before any hijack). */
  sendError(req: FastifyRequest, reply: FastifyReply, err: HostdError): FastifyReply;
  /** Reads and discards the request's body (answering before it was read). */
  drain(req: FastifyRequest): void;
  /** The local sandbox a bare signed `/files` URL is for (envd-files.ts), or null. */
  signedSandboxId(req: FastifyRequest, operation: 'read' | 'write'): string | null;
  /**
   * Whether this data-plane request for sandbox `id` (held here) may move it to a node with
   * room before it resumes it: E2B lets it through (the sandbox runs as E2B sees it, or was
   * paused with `autoResume`) and its token is one of the cluster's, which the new node accepts
   * too (a token of this node's own older secret opens its traffic here only: it stays).
   */
  trafficMoves(req: FastifyRequest, id: string): boolean;
}

/**
 * Asked of a node as `GET` with a bare signed `/files` URL's query, this header saying the
 * operation signed (`read`, `write`): `200` when the signature is one of its running sandboxes',
 * else `404`. Only hop-marked requests are probes.
 */
const PROBE_HEADER = 'x-hostd-signature-probe';

/** A header's value as one string (its first when repeated), or undefined. */
function headerValue(header: string | string[] | undefined): string | undefined {
  return Array.isArray(header) ? header[0] : header;
}

/** A bare signed `/files` URL: envd's, with a signature and no sandbox header. */
function isBareSigned(req: FastifyRequest, kind: 'control' | 'data', header: unknown): boolean {
  if (kind !== 'data' || (header !== undefined && header !== '')) return false;
  if (req.method !== 'GET' && req.method !== 'POST') return false;
  return (req.url.split('?')[0] ?? '') === '/files' && /[?&]signature=/.test(req.url);
}

/**
 * Installs the hop as the E2B front's first `onRequest` hook (before any scope's auth and
 * sandbox lookup, which would answer 502 for a sandbox held elsewhere).
 */
export function installE2bHop(
  app: FastifyInstance,
  front: ClusterFront,
  opts: E2bHopOptions,
): void {
  /**
   * The node holding the sandbox a bare signed `/files` URL is for, when it is not this node:
   * such a URL names no sandbox (the SDKs sign it with the sandbox's token and drop its id), so
   * every other node is asked whether the signature is one of its sandboxes'.
   */
  const signedElsewhere = async (req: FastifyRequest): Promise<Target | null> => {
    const operation = req.method === 'POST' ? 'write' : 'read';
    if (opts.signedSandboxId(req, operation) !== null) return null;
    const asks = front.node.otherNodes().map(async (node) => {
      const target = e2bTarget(node);
      if (target === null) throw new Error('no E2B front');
      const headers = { ...req.headers, [PROBE_HEADER]: operation };
      const a = await front.forwarder.ask(
        { method: 'GET', url: req.url, headers },
        target,
        undefined,
        10_000,
      );
      if (a.status !== 200) throw new Error(`not ${node.id}'s`);
      return target;
    });
    return Promise.any(asks).catch(() => null);
  };

  /**
   * A resume of sandbox `id` held here: when it is paused and this node has no room to resume
   * it, it is handed to a node with room (ClusterFront.moveToRoom) and the request passed to
   * that node's front; else (room here, no node with room, a hand-over that failed) it is
   * answered here, as before. A request without a valid key is answered here, moving nothing.
   */
  const moveFirst = async (
    req: FastifyRequest,
    reply: FastifyReply,
  ): Promise<FastifyReply | undefined> => {
    if (opts.checkKey(req) !== null) return; // the control plane's own hook answers 401
    const id = (req.params as Record<string, string | undefined>).id ?? '';
    return moveThen(req, reply, id);
  };

  /**
   * Its traffic, when it would resume sandbox `id` held here: moved first as by `connect`
   * (moveFirst), the request then passed to the new node's front with its token and sandbox
   * header as they are. A request E2B would refuse (bad token, paused without `autoResume`) is
   * answered here, moving nothing.
   */
  const trafficMoveFirst = async (
    req: FastifyRequest,
    reply: FastifyReply,
    id: string,
  ): Promise<FastifyReply | undefined> => {
    // Most traffic is for a sandbox that runs, or one with room: nothing to check further.
    if (!front.wantsRoom(id) || !opts.trafficMoves(req, id)) return;
    return moveThen(req, reply, id);
  };

  const moveThen = async (
    req: FastifyRequest,
    reply: FastifyReply,
    id: string,
  ): Promise<FastifyReply | undefined> => {
    let target: Target | null;
    try {
      const moved = await front.moveToRoom(id);
      if (moved === null) return;
      target = e2bTarget(moved);
      if (target === null) throw noE2bFront(`sandbox ${id}`, moved.id);
    } catch (err) {
      opts.drain(req);
      return opts.sendError(req, reply, toHostdError(err, req.id));
    }
    reply.hijack();
    const connect = opts.isConnect(req);
    await front.forwarder.pass(req.raw, reply.raw, target, (res, err) =>
      writeE2bError(res, err, connect),
    );
    return undefined;
  };

  app.addHook('onRequest', async (req, reply) => {
    const kind = opts.kindOf(req);
    const sandboxHeader = req.headers['e2b-sandbox-id'];
    if (ClusterFront.forwarded(req)) {
      // The sandbox's node: a resume of one paused here without room goes where there is room.
      if (e2bResumes(kind, req.method, req.routeOptions.url)) return moveFirst(req, reply);
      const traffic = kind === 'data' ? headerValue(sandboxHeader) : undefined;
      if (traffic) return trafficMoveFirst(req, reply, traffic);
      const probe = req.headers[PROBE_HEADER];
      if (probe === undefined || !isBareSigned(req, kind, sandboxHeader)) return;
      opts.drain(req);
      const found = opts.signedSandboxId(req, probe === 'write' ? 'write' : 'read');
      return reply.code(found === null ? 404 : 200).send();
    }
    if (isBareSigned(req, kind, sandboxHeader)) {
      const target = await signedElsewhere(req);
      if (target === null) return; // this node's, or nobody's: answered here (401 for nobody's)
      reply.hijack();
      await front.forwarder.pass(req.raw, reply.raw, target, (res, err) =>
        writeE2bError(res, err, false),
      );
      return;
    }
    const subject = e2bSubject(
      kind,
      req.method,
      req.routeOptions.url,
      (req.params ?? {}) as Record<string, string | undefined>,
      Array.isArray(sandboxHeader) ? sandboxHeader[0] : sandboxHeader,
    );
    if (subject === null) return;
    let target: Target | null;
    try {
      if (kind === 'control') {
        const denied = opts.checkKey(req);
        if (denied) throw denied;
      }
      const route =
        subject.kind === 'sandbox'
          ? await front.locate(subject.id, subject.isDelete, `${req.method} ${req.url}`)
          : await front.node.locateSnapshot(subject.id, true); // only its delete names one
      if (route === 'deleted') {
        opts.drain(req);
        return reply.code(204).send();
      }
      if (route.local) {
        if (subject.kind === 'sandbox' && e2bResumes(kind, req.method, req.routeOptions.url)) {
          return await moveFirst(req, reply);
        }
        if (subject.kind === 'sandbox' && kind === 'data') {
          return await trafficMoveFirst(req, reply, subject.id);
        }
        return;
      }
      target = e2bTarget(route.node);
      if (target === null) {
        throw noE2bFront(`${subject.kind} ${subject.id}`, route.node.id);
      }
    } catch (err) {
      let e = toHostdError(err, req.id);
      if (kind === 'data') e = dataPlaneError(e, subject.id);
      opts.drain(req);
      return opts.sendError(req, reply, e);
    }
    reply.hijack();
    const connect = opts.isConnect(req);
    await front.forwarder.pass(req.raw, reply.raw, target, (res, err) =>
      writeE2bError(res, err, connect),
    );
  });
  app.addHook('onClose', async () => front.close());
}
