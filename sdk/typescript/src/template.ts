/**
 * `Template`: the guest environments a server offers (`python`, `python-slim`, users' own), with
 * their build state and resources. Pick one with `Sandbox.create({ template })`.
 */
import { resolveConfig, type CallOptions, type ConnectionOptions } from './config.js';
import { requestJson } from './http.js';
import type { TemplateInfo } from './types.js';

export class Template {
  private constructor() {}

  /**
   * Every template, in the server's order: the first is the default.
   *
   * @example
   * const ready = (await Template.list()).filter((t) => t.state === 'ready');
   */
  static async list(opts: ConnectionOptions & CallOptions = {}): Promise<TemplateInfo[]> {
    const body = await requestJson<{ templates: TemplateInfo[] }>(resolveConfig(opts), {
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
}
