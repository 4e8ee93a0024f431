/**
 * The `traceparent` header (W3C Trace Context) sent with every request: the active
 * OpenTelemetry span when `@opentelemetry/api` is installed and a span is active, so hostd's
 * work nests under the caller's trace; otherwise fresh random ids for each request.
 */
import { randomBytes } from 'node:crypto';

/** The part of `@opentelemetry/api` used here; typed locally so it stays an optional peer. */
interface OtelApi {
  context: { active(): unknown };
  trace: {
    getSpan(
      context: unknown,
    ): { spanContext(): { traceId: string; spanId: string; traceFlags: number } } | undefined;
  };
}

type OtelLoader = () => Promise<unknown>;

// A variable specifier keeps TypeScript from resolving the optional package at build time.
const OTEL_PACKAGE = '@opentelemetry/api';
const defaultLoader: OtelLoader = () => import(OTEL_PACKAGE);

let loader: OtelLoader = defaultLoader;
let otel: Promise<OtelApi | undefined> | undefined;

const TRACE_ID = /^[0-9a-f]{32}$/;
const SPAN_ID = /^[0-9a-f]{16}$/;
const ZERO = /^0+$/;

/** A traceparent for the next request. Never throws. */
export async function traceparent(): Promise<string> {
  otel ??= loadOtel();
  const fromSpan = activeSpanTraceparent(await otel);
  if (fromSpan) return fromSpan;
  return `00-${randomId(16)}-${randomId(8)}-01`;
}

/**
 * For tests: replace how `@opentelemetry/api` is loaded (`null` restores the real import) and
 * forget the cached result.
 */
export function setOtelLoaderForTests(replacement: OtelLoader | null): void {
  loader = replacement ?? defaultLoader;
  otel = undefined;
}

async function loadOtel(): Promise<OtelApi | undefined> {
  try {
    const mod = (await loader()) as Partial<OtelApi> & { default?: Partial<OtelApi> };
    const api = mod.trace && mod.context ? mod : mod.default;
    if (
      api &&
      typeof api.trace?.getSpan === 'function' &&
      typeof api.context?.active === 'function'
    ) {
      return api as OtelApi;
    }
  } catch {
    // Not installed (or broken): random ids it is.
  }
  return undefined;
}

function activeSpanTraceparent(api: OtelApi | undefined): string | undefined {
  if (!api) return undefined;
  try {
    const ctx = api.trace.getSpan(api.context.active())?.spanContext();
    if (!ctx) return undefined;
    const { traceId, spanId, traceFlags } = ctx;
    if (
      !TRACE_ID.test(traceId) ||
      ZERO.test(traceId) ||
      !SPAN_ID.test(spanId) ||
      ZERO.test(spanId)
    ) {
      return undefined;
    }
    const flags = (traceFlags & 0xff).toString(16).padStart(2, '0');
    return `00-${traceId}-${spanId}-${flags}`;
  } catch {
    return undefined;
  }
}

/** Random lowercase hex of `bytes` bytes, never all zeros (an invalid id in Trace Context). */
function randomId(bytes: number): string {
  for (;;) {
    const hex = randomBytes(bytes).toString('hex');
    if (!ZERO.test(hex)) return hex;
  }
}
