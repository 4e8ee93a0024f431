/**
 * The web console (console/ at the repository root): static ES modules and CSS served as they
 * are, so a user runs no build and loads nothing from outside the host. The files need no key:
 * they hold no data, and the console asks for the key before its first API call (which carries
 * it as `Authorization: Bearer`). Every answer carries a strict Content-Security-Policy: no
 * inline script, nothing from another origin, images only from the console itself or `data:` /
 * `blob:` URLs (charts), so output a sandbox produces cannot run script in the console's origin.
 */
import fastifyStatic from '@fastify/static';
import type { FastifyInstance } from 'fastify';
import { fileURLToPath } from 'node:url';

/** The console's files: `console/` of the checkout this module was compiled in. */
export const CONSOLE_DIR = fileURLToPath(new URL('../../../../console/', import.meta.url));

/** Where the console lives; `/` redirects there. */
export const CONSOLE_PATH = '/console/';

export const CONSOLE_CSP = [
  "default-src 'self'",
  "img-src 'self' data: blob:",
  // Rich HTML outputs render in sandboxed frames (no scripts, an opaque origin).
  "frame-src 'self' blob:",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

export async function registerConsoleRoutes(app: FastifyInstance): Promise<void> {
  for (const path of ['/', '/console']) {
    app.get(path, async (_req, reply) => reply.redirect(CONSOLE_PATH));
  }
  await app.register(async (scope) => {
    scope.addHook('onSend', async (_req, reply) => {
      void reply.header('content-security-policy', CONSOLE_CSP);
      void reply.header('x-content-type-options', 'nosniff');
      void reply.header('referrer-policy', 'no-referrer');
    });
    await scope.register(fastifyStatic, {
      root: CONSOLE_DIR,
      prefix: CONSOLE_PATH,
      // Files are not renamed per release: the browser revalidates each (a 304 by ETag), so
      // a console never runs stale code against a newer hostd.
      cacheControl: false,
      setHeaders: (reply) => void reply.header('cache-control', 'no-cache'),
      // Dot-files and anything outside console/ are never served.
      dotfiles: 'deny',
    });
  });
}
