/**
 * Fastify's schema compilers (ajv for validation, fast-json-stringify for serialization), loaded
 * when a route with a schema first needs one instead of when a server is made. hostd's routes
 * declare no fastify schema (bodies are checked by api/wire/check.ts), and loading the two took
 * about a third of a second of every start on a loaded host. A route that declares one gets
 * fastify's own compilers, with their defaults, exactly as without this option.
 */
import { createRequire } from 'node:module';
import type { FastifyServerOptions } from 'fastify';

type Factories = NonNullable<
  NonNullable<FastifyServerOptions['schemaController']>['compilersFactory']
>;
/** What fastify calls a factory with (external schemas, its options); both are passed on. */
type Factory = (...args: unknown[]) => unknown;

// Resolved from fastify's own folder: they are its dependencies, not ours.
const fromFastify = createRequire(createRequire(import.meta.url).resolve('fastify'));

/** A factory that loads fastify's own (`module`'s default export) at its first call. */
function loadedAtFirstUse(module: string): Factory {
  let factory: Factory | undefined;
  return (...args) => {
    factory ??= (fromFastify(module) as () => Factory)();
    return factory(...args);
  };
}

/** The `schemaController` option of every hostd server. */
export const lazySchemaCompilers: NonNullable<FastifyServerOptions['schemaController']> = {
  compilersFactory: {
    buildValidator: loadedAtFirstUse('@fastify/ajv-compiler') as Factories['buildValidator'],
    buildSerializer: loadedAtFirstUse(
      '@fastify/fast-json-stringify-compiler',
    ) as Factories['buildSerializer'],
  },
};
