/**
 * The E2B control plane (docs/e2b.md, Control plane): E2B's REST API for sandboxes, answered by
 * the same manager as the native API, so an E2B sandbox is a hostd sandbox. Both endpoint
 * generations are served: `POST /v2/sandboxes` and `/v2/sandboxes/{id}/connect` (npm `e2b`
 * 2.51) and `POST /sandboxes` and `/sandboxes/{id}/connect` (older SDKs and the Python SDK).
 *
 * E2B's notions map onto hostd's: a timeout is the sandbox's lifetime (killed, or paused with
 * `autoPause`, at its end), `metadata` hostd's metadata, a snapshot a hostd snapshot whose id
 * (or name) creates sandboxes as a `templateID`, `fork` hostd's fork. What has no counterpart
 * answers 501 `not_supported`, never a silent success.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import {
  MAX_FORK,
  MAX_LIFETIME_S,
  validateAllowOut,
  type SandboxInfo,
  type SandboxMetric,
  type SnapshotInfo,
} from '../../core/sandbox-manager.js';
import type { NodeRecord } from '../../core/cluster/records.js';
import { fail } from '../../errors.js';
import { optionalEnv, optionalMetadata } from '../validate.js';
import { AUTO_RESUME_LABEL, e2bState, type E2bContext } from './context.js';
import { ClusterFront, relay } from '../cluster-front.js';
import type { Answer } from '../forward.js';
import { e2bTarget, noE2bFront } from './cluster-hop.js';

type IdParams = { id: string };
type Body = Record<string, unknown>;

/** E2B's `Sandbox` answer (create, connect, fork entries). */
export interface E2bSandbox {
  sandboxID: string;
  templateID: string;
  alias?: string;
  clientID: string;
  envdVersion: string;
  envdAccessToken: string;
  trafficAccessToken: string;
  domain: null;
}

/**
 * E2B's template names, onto hostd's templates (docs/e2b.md, Templates): `base` (E2B's default:
 * Python, bash, git, curl) and `code-interpreter-v1` (@e2b/code-interpreter's default: the data
 * stack) are both `python`, the template with git, curl and pandas/matplotlib. When hostd does
 * not serve the target, the alias is the default template (the first of SERVICE_TEMPLATES). In
 * cluster mode "served" means by any live node: an alias whose target only another node serves
 * is created there.
 */
export const TEMPLATE_ALIASES: Readonly<Record<string, string>> = {
  base: 'python',
  'code-interpreter-v1': 'python',
};

/** What hostd says as E2B's deprecated `clientID`. */
const CLIENT_ID = 'hostd';
/** E2B's default sandbox timeout (seconds): create and connect without one. */
const DEFAULT_TIMEOUT_S = 300;
/** E2B's default timeout of fork children (seconds): its API's own default. */
const DEFAULT_FORK_TIMEOUT_S = 15;
/** E2B's page size limit for lists. */
const MAX_PAGE = 100;
/** An `endAt` for a sandbox that never expires (one made natively, without a lifetime). */
const NEVER = '9999-12-31T23:59:59.000Z';

/** What a create or fork answers for sandbox `id`. */
export function sandboxAnswer(ctx: E2bContext, id: string, templateID: string): E2bSandbox {
  return {
    sandboxID: id,
    templateID,
    clientID: CLIENT_ID,
    envdVersion: ctx.envdVersion,
    envdAccessToken: ctx.tokens.accessToken(id),
    trafficAccessToken: ctx.tokens.trafficToken(id),
    domain: null,
  };
}

/**
 * Another node's acceptance of a create asked for what `templateID` resolved to, naming
 * `templateID` as the client asked (and its alias, when it is one), as a local create does.
 */
function namedAs(a: Answer, templateID: string): Answer {
  if (a.status !== 201) return a;
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(a.body.toString('utf8')) as Record<string, unknown>;
  } catch {
    return a; // Expected never: a node's E2B front answers JSON; passed on as it came.
  }
  body.templateID = templateID;
  if (templateID in TEMPLATE_ALIASES) body.alias = templateID;
  else delete body.alias;
  return { ...a, body: Buffer.from(JSON.stringify(body)) };
}

/** What an E2B `templateID` means here: a hostd template, or a snapshot (by id or name). */
type Source = { template: string } | { snapshot: string };

export function resolveTemplate(ctx: E2bContext, name: string): Source {
  return knownSource(ctx, name) ?? { template: name }; // unknown: template_not_found
}

/**
 * resolveTemplate for a create. In cluster mode a name this node knows nothing of is also looked
 * up among the store's snapshots: one taken through another node a moment ago is confirmed to
 * its client once the store has it, and may not have reached this node's copy of the catalog.
 */
async function resolveForCreate(ctx: E2bContext, name: string): Promise<Source> {
  const known = knownSource(ctx, name);
  if (known !== null || !ctx.cluster) return known ?? { template: name };
  const found = await ctx.cluster.node.snapshotByNameInStore([name, withoutTag(name)]);
  return found === null ? { template: name } : { snapshot: found.id };
}

/** A name's template or snapshot as this node knows them, null when it knows neither. */
function knownSource(ctx: E2bContext, name: string): Source | null {
  const { manager } = ctx;
  if (name.startsWith('snap_')) return { snapshot: name };
  // In cluster mode, the templates any live node serves (this node's first, in its order).
  const served = ctx.cluster?.node.templateNames() ?? manager.listTemplates().map((t) => t.name);
  if (served.includes(name)) return { template: name };
  const alias = TEMPLATE_ALIASES[name];
  if (alias !== undefined) {
    return { template: served.includes(alias) ? alias : (served[0] ?? alias) };
  }
  const named = snapshotNamed(ctx, name) ?? snapshotNamed(ctx, withoutTag(name));
  return named === null ? null : { snapshot: named };
}

/** An E2B template name without its `:tag`. */
const withoutTag = (name: string): string => name.replace(/:[^:/]*$/, '');

/**
 * The id of the newest snapshot named `name`: this node's, or in cluster mode any node's (the
 * catalog's; a create from it then goes to its node). This node's own are asked too: one just
 * taken may not be in the catalog copy yet.
 */
function snapshotNamed(ctx: E2bContext, name: string): string | null {
  const here = ctx.manager.snapshotByName(name);
  const there = ctx.cluster?.node.snapshotByName(name) ?? null;
  if (here === null) return there?.id ?? null;
  if (there === null || here.created_at >= there.created_at) return here.snapshot_id;
  return there.id;
}

// --- request bodies ------------------------------------------------------------------------

function objectBody(body: unknown): Body {
  if (body === undefined || body === null) return {};
  if (typeof body !== 'object' || Array.isArray(body)) throw fail('bodyNotObject', 'the body');
  return body as Body;
}

/** An E2B timeout: whole seconds in (0, 30 days]; `undefined` when absent. */
function optionalTimeout(b: Body, field = 'timeout'): number | undefined {
  const v = b[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0 || v > MAX_LIFETIME_S) {
    throw fail('invalidField', field, `whole seconds in (0, ${MAX_LIFETIME_S}]`, v);
  }
  return v;
}

function optionalBool(b: Body, field: string): boolean | undefined {
  const v = b[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw fail('invalidField', field, 'a boolean', v);
  return v;
}

function stringList(v: unknown, field: string): string[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || v.some((x) => typeof x !== 'string')) {
    throw fail('invalidField', field, 'an array of strings', v);
  }
  return v as string[];
}

const isSet = (v: unknown): boolean =>
  v !== undefined &&
  v !== null &&
  !(Array.isArray(v) && v.length === 0) &&
  !(typeof v === 'object' && !Array.isArray(v) && Object.keys(v as object).length === 0);

/**
 * E2B's network options as hostd egress rules (docs/e2b.md, Network). Internet access is on
 * unless `allow_internet_access: false` or `denyOut: ["0.0.0.0/0"]`: as on E2B, it is the rule
 * `*` (public addresses; the host and private networks stay closed, as for every hostd
 * sandbox). `allowOut` entries are added as rules. Deny lists other than "everything", header
 * rules, egress proxies and request-host masking have no hostd counterpart.
 */
function egressRules(b: Body): string[] {
  let internet = optionalBool(b, 'allow_internet_access') ?? true;
  const net = b.network;
  const rules: string[] = [];
  if (net !== undefined && net !== null) {
    if (typeof net !== 'object' || Array.isArray(net)) {
      throw fail('invalidField', 'network', 'an object', net);
    }
    const n = net as Body;
    for (const field of ['rules', 'egressProxy', 'maskRequestHost']) {
      if (isSet(n[field])) {
        throw fail('notSupported', `network.${field}`, 'hostd has allow rules only');
      }
    }
    const deny = stringList(n.denyOut, 'network.denyOut');
    for (const d of deny) {
      if (d === '0.0.0.0/0' || d === '::/0') internet = false;
      else {
        throw fail(
          'notSupported',
          `network.denyOut ${JSON.stringify(d)}`,
          'hostd has allow rules only: deny everything ("0.0.0.0/0") and allow what you need',
        );
      }
    }
    for (const a of stringList(n.allowOut, 'network.allowOut')) {
      rules.push(a === '0.0.0.0/0' || a === '::/0' ? '*' : a);
    }
  }
  if (internet) rules.unshift('*');
  return validateAllowOut([...new Set(rules)]);
}

/** E2B's metadata without the labels the front keeps for itself. */
function userMetadata(metadata: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(metadata).filter(([k]) => k !== AUTO_RESUME_LABEL));
}

// --- answers ---------------------------------------------------------------------------------

function templateIdOf(info: SandboxInfo): string {
  return info.snapshot_id ?? info.template;
}

/** `endAt`: when its lifetime ends; paused: when it stopped running; no lifetime: never. */
function endAtOf(info: SandboxInfo): string {
  if (info.expires_at) return info.expires_at;
  if (info.state === 'paused') return info.last_used_at;
  return NEVER;
}

/** E2B's `ListedSandbox` (and, with more fields, `SandboxDetail`). */
function listed(ctx: E2bContext, info: SandboxInfo): Record<string, unknown> {
  const shape = templateShape(ctx, info.template);
  return {
    sandboxID: info.id,
    templateID: templateIdOf(info),
    clientID: CLIENT_ID,
    metadata: userMetadata(info.metadata),
    startedAt: info.created_at,
    endAt: endAtOf(info),
    state: e2bState(info) === 'paused' ? 'paused' : 'running',
    cpuCount: shape.vcpus,
    memoryMB: shape.memoryMib,
    diskSizeMB: shape.diskMib,
    envdVersion: ctx.envdVersion,
    volumeMounts: [],
  };
}

function detail(ctx: E2bContext, info: SandboxInfo): Record<string, unknown> {
  const rules = info.network.allow_out;
  return {
    ...listed(ctx, info),
    envdAccessToken: ctx.tokens.accessToken(info.id),
    domain: null,
    allowInternetAccess: rules.includes('*'),
    network: { allowOut: rules.filter((r) => r !== '*') },
    lifecycle: {
      onTimeout: info.on_timeout === 'pause' ? 'pause' : 'kill',
      autoResume: info.metadata[AUTO_RESUME_LABEL] === 'true',
    },
  };
}

function templateShape(
  ctx: E2bContext,
  template: string,
): { vcpus: number; memoryMib: number; diskMib: number } {
  try {
    const t = ctx.manager.describeTemplate(template);
    return { vcpus: t.vcpus, memoryMib: t.memory_mib, diskMib: t.disk_mib };
  } catch {
    return { vcpus: 1, memoryMib: 0, diskMib: 0 };
  }
}

function metricAnswer(m: SandboxMetric): Record<string, unknown> {
  return {
    timestamp: new Date(m.timestamp).toISOString(),
    timestampUnix: Math.round(m.timestamp / 1000),
    cpuCount: m.cpuCount,
    cpuUsedPct: m.cpuUsedPct,
    memUsed: m.memUsedBytes,
    memTotal: m.memTotalBytes,
    memCache: 0,
    diskUsed: m.diskUsedBytes,
    diskTotal: m.diskTotalBytes,
  };
}

function snapshotAnswer(s: SnapshotInfo): { snapshotID: string; names: string[] } {
  return { snapshotID: s.snapshot_id, names: s.name ? [s.name] : [] };
}

// --- lists -------------------------------------------------------------------------------------

/** One form-style query value or several (`state=running,paused` or repeated). */
function queryList(v: unknown): string[] {
  const all = Array.isArray(v) ? v : v === undefined ? [] : [v];
  return all.flatMap((x) => String(x).split(',')).filter((x) => x !== '');
}

/** Go's QueryUnescape: `+` is a space. */
const unescape = (s: string): string => {
  try {
    return decodeURIComponent(s.replace(/\+/g, ' '));
  } catch {
    throw fail('invalidField', 'metadata', 'a URL-encoded key=value list', s);
  }
};

/**
 * The `metadata` filter as E2B's SDKs encode it: `k=v&k2=v2` with each key and value
 * URL-encoded, the whole encoded again (docs/e2b.md, List). Every pair must match.
 */
export function parseMetadataFilter(v: unknown): Record<string, string> {
  if (v === undefined || v === '') return {};
  if (typeof v !== 'string') throw fail('invalidField', 'metadata', 'one query value', v);
  const pairs: Record<string, string> = {};
  for (const part of unescape(v).split('&')) {
    if (part === '') continue;
    const eq = part.indexOf('=');
    const key = unescape(eq < 0 ? part : part.slice(0, eq));
    pairs[key] = unescape(eq < 0 ? '' : part.slice(eq + 1));
  }
  return pairs;
}

function pageLimit(v: unknown): number {
  if (v === undefined || v === '') return MAX_PAGE;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw fail('invalidField', 'limit', 'a whole number ≥ 1', v);
  return Math.min(n, MAX_PAGE);
}

/** A page of `items` (sorted) after `token`, and the token of the next page when there is one. */
export function paginate<T>(
  items: readonly T[],
  keyOf: (item: T) => string,
  limit: number,
  token: unknown,
): { page: T[]; next: string | null } {
  let start = 0;
  if (token !== undefined && token !== '') {
    let after: string;
    try {
      after = Buffer.from(String(token), 'base64url').toString('utf8');
    } catch {
      throw fail('invalidField', 'nextToken', 'a token from X-Next-Token', token);
    }
    const at = items.findIndex((item) => keyOf(item) === after);
    start = at < 0 ? items.length : at + 1;
  }
  const page = items.slice(start, start + limit);
  const more = start + limit < items.length && page.length > 0;
  return {
    page,
    next: more ? Buffer.from(keyOf(page.at(-1)!), 'utf8').toString('base64url') : null,
  };
}

function sendPage(reply: FastifyReply, page: unknown[], next: string | null): FastifyReply {
  if (next !== null) void reply.header('x-next-token', next);
  return reply.send(page);
}

/**
 * Cluster mode's batch metrics: each node's sandboxes asked of its E2B front (the hop header
 * on: it answers for its own), this node's answered by `latest`, merged in request order. An id
 * a single hostd would refuse fails the request as it would there, and as there the answer is
 * that of the first failing id in the order asked: a node answers its own ids' first failure,
 * so when several nodes' parts fail, the ids of failing parts are asked again one at a time, in
 * request order, up to the first that fails (a node that did not answer at all fails at its
 * first id). A rare path: only a request naming bad ids on two nodes takes it.
 */
async function batchMetrics(
  front: ClusterFront,
  req: FastifyRequest,
  reply: FastifyReply,
  ids: readonly string[],
  latest: (ids: readonly string[]) => Record<string, unknown>,
): Promise<unknown> {
  const groups = await front.holders(ids, `GET ${req.url}`);
  const ask = async (node: NodeRecord | null, some: readonly string[]): Promise<Part> => {
    if (node === null) return { found: latest(some) };
    const target = e2bTarget(node);
    if (target === null) throw noE2bFront(`sandbox ${some[0]}`, node.id);
    const url = `/sandboxes/metrics?sandbox_ids=${encodeURIComponent(some.join(','))}`;
    const answer = await front.forwarder.ask(
      { method: 'GET', url, headers: req.headers },
      target,
      undefined,
      10_000,
    );
    if (answer.status !== 200) return { refused: answer };
    const json = JSON.parse(answer.body.toString('utf8')) as { sandboxes: Part['found'] };
    return { found: json.sandboxes };
  };
  const parts = await Promise.allSettled(groups.map((g) => ask(g.node, g.ids)));
  const failedAt = parts.flatMap((p, i) => (p.status === 'rejected' || p.value.refused ? [i] : []));
  const answerOf = (p: PromiseSettledResult<Part>): unknown => {
    if (p.status === 'rejected') throw p.reason;
    return relay(reply, p.value.refused!);
  };
  if (failedAt.length > 0) {
    if (failedAt.length > 1) {
      const groupOf = new Map<string, number>();
      groups.forEach((g, i) => g.ids.forEach((id) => groupOf.set(id, i)));
      for (const id of ids) {
        const i = groupOf.get(id)!;
        const part = parts[i]!;
        if (!failedAt.includes(i)) continue;
        if (part.status === 'rejected' && groups[i]!.node !== null) return answerOf(part);
        const [alone] = await Promise.allSettled([ask(groups[i]!.node, [id])]);
        if (alone!.status === 'rejected' || alone!.value.refused) return answerOf(alone!);
      }
    }
    // One failing part (its node's first failure is the first in request order), or the ids
    // asked again no longer fail: the first failing part's answer.
    return answerOf(parts[failedAt[0]!]!);
  }
  const found = new Map<string, unknown>();
  for (const part of parts) {
    if (part.status !== 'fulfilled') continue;
    for (const [id, metric] of Object.entries(part.value.found ?? {})) found.set(id, metric);
  }
  const sandboxes: Record<string, unknown> = {};
  for (const id of ids) if (found.has(id)) sandboxes[id] = found.get(id);
  return { sandboxes };
}

/** One node's part of the batch metrics: its samples, or its error answer. */
interface Part {
  readonly found?: Record<string, unknown>;
  readonly refused?: Answer;
}

// --- routes ----------------------------------------------------------------------------------

export function registerControlRoutes(app: FastifyInstance, ctx: E2bContext): void {
  const { manager } = ctx;

  // Create: v2 (npm e2b 2.51) and legacy (older SDKs, the Python SDK). Both default to 300 s.
  const create = async (req: FastifyRequest, reply: FastifyReply): Promise<unknown> => {
    const b = objectBody(req.body);
    if (typeof b.templateID !== 'string' || b.templateID === '') {
      throw fail(
        'invalidField',
        'templateID',
        'a template name, alias or snapshot id',
        b.templateID,
      );
    }
    if (isSet(b.mcp)) throw fail('notSupported', 'mcp', 'hostd runs no MCP gateway in sandboxes');
    if (isSet(b.volumeMounts)) throw fail('notSupported', 'volumeMounts', 'hostd has no volumes');
    if (isSet((b.iam as Body | undefined)?.tokens)) {
      throw fail('notSupported', 'iam', 'hostd issues no workload identity tokens');
    }
    const timeoutS = optionalTimeout(b) ?? DEFAULT_TIMEOUT_S;
    const autoPause = optionalBool(b, 'autoPause') ?? false;
    const autoResume = (b.autoResume as Body | undefined)?.enabled === true;
    const metadata = { ...optionalMetadata(b, 'metadata') };
    if (autoResume) metadata[AUTO_RESUME_LABEL] = 'true';
    const env = optionalEnv(b, 'envVars');
    const allowOut = egressRules(b);
    const source = await resolveForCreate(ctx, b.templateID);
    const templateID = b.templateID;
    const here = async (): Promise<FastifyReply> => {
      const sandbox = await manager.create({
        ...source,
        ...(env ? { env } : {}),
        allowOut,
        metadata,
        lifetime: { timeoutS, onTimeout: autoPause ? 'pause' : 'delete' },
      });
      const answer = sandboxAnswer(ctx, sandbox.id, templateID);
      if (templateID in TEMPLATE_ALIASES) answer.alias = templateID;
      return reply.code(201).send(answer);
    };
    // Cluster mode: placed as a native create is, and asked of the chosen node's E2B front
    // (whose tokens the answer carries: that node checks the sandbox's traffic). That node is
    // asked for what the name resolved to here (a snapshot's id, an alias's template): its own
    // copy of the catalog may know a newer snapshot of the name, on a third node, or map an
    // alias otherwise. Its answer then names what the client asked for, as `here` does.
    if (ctx.cluster) {
      const resolved = 'snapshot' in source ? source.snapshot : source.template;
      const forward = {
        noTarget: noE2bFront,
        ...(resolved === templateID
          ? {}
          : {
              body: { ...b, templateID: resolved },
              answer: (a: Answer): Answer => namedAs(a, templateID),
            }),
      };
      return ctx.cluster.create(req, reply, source, here, e2bTarget, forward);
    }
    return here();
  };
  app.post('/v2/sandboxes', create);
  app.post('/sandboxes', create);

  const describe = (id: string): SandboxInfo => {
    const info = manager.describe(id);
    // A failed sandbox is gone for E2B's clients (they can still kill it).
    if (e2bState(info) === 'gone') throw fail('sandboxNotFound', id);
    return info;
  };

  /** Every sandbox an E2B client sees, filtered as `GET /v2/sandboxes` asks. */
  const listFiltered = (q: Record<string, unknown>): SandboxInfo[] => {
    const metadata = parseMetadataFilter(q.metadata);
    const states = queryList(q.state);
    for (const s of states) {
      if (s !== 'running' && s !== 'paused') {
        throw fail('invalidField', 'state', '"running" and/or "paused"', s);
      }
    }
    let after = -Infinity;
    if (q.startedAfter !== undefined && q.startedAfter !== '') {
      after = Date.parse(String(q.startedAfter));
      if (Number.isNaN(after)) {
        throw fail('invalidField', 'startedAfter', 'an ISO 8601 time', q.startedAfter);
      }
    }
    const template = typeof q.template === 'string' && q.template !== '' ? q.template : null;
    const wanted = template === null ? null : resolveTemplate(ctx, template);
    const order = q.order ?? 'desc';
    if (order !== 'asc' && order !== 'desc') {
      throw fail('invalidField', 'order', '"asc" or "desc"', order);
    }
    const sorted = manager
      .list()
      .filter((s) => {
        const state = e2bState(s);
        if (state === 'gone') return false;
        if (states.length > 0 && !states.includes(state)) return false;
        if (Date.parse(s.created_at) < after) return false;
        for (const [k, v] of Object.entries(metadata)) if (s.metadata[k] !== v) return false;
        if (wanted !== null) {
          const matches =
            'snapshot' in wanted
              ? s.snapshot_id === wanted.snapshot
              : s.template === wanted.template && s.snapshot_id === null;
          if (!matches && templateIdOf(s) !== template) return false;
        }
        return true;
      })
      .sort((a, b) => a.created_at.localeCompare(b.created_at) || a.id.localeCompare(b.id));
    return order === 'desc' ? sorted.reverse() : sorted;
  };

  /**
   * Cluster mode: every node's part of a list (`all`, this node's). Asked by another node, the
   * part is answered whole (no page: the asking node pages the merged list); asked by a client,
   * the parts of the others are gathered and sorted by `compare`, the same on every node so that
   * pages asked of different nodes follow on.
   */
  const clusterList = async <T>(
    req: FastifyRequest,
    all: T[],
    compare: (a: T, b: T) => number,
  ): Promise<{ items: T[]; whole: boolean }> => {
    if (!ctx.cluster) return { items: all, whole: false };
    if (ClusterFront.forwarded(req)) return { items: all, whole: true };
    const merged = await ctx.cluster.gather(req, null, all, e2bTarget);
    return { items: merged.sort(compare), whole: false };
  };
  const byStart =
    (order: unknown) =>
    (a: Record<string, unknown>, b: Record<string, unknown>): number => {
      const c =
        String(a.startedAt).localeCompare(String(b.startedAt)) ||
        String(a.sandboxID).localeCompare(String(b.sandboxID));
      return order === 'asc' ? c : -c;
    };

  app.get<{ Querystring: Record<string, unknown> }>('/v2/sandboxes', async (req, reply) => {
    const all = listFiltered(req.query).map((s) => listed(ctx, s));
    const { items, whole } = await clusterList(req, all, byStart(req.query.order ?? 'desc'));
    if (whole) return reply.send(items);
    const { page, next } = paginate(
      items,
      (s) => String(s.sandboxID),
      pageLimit(req.query.limit),
      req.query.nextToken,
    );
    return sendPage(reply, page, next);
  });

  // The deprecated list: running sandboxes, filtered by metadata only, in one answer.
  app.get<{ Querystring: Record<string, unknown> }>('/sandboxes', async (req) => {
    const all = listFiltered({ metadata: req.query.metadata, state: 'running' }).map((s) =>
      listed(ctx, s),
    );
    return (await clusterList(req, all, byStart('desc'))).items;
  });

  app.get<{ Params: IdParams }>('/sandboxes/:id', async (req) =>
    detail(ctx, describe(req.params.id)),
  );

  app.delete<{ Params: IdParams }>('/sandboxes/:id', async (req, reply) => {
    await manager.delete(req.params.id);
    return reply.code(204).send();
  });

  // setTimeout: the end moves to now + timeout, earlier or later.
  app.post<{ Params: IdParams }>('/sandboxes/:id/timeout', async (req, reply) => {
    const timeoutS = optionalTimeout(objectBody(req.body));
    if (timeoutS === undefined) throw fail('invalidField', 'timeout', 'whole seconds', undefined);
    describe(req.params.id);
    manager.setTimeout(req.params.id, timeoutS);
    return reply.code(204).send();
  });

  // The deprecated refresh: the end moves to now + duration unless it is later already.
  app.post<{ Params: IdParams }>('/sandboxes/:id/refreshes', async (req, reply) => {
    const duration = optionalTimeout(objectBody(req.body), 'duration') ?? DEFAULT_TIMEOUT_S;
    const info = describe(req.params.id);
    if (info.timeout !== null) manager.setTimeout(info.id, duration, { extendOnly: true });
    return reply.code(204).send();
  });

  app.post<{ Params: IdParams }>('/sandboxes/:id/pause', async (req, reply) => {
    const b = objectBody(req.body);
    optionalBool(b, 'memory'); // hostd always keeps the memory: a resume continues where it was
    const info = describe(req.params.id);
    if (e2bState(info) === 'paused') throw fail('sandboxAlreadyPaused', info.id);
    await manager.pause(info.id);
    return reply.code(204).send();
  });

  /**
   * Connect: resumes a paused sandbox, whose lifetime then starts again at `timeout` (default
   * 300 s); a running one's lifetime is only ever extended. 201 when it was resumed.
   */
  const connect = async (
    id: string,
    body: unknown,
    reply: FastifyReply,
    alwaysCreated = false,
  ): Promise<FastifyReply> => {
    const b = objectBody(body);
    const timeoutS = optionalTimeout(b) ?? DEFAULT_TIMEOUT_S;
    optionalBool(b, 'memory');
    const info = manager.describe(id);
    if (info.state === 'failed') throw fail('sandboxBroken', id, info.error ?? 'its VM failed');
    const wasPaused = info.state === 'paused';
    if (wasPaused) await manager.resume(id);
    if (info.timeout !== null) {
      manager.setTimeout(id, timeoutS, wasPaused ? {} : { extendOnly: true });
    }
    return reply
      .code(wasPaused || alwaysCreated ? 201 : 200)
      .send(sandboxAnswer(ctx, id, templateIdOf(info)));
  };
  app.post<{ Params: IdParams }>('/v2/sandboxes/:id/connect', (req, reply) =>
    connect(req.params.id, req.body, reply),
  );
  app.post<{ Params: IdParams }>('/sandboxes/:id/connect', (req, reply) =>
    connect(req.params.id, req.body, reply),
  );
  // The deprecated resume: as connect, always 201.
  app.post<{ Params: IdParams }>('/sandboxes/:id/resume', (req, reply) =>
    connect(req.params.id, req.body, reply, true),
  );

  // Fork: hostd's fork, all or nothing; the children get their own lifetime (default 15 s).
  app.post<{ Params: IdParams }>('/sandboxes/:id/fork', async (req, reply) => {
    const b = objectBody(req.body);
    const timeoutS = optionalTimeout(b) ?? DEFAULT_FORK_TIMEOUT_S;
    const count = b.count ?? 1;
    if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > MAX_FORK) {
      throw fail('invalidField', 'count', `an integer from 1 to ${MAX_FORK}`, count);
    }
    const parent = describe(req.params.id);
    const children = await manager.fork(parent.id, count);
    const answers = children.map((child) => {
      manager.setTimeout(child.id, timeoutS);
      return { sandbox: sandboxAnswer(ctx, child.id, templateIdOf(parent)) };
    });
    return reply.code(201).send(answers);
  });

  app.get<{ Params: IdParams; Querystring: { start?: string; end?: string } }>(
    '/sandboxes/:id/metrics',
    async (req) => {
      const seconds = (v: string | undefined, field: string): number | undefined => {
        if (v === undefined || v === '') return undefined;
        const n = Number(v);
        if (!Number.isFinite(n)) throw fail('invalidField', field, 'unix seconds', v);
        return n * 1000;
      };
      const from = seconds(req.query.start, 'start');
      const to = seconds(req.query.end, 'end');
      describe(req.params.id);
      return manager.metrics(req.params.id, from, to).map(metricAnswer);
    },
  );

  // The latest sample of each of several sandboxes (not called by the 2.x SDKs). A sandbox
  // without a sample yet is left out; an id that is not a sandbox fails the request (404).
  app.get<{ Querystring: { sandbox_ids?: string } }>('/sandboxes/metrics', async (req, reply) => {
    const ids = queryList(req.query.sandbox_ids);
    const latest = (some: readonly string[]): Record<string, unknown> => {
      const out: Record<string, unknown> = {};
      for (const id of some) {
        const last = manager.metrics(id).at(-1);
        if (last) out[id] = metricAnswer(last);
      }
      return out;
    };
    if (!ctx.cluster || ClusterFront.forwarded(req)) return { sandboxes: latest(ids) };
    return batchMetrics(ctx.cluster, req, reply, ids, latest);
  });

  app.post<{ Params: IdParams }>('/sandboxes/:id/snapshots', async (req, reply) => {
    const b = objectBody(req.body);
    const name = b.name ?? null;
    if (name !== null && (typeof name !== 'string' || name === '' || name.length > 128)) {
      throw fail('invalidField', 'name', 'a name of 1 to 128 characters', name);
    }
    describe(req.params.id);
    const snapshot = await manager.snapshot(req.params.id, name as string | null);
    return reply.code(201).send(snapshotAnswer(snapshot));
  });

  app.get<{ Querystring: Record<string, unknown> }>('/snapshots', async (req, reply) => {
    const { sandboxID, name } = req.query;
    const bare = typeof name === 'string' ? name.replace(/:[^:/]*$/, '') : null;
    const all = manager
      .listSnapshots()
      .filter((s) => sandboxID === undefined || s.source_sandbox_id === sandboxID)
      .filter(
        (s) =>
          name === undefined ||
          s.snapshot_id === name ||
          (s.name !== null && (s.name === name || s.name === bare)),
      );
    const { items, whole } = await clusterList(req, all.map(snapshotAnswer), (a, b) =>
      a.snapshotID.localeCompare(b.snapshotID),
    );
    if (whole) return reply.send(items);
    // A snapshot copied to several nodes is listed once (they sort next to each other).
    const once = items.filter((s, i) => i === 0 || items[i - 1]!.snapshotID !== s.snapshotID);
    const { page, next } = paginate(
      once,
      (s) => s.snapshotID,
      pageLimit(req.query.limit),
      req.query.nextToken,
    );
    return sendPage(reply, page, next);
  });

  // Deleting a template: a snapshot's id deletes the snapshot; hostd's templates are recipes.
  app.delete<{ Params: IdParams }>('/templates/:id', async (req, reply) => {
    const { id } = req.params;
    if (!id.startsWith('snap_') && manager.listTemplates().some((t) => t.name === id)) {
      throw fail(
        'notSupported',
        'deleting a template',
        "hostd's templates are recipes (docs/templates.md)",
      );
    }
    manager.deleteSnapshot(id);
    return reply.code(204).send();
  });

  app.put<{ Params: IdParams }>('/sandboxes/:id/network', async () => {
    throw fail(
      'notSupported',
      'updateNetwork',
      "a sandbox's egress rules are set when it is created (network.allowOut)",
    );
  });

  // E2B's cloud features with no hostd counterpart: a clear 501, never a 404 that reads as a typo.
  const cloudOnly: [string, string, string][] = [
    [
      '/sandboxes/:id/logs',
      'sandbox logs',
      'read them with the native GET /v1/sandboxes/{id}/logs',
    ],
    [
      '/v2/sandboxes/:id/logs',
      'sandbox logs',
      'read them with the native GET /v1/sandboxes/{id}/logs',
    ],
    ['/templates', 'templates', "hostd's templates are recipes (docs/templates.md)"],
    ['/templates/*', 'templates', "hostd's templates are recipes (docs/templates.md)"],
    ['/v2/templates', 'templates', "hostd's templates are recipes (docs/templates.md)"],
    ['/v2/templates/*', 'templates', "hostd's templates are recipes (docs/templates.md)"],
    ['/v3/templates', 'templates', "hostd's templates are recipes (docs/templates.md)"],
    ['/v3/templates/*', 'templates', "hostd's templates are recipes (docs/templates.md)"],
    ['/volumes', 'volumes', 'hostd has no volumes'],
    ['/volumes/*', 'volumes', 'hostd has no volumes'],
    ['/volumecontent/*', 'volumes', 'hostd has no volumes'],
    ['/secrets', 'secrets', 'hostd has no secret store'],
    ['/secrets/*', 'secrets', 'hostd has no secret store'],
    ['/teams', 'teams', 'hostd has API keys, not teams'],
    ['/teams/*', 'teams', 'hostd has API keys, not teams'],
  ];
  for (const [url, what, why] of cloudOnly) {
    app.route({
      method: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'],
      url,
      handler: async () => {
        throw fail('notSupported', what, why);
      },
    });
  }
}
