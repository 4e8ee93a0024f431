/**
 * A node:test reporter that prints how long each test file held the run, slowest first.
 *
 * Why: CI must stay well under its 90 minute limit, and node's TAP output gives durations per
 * test but not per file, so a file's hooks (a hostd's start, its templates' boot) and a process
 * that lingers after its last test (a client's timer, a socket left open) were invisible.
 *
 * node:test reports each file as a test named by its path: dequeued when its process starts,
 * complete when that process has exited. Between the two: `head`, until its first top-level
 * test starts (loading the file; node 20 counts root-level `before` hooks, a hostd's start,
 * in the first test's own duration, not here); `tail`, from its last top-level test's end to
 * the exit (root `after` hooks, and whatever keeps the event loop alive). A tail of seconds
 * with quick after hooks is a leaked handle: a timer, a socket, a server that waits on one.
 */
import { relative } from 'node:path';

interface Span {
  file: string;
  start: number;
  end?: number;
  firstTest?: number;
  lastTest?: number;
  /** Top-level tests (and suites) that passed or failed. */
  tests: number;
  failed: number;
}

interface ReporterEvent {
  type: string;
  data?: { file?: string; name?: string; nesting?: number; details?: { duration_ms?: number } };
}

const seconds = (ms: number): string => (ms / 1000).toFixed(1).padStart(7);

export default async function* fileTimes(
  source: AsyncIterable<ReporterEvent>,
): AsyncGenerator<string> {
  const spans = new Map<string, Span>();
  for await (const event of source) {
    const now = Date.now();
    const { file, name, nesting } = event.data ?? {};
    if (!file) continue;
    const whole = name === file; // the event of the file itself, not of a test in it
    if (whole && event.type === 'test:dequeue') {
      spans.set(file, { file, start: now, tests: 0, failed: 0 });
      continue;
    }
    const span = spans.get(file);
    if (!span) continue;
    if (whole) {
      if (event.type === 'test:complete') span.end = now;
      continue;
    }
    if (nesting === 0 && (event.type === 'test:pass' || event.type === 'test:fail')) {
      // A child's events reach the runner as each test ends, its start with them: the first
      // test began its own duration before its end was reported.
      span.firstTest ??= now - (event.data?.details?.duration_ms ?? 0);
      span.lastTest = now;
      span.tests += 1;
      if (event.type === 'test:fail') span.failed += 1;
    }
  }
  const rows = [...spans.values()].map((s) => ({ ...s, wall: (s.end ?? Date.now()) - s.start }));
  rows.sort((a, b) => b.wall - a.wall);
  const total = rows.reduce((sum, r) => sum + r.wall, 0);
  yield `# per test file: wall, head (start to first test), tail (last test to exit); sum ${(total / 1000).toFixed(1)} s\n`;
  yield `#    wall     head     tail  tests  file\n`;
  for (const r of rows) {
    const head = (r.firstTest ?? r.end ?? r.start) - r.start;
    const tail = r.end !== undefined && r.lastTest !== undefined ? r.end - r.lastTest : 0;
    const fail = r.failed ? ` (${r.failed} failed)` : '';
    yield `${seconds(r.wall)}  ${seconds(head)}  ${seconds(tail)}  ${String(r.tests).padStart(5)}  ${relative(process.cwd(), r.file)}${fail}\n`;
  }
}
