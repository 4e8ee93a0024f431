/**
 * Figures of features that may not be served yet. Each is measured through the HTTP API as
 * docs/api.md specifies it; when hostd answers 404 `route_not_found` (or rejects a field it
 * does not know yet), the figure prints `skipped: <why>` instead of failing the run, so it
 * starts reporting once the feature is merged.
 */
import type { Results } from './util.js';

/** Thrown inside a figure's measurement to mark all its figures skipped. */
export class Skip extends Error {}

/** Throws Skip with the answer's code unless `res` is a 2xx; returns the body's text. */
export async function expectOk(res: Response, what: string): Promise<string> {
  const text = await res.text();
  if (res.ok) return text;
  let code = `http_${res.status}`;
  try {
    code = (JSON.parse(text) as { code?: string }).code ?? code;
  } catch {
    /* not JSON */
  }
  throw new Skip(`${code} (${what})`);
}

/**
 * Runs `measure`; if it throws Skip, every name in `names` is reported as `skipped: why`.
 * Other errors are reported as `error: message` so one broken feature does not end the run.
 */
export async function guarded(names: string[], measure: () => Promise<Results>): Promise<Results> {
  try {
    return await measure();
  } catch (err) {
    const why =
      err instanceof Skip
        ? `skipped: ${err.message}`
        : `error: ${(err as Error).message.split('\n')[0]!.slice(0, 200)}`;
    if (!(err instanceof Skip)) console.error(err);
    return Object.fromEntries(names.map((n) => [n, why]));
  }
}
