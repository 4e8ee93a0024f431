/**
 * `Template`: the guest environments a server offers (`python`, `python-slim`, users' own), with
 * their build state and resources. Pick one with `Sandbox.create({ template })`.
 */
import { resolveConfig, type CallOptions, type ConnectionOptions } from './config.js';
import { requestJson, requestText } from './http.js';
import type { TemplateInfo } from './types.js';
import type { components } from './wire.gen.js';

export class Template {
  private constructor() {}

  /**
   * Every template, in the server's order: the first is the default.
   *
   * @example
   * const ready = (await Template.list()).filter((t) => t.state === 'ready');
   */
  static async list(opts: ConnectionOptions & CallOptions = {}): Promise<TemplateInfo[]> {
    const body = await requestJson<components['schemas']['TemplateList']>(resolveConfig(opts), {
      method: 'GET',
      path: '/v1/templates',
      signal: opts.signal,
    });
    return body.templates;
  }

  /** The template `name`; TemplateNotFoundError if the server has none by that name. */
  static async get(
    name: string,
    opts: ConnectionOptions & CallOptions = {},
  ): Promise<TemplateInfo> {
    return requestJson<TemplateInfo>(resolveConfig(opts), {
      method: 'GET',
      path: `/v1/templates/${encodeURIComponent(name)}`,
      signal: opts.signal,
    });
  }

  /**
   * The end of template `name`'s last build log: what each build step printed, for a template
   * that failed (its `error` quotes only the last lines) or is still building. Empty when it was
   * never built on that server.
   *
   * @example
   * const broken = (await Template.list()).find((t) => t.state === 'failed');
   * if (broken) console.log(await Template.log(broken.name));
   */
  static async log(name: string, opts: ConnectionOptions & CallOptions = {}): Promise<string> {
    return requestText(resolveConfig(opts), {
      method: 'GET',
      path: `/v1/templates/${encodeURIComponent(name)}/log`,
      accept: 'text/plain',
      signal: opts.signal,
    });
  }
}
