/**
 * The code interpreter's lines (src/api/e2b/interpreter-lines.ts): native notebook events as
 * E2B's `/execute` writes them, field for field as @e2b/code-interpreter reads them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ExecEvent } from '../../src/core/exec-run.js';
import { e2bLines, e2bResult, reasonPhrase } from '../../src/api/e2b/interpreter-lines.js';

const at = (e: Omit<ExecEvent, 'seq' | 'ts'>): ExecEvent => ({
  ...e,
  seq: 0,
  ts: Date.UTC(2026, 0, 2),
});

test('output lines get their newline back, except a partial one', () => {
  assert.deepEqual(e2bLines(at({ type: 'stdout', data: 'hello' })), [
    { type: 'stdout', text: 'hello\n', timestamp: '2026-01-02T00:00:00.000Z' },
  ]);
  assert.equal(e2bLines(at({ type: 'stderr', data: 'no nl', partial: true }))[0]!.text, 'no nl');
});

test('the count, the error and an executor failure', () => {
  assert.deepEqual(e2bLines(at({ type: 'execution_count', data: 3 })), [
    { type: 'number_of_executions', execution_count: 3 },
  ]);
  const error = { name: 'NameError', value: "name 'x' is not defined", traceback: 'Traceback' };
  assert.deepEqual(e2bLines(at({ type: 'error', data: error })), [{ type: 'error', ...error }]);
  assert.deepEqual(e2bLines(at({ type: 'exit', data: 1 })), []);
  assert.deepEqual(e2bLines(at({ type: 'exit', data: -1, error: 'the VM exited' })), [
    { type: 'error', name: 'UnexpectedEndOfExecution', value: 'the VM exited', traceback: '' },
  ]);
});

test('bundles become results with E2B field names; the rest is extra', () => {
  const chart = { type: 'line', title: null, elements: [] };
  assert.deepEqual(
    e2bResult(
      {
        'text/plain': "'abc'",
        'text/html': '<b>',
        'image/png': 'iVBOR',
        'application/json': [1],
        'application/vnd.hostd.dataframe+json': { a: [1] },
        'application/vnd.hostd.chart+json': chart,
        'application/x-custom': 'c',
      },
      true,
    ),
    {
      type: 'result',
      is_main_result: true,
      text: 'abc',
      html: '<b>',
      png: 'iVBOR',
      json: [1],
      data: { a: [1] },
      chart,
      extra: { 'application/x-custom': 'c' },
    },
  );
  assert.deepEqual(e2bLines(at({ type: 'display', data: { 'text/plain': '"q"' } })), [
    { type: 'result', is_main_result: false, text: 'q', extra: {} },
  ]);
  assert.equal(e2bResult({ 'text/plain': "'a' + 'b'" }, true).text, "a' + 'b", 'as E2B strips');
});

test('an error message becomes a reason phrase Node sends as it is', () => {
  assert.equal(reasonPhrase('a\nb\u00e9c'), 'a b c');
  assert.equal(reasonPhrase('x'.repeat(300)).length, 200);
});
