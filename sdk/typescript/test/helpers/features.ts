/**
 * Which features of docs/api.md the real hostd under test has. The server grows in parallel
 * with the SDKs, so an integration test of a feature the server lacks skips itself and says
 * why, rather than failing. A route the server lacks answers `404 route_not_found`; a request
 * field it lacks answers `400 invalid_request` (it rejects unknown fields) to a probe that would
 * otherwise fail only on an unknown sandbox or template. Probes create nothing.
 */
import { resolveConfig } from '../../src/config.js';
import { isHostdError } from '../../src/errors.js';
import { request } from '../../src/http.js';

/** Short names, as README.md's `<!-- requires: files, snapshots -->` markers use them. */
export type Feature =
  'files' | 'snapshots' | 'pause' | 'templates' | 'exec-options' | 'create-options' | 'notebook';

const NOBODY = `/v1/sandboxes/sbx_${'0'.repeat(32)}`;

interface Probe {
  what: string;
  method: string;
  path: string;
  json?: unknown;
  /** The code the server answers when it lacks the feature. */
  lacking: string;
}

const PROBES: Record<Feature, Probe> = {
  files: {
    what: 'files API',
    method: 'GET',
    path: `${NOBODY}/files/stat?path=%2F`,
    lacking: 'route_not_found',
  },
  snapshots: {
    what: 'snapshots',
    method: 'GET',
    path: '/v1/snapshots',
    lacking: 'route_not_found',
  },
  pause: {
    what: 'pause and resume',
    method: 'POST',
    path: `${NOBODY}/pause`,
    lacking: 'route_not_found',
  },
  templates: {
    what: 'templates API',
    method: 'GET',
    path: '/v1/templates',
    lacking: 'route_not_found',
  },
  'exec-options': {
    what: 'exec env, cwd and display',
    method: 'POST',
    path: `${NOBODY}/exec`,
    json: { code: '', env: {}, cwd: '/', display: false },
    lacking: 'invalid_request',
  },
  notebook: {
    what: 'notebook cells and contexts',
    method: 'POST',
    path: `${NOBODY}/exec`,
    json: { code: '', context: 'default', notebook: false },
    lacking: 'invalid_request',
  },
  'create-options': {
    what: 'create env and network',
    method: 'POST',
    path: '/v1/sandboxes',
    json: { template: 'hostd-sdk-probe-no-such-template', env: {}, network: { allow_out: [] } },
    lacking: 'invalid_request',
  },
};

/** Whether `name` is a feature this module knows (for README markers). */
export function isFeature(name: string): name is Feature {
  return Object.hasOwn(PROBES, name);
}

const known = new Map<Feature, Promise<boolean>>();

async function probe(feature: Feature): Promise<boolean> {
  const p = PROBES[feature];
  try {
    const res = await request(resolveConfig({ maxRetries: 0 }), {
      method: p.method,
      path: p.path,
      ...(p.json === undefined ? {} : { json: p.json }),
    });
    res.destroy();
    return true;
  } catch (err) {
    return !(isHostdError(err) && err.code === p.lacking);
  }
}

/**
 * Undefined when the server has `feature`, else the reason to give `t.skip`. Each feature is
 * probed once per process.
 *
 * @example
 * const lacking = await lacks('files'); if (lacking) return t.skip(lacking);
 */
export async function lacks(feature: Feature): Promise<string | undefined> {
  if (!known.has(feature)) known.set(feature, probe(feature));
  return (await known.get(feature)!)
    ? undefined
    : `the server under test has no ${PROBES[feature].what} yet (it answers ${PROBES[feature].lacking})`;
}
