/**
 * Cluster mode at the HTTP door (docs/api.md, Cluster): any node serves any request. A request
 * naming a sandbox or snapshot this node does not hold is forwarded, one hop, to the node that
 * holds it (api/forward.ts) before its body is read; a create is placed (core/cluster/
 * placement.ts) and asked of the chosen node, then of the next when one refuses (429, 503);
 * listings gather every live node's. Requests that arrive forwarded are always served here.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ClusterNode, Route } from '../core/cluster/cluster-node.js';
import { fail, HostdError, toHostdError } from '../errors.js';
import type { NodeRecord } from '../core/cluster/records.js';
import { HOP_HEADER } from '../core/cluster/headers.js';
import { Forwarder, type Answer, type Target } from './forward.js';

/** Routes answered by the node holding the sandbox named by this parameter. */
const SANDBOX_PARAM: Record<string, string> = {
  '/v1/sandboxes/:id': 'id',
  '/v1/sandboxes/:id/logs': 'id',
  '/v1/sandboxes/:id/pause': 'id',
  '/v1/sandboxes/:id/resume': 'id',
  '/v1/sandboxes/:id/exec': 'id',
  '/v1/sandboxes/:id/fork': 'id',
  '/v1/sandboxes/:id/snapshot': 'id',
  '/v1/sandboxes/:id/files': 'id',
  '/v1/sandboxes/:id/files/list': 'id',
  '/v1/sandboxes/:id/files/stat': 'id',
  '/v1/sandboxes/:id/files/mkdir': 'id',
  '/v1/sandboxes/:parent/merge_into/:winner': 'parent',
};

const SNAPSHOT_ROUTES = new Set(['/v1/snapshots/:id']);

/** Routes whose request resumes a paused sandbox (its next use). */
function resumes(route: string): boolean {
  return (
    route === '/v1/sandboxes/:id/exec' ||
    route === '/v1/sandboxes/:id/resume' ||
    route.startsWith('/v1/sandboxes/:id/files') ||
    route.startsWith('/v1/sandboxes/:id/contexts')
  );
}

/**
 * What moves a paused sandbox this node has no room to resume to a node that has room
 * (core/cluster/hand-over.ts `moveToRoom`); absent where nodes do not hand sandboxes over.
 */
export interface RoomMover {
  /** Its template when sandbox `id` is paused here without room to resume, else null. */
  pausedWithoutRoom(id: string): string | null;
  /** Hands it to a node with room; that node, or null when it stays here. */
  moveToRoom(id: string, template: string): Promise<NodeRecord | null>;
}

/**
 * How long a create from a snapshot asked of another node may take: that node may first copy
 * the snapshot's files (a node given up on would go on and make a sandbox nobody asked for).
 */
const SNAPSHOT_CREATE_MS = 10 * 60_000;

/** How long a create waits for this node to be connected to etcd before it answers 503. */
const CONNECT_WAIT_MS = 5000;

/** Sandbox routes the next helper's front may add: any `/v1/sandboxes/:id/...` is forwarded. */
function sandboxParam(route: string): string | undefined {
  return SANDBOX_PARAM[route] ?? (route.startsWith('/v1/sandboxes/:id/') ? 'id' : undefined);
}

/** How `ClusterFront.create` asks another node, when not as the client asked this one. */
export interface ForwardOptions {
  /** The body the other node is asked with (the client's when absent). */
  readonly body?: unknown;
  /** What the other node's acceptance answers the client (its answer as it is when absent). */
  readonly answer?: (a: Answer) => Answer;
  /** Why a node `targetOf` gives no target for cannot be asked (`what` it holds). */
  readonly noTarget?: (what: string, node: string) => HostdError;
}

export class ClusterFront {
  readonly forwarder: Forwarder;

  constructor(
    readonly node: ClusterNode,
    private readonly room: RoomMover | null = null,
  ) {
    this.forwarder = new Forwarder(node.id);
  }

  /** True for a request another node forwarded here: it is answered here, whatever it names. */
  static forwarded(req: FastifyRequest): boolean {
    return req.headers[HOP_HEADER] !== undefined;
  }

  /** The onRequest hook: forwards what another node must answer, before its body is read. */
  install(app: FastifyInstance): void {
    app.addHook('onRequest', async (req, reply) => {
      const route = req.routeOptions.url;
      if (route === undefined) return;
      const params = req.params as Record<string, string>;
      if (ClusterFront.forwarded(req)) {
        // The sandbox's node: a paused one it has no room to resume goes where there is room.
        const moved = resumes(route) ? await this.moveToRoom(params.id ?? '') : null;
        if (moved === null) return;
        reply.hijack();
        await this.forwarder.pass(req.raw, reply.raw, moved);
        return;
      }
      let target: Route | 'deleted';
      const param = sandboxParam(route);
      if (param !== undefined) {
        const isDelete = req.method === 'DELETE' && route === '/v1/sandboxes/:id';
        target = await this.locate(params[param] ?? '', isDelete, `${req.method} ${route}`);
        if (target === 'deleted') return reply.code(204).send();
        if (route === '/v1/sandboxes/:parent/merge_into/:winner') {
          await this.checkMerge(params.parent ?? '', params.winner ?? '', target);
        }
      } else if (SNAPSHOT_ROUTES.has(route)) {
        // A delete goes to the snapshot's node (every copy goes with its entry).
        target = await this.node.locateSnapshot(params.id ?? '', req.method === 'DELETE');
        if (target === 'deleted') return reply.code(204).send();
      } else if (route === '/v1/cluster/nodes/:id/drain' && params.id !== this.node.id) {
        const node = this.node.liveNode(params.id ?? '');
        if (!node) throw fail('nodeNotFound', params.id ?? '');
        target = { local: false, node };
      } else if (route === '/v1/cluster/nodes/:id/undrain' && params.id !== this.node.id) {
        const id = params.id ?? '';
        const node = this.node.liveNode(id);
        if (!node) {
          // One `GET /v1/cluster` lists as down: 409, it serves again once it restarts.
          const down = this.node.info().nodes.some((n) => n.id === id && n.state === 'down');
          throw down ? fail('nodeDown', id) : fail('nodeNotFound', id);
        }
        target = { local: false, node };
      } else {
        return;
      }
      if (target.local && param !== undefined && resumes(route)) {
        const moved = await this.moveToRoom(params[param] ?? '');
        if (moved !== null) target = { local: false, node: moved };
      }
      if (target.local) return;
      reply.hijack();
      await this.forwarder.pass(req.raw, reply.raw, target.node);
    });
  }

  /** Whether sandbox `id` is paused here without room to resume it (cheap: no lookup). */
  wantsRoom(id: string): boolean {
    return (this.room?.pausedWithoutRoom(id) ?? null) !== null;
  }

  /**
   * When this node holds sandbox `id` paused and has no room to resume it (full, short of
   * memory), hands it to a node that has room and returns that node (the request goes there and
   * resumes it); null when it stays here (the request is served here, as before). A request for
   * it that arrives while it is handed over waits, then follows it. The E2B front's resumes
   * (its `connect`, e2b/cluster-hop.ts) ask it too.
   */
  async moveToRoom(id: string): Promise<NodeRecord | null> {
    const template = this.room?.pausedWithoutRoom(id) ?? null;
    if (template === null || this.room === null) return null;
    const to = await this.room.moveToRoom(id, template);
    if (to !== null) return to;
    // Another request moved it meanwhile: follow it.
    if (this.node.holds(id)) return null;
    const route = await this.node.locateSandbox(id);
    return route.local ? null : route.node;
  }

  /**
   * Where a sandbox's request goes. A `DELETE` of a sandbox lost with its node, or paused on a
   * node that is down, is answered here: its catalog entry is removed (the node fences its copy
   * if it comes back), as a single hostd deletes a lost sandbox. The E2B front's kill is such a
   * delete too (`isDelete`).
   */
  async locate(id: string, isDelete: boolean, what: string): Promise<Route | 'deleted'> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.node.locateSandbox(id);
      } catch (err) {
        const e = toHostdError(err, what);
        const stranded = e.code === 'sandbox_lost' || e.code === 'node_unavailable';
        if (!isDelete || !stranded || attempt > 0) throw e;
        if (await this.node.forgetStranded(id)) return 'deleted';
      }
    }
  }

  /**
   * The nodes holding the sandboxes one request names (E2B's batch metrics): each node with its
   * ids in request order, the nodes in the order of their first id; this node under `node:
   * null`, with the ids no node holds (it answers 404 for them, as a single hostd does). The
   * first id in request order whose lookup fails (lost with its node: sandbox_lost, which the E2B front answers as 404; paused on a node that
   * is down: 503) fails the whole request, as that id alone would.
   */
  async holders(
    ids: readonly string[],
    what: string,
  ): Promise<{ node: NodeRecord | null; ids: string[] }[]> {
    const routes = await Promise.allSettled(ids.map((id) => this.locate(id, false, what)));
    const groups = new Map<string, { node: NodeRecord | null; ids: string[] }>();
    ids.forEach((id, i) => {
      const r = routes[i]!;
      if (r.status === 'rejected') throw r.reason;
      const route = r.value as Route; // not a delete: never 'deleted'
      const node = route.local ? null : route.node;
      const key = node?.id ?? '';
      let group = groups.get(key);
      if (!group) groups.set(key, (group = { node, ids: [] }));
      group.ids.push(id);
    });
    return [...groups.values()];
  }

  /**
   * A create: asked of each node in placement order until one accepts; `local` creates here.
   * A node that refuses (429, 503: full, draining, short of memory) passes it on; any other
   * answer is the client's. `targetOf` says where on a node the create is asked (the E2B front
   * asks the node's E2B front); a node it gives nothing for is passed over. `forward` changes
   * what another node is asked (its body) and what its acceptance answers the client: the E2B
   * front sends what it resolved a name to, so that the node asked does not resolve it anew.
   */
  async create(
    req: FastifyRequest,
    reply: FastifyReply,
    body: { template?: string; snapshot?: string },
    local: () => Promise<unknown>,
    targetOf: (node: NodeRecord) => Target | null = (node) => node,
    forward: ForwardOptions = {},
  ): Promise<unknown> {
    // Riding out an etcd member's loss (the watch moving to another member) or a short outage.
    await this.node.awaitConnected(CONNECT_WAIT_MS);
    if (ClusterFront.forwarded(req)) return this.createHere(local);
    const order = await this.node.placeCreate(body);
    if (order.length === 0) throw fail('noNodeAvailable', body.template ?? 'the default');
    let refusal: HostdError | Answer | null = null;
    for (const node of order) {
      if (node.id === this.node.id) {
        try {
          return await this.createHere(local);
        } catch (err) {
          const e = toHostdError(err, req.id);
          if (e.status !== 429 && e.status !== 503) throw e;
          refusal = e;
          continue;
        }
      }
      const target = targetOf(node);
      if (target === null) {
        // A node that cannot be asked (it has no E2B front): say so, not "no node".
        if (body.snapshot !== undefined) {
          const what = `snapshot ${body.snapshot}`;
          refusal = forward.noTarget?.(what, node.id) ?? fail('nodeUnavailable', what, node.id);
        }
        continue;
      }
      let answer: Answer;
      try {
        answer = await this.forwarder.ask(
          { method: 'POST', url: req.url, headers: req.headers },
          target,
          Buffer.from(JSON.stringify(forward.body ?? req.body ?? {})),
          // A node without the snapshot copies it first: as long as a hand-over may take.
          body.snapshot !== undefined ? SNAPSHOT_CREATE_MS : undefined,
        );
      } catch (err) {
        refusal = toHostdError(err, req.id);
        continue;
      }
      if (answer.status === 429 || answer.status === 503) {
        refusal = answer;
        continue;
      }
      return relay(reply, forward.answer ? forward.answer(answer) : answer);
    }
    if (refusal instanceof HostdError || refusal === null) {
      throw refusal ?? fail('noNodeAvailable', body.template ?? 'the default');
    }
    return relay(reply, refusal);
  }

  /**
   * Every live node's list under `key` (sandboxes, snapshots), this node's included. A null `key`
   * reads the answer as the list itself (the E2B front's lists); `targetOf` as for `create`.
   */
  async gather<T>(
    req: FastifyRequest,
    key: string | null,
    local: T[],
    targetOf: (node: NodeRecord) => Target | null = (node) => node,
  ): Promise<T[]> {
    if (ClusterFront.forwarded(req)) return local;
    const others = await Promise.all(
      this.node.otherNodes().map(async (node) => {
        const target = targetOf(node);
        if (target === null) return [];
        try {
          const a = await this.forwarder.ask(
            { method: 'GET', url: req.url, headers: req.headers },
            target,
            undefined,
            10_000,
          );
          if (a.status !== 200) return [];
          const json = JSON.parse(a.body.toString('utf8')) as unknown;
          const list = key === null ? json : (json as Record<string, unknown>)[key];
          return (Array.isArray(list) ? list : []) as T[];
        } catch (err) {
          req.log.warn({ node: node.id, err: (err as Error).message }, 'a node did not list');
          return [];
        }
      }),
    );
    return [...local, ...others.flat()];
  }

  close(): void {
    this.forwarder.close();
  }

  private async createHere(local: () => Promise<unknown>): Promise<unknown> {
    if (this.node.state !== 'serving') throw fail('nodeDraining', this.node.id);
    return local();
  }

  /** A merge's parent and winner must be on one node: the winner's machine stays where it is. */
  private async checkMerge(parent: string, winner: string, parentRoute: Route): Promise<void> {
    let winnerRoute: Route;
    try {
      winnerRoute = await this.node.locateSandbox(winner);
    } catch {
      return; // the node that answers the merge reports the winner's state
    }
    const parentNode = parentRoute.local ? this.node.id : parentRoute.node.id;
    let winnerNode: string;
    if (!winnerRoute.local) winnerNode = winnerRoute.node.id;
    else if (this.node.holds(winner)) winnerNode = this.node.id;
    else return; // unknown: the parent's node answers 404
    if (parentNode !== winnerNode) {
      throw fail('sandboxesOnDifferentNodes', parent, parentNode, winner, winnerNode);
    }
  }
}

/** Another node's buffered answer, as the client's: its status, type, `Retry-After` and body. */
export function relay(reply: FastifyReply, answer: Answer): FastifyReply {
  for (const name of ['content-type', 'retry-after']) {
    const v = answer.headers[name];
    if (v !== undefined) void reply.header(name, v);
  }
  return reply.code(answer.status).send(answer.body);
}
