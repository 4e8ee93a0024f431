/**
 * The code interpreter's NDJSON lines (docs/e2b.md, Code interpreter): a native notebook exec's
 * events (docs/api.md, Notebook mode) as E2B's `/execute` writes them. The front runs the same
 * exec as the native API and only renames: `execution_count` is `number_of_executions`, a
 * stdout line gets its newline back, `display` and `result` are E2B results with
 * `is_main_result`, their MIME bundles keyed by E2B's field names.
 */
import type { ExecEvent } from '../../core/exec-run.js';

/** MIME type -> E2B's result field (the rest goes to `extra`). */
const FIELDS: readonly (readonly [string, string])[] = [
  ['text/plain', 'text'],
  ['text/html', 'html'],
  ['text/markdown', 'markdown'],
  ['image/svg+xml', 'svg'],
  ['image/png', 'png'],
  ['image/jpeg', 'jpeg'],
  ['application/pdf', 'pdf'],
  ['text/latex', 'latex'],
  ['application/json', 'json'],
  ['application/javascript', 'javascript'],
  ['application/vnd.hostd.dataframe+json', 'data'],
  ['application/vnd.hostd.chart+json', 'chart'],
];

/** One line of E2B's `/execute` stream. */
export type E2bLine = Record<string, unknown> & { type: string };

/**
 * E2B's `result` for a MIME bundle. `text` is the value's repr with the quotes of a string
 * stripped, as E2B's server does (`'abc'` is `abc`); `extra` holds the types E2B has no field for.
 */
export function e2bResult(bundle: Readonly<Record<string, unknown>>, isMain: boolean): E2bLine {
  const line: E2bLine = { type: 'result', is_main_result: isMain };
  const extra: Record<string, unknown> = {};
  const named = new Map(FIELDS);
  for (const [mime, value] of Object.entries(bundle)) {
    if (value === null || value === undefined) continue;
    const field = named.get(mime);
    if (field === undefined) extra[mime] = value;
    else line[field] = field === 'text' ? unquote(String(value)) : value;
  }
  line.extra = extra;
  return line;
}

function unquote(text: string): string {
  const quoted =
    (text.startsWith("'") && text.endsWith("'")) || (text.startsWith('"') && text.endsWith('"'));
  return quoted ? text.slice(1, -1) : text;
}

/**
 * The E2B lines of one native exec event; none for the exit (the route ends the stream with
 * `end_of_execution`) unless hostd could not finish the exec (the VM died): that is an error,
 * as E2B reports a kernel it lost.
 */
export function e2bLines(event: ExecEvent): E2bLine[] {
  const timestamp = new Date(event.ts).toISOString();
  switch (event.type) {
    case 'execution_count':
      return [{ type: 'number_of_executions', execution_count: event.data }];
    case 'stdout':
    case 'stderr':
      // One line per event: the newline the native event leaves out comes back
      return [
        { type: event.type, text: `${String(event.data)}${event.partial ? '' : '\n'}`, timestamp },
      ];
    case 'display':
    case 'result':
      return [e2bResult(event.data as Record<string, unknown>, event.type === 'result')];
    case 'error': {
      const { name, value, traceback } = event.data as Record<string, string>;
      return [{ type: 'error', name, value, traceback }];
    }
    case 'exit':
      return event.error === undefined
        ? []
        : [{ type: 'error', name: 'UnexpectedEndOfExecution', value: event.error, traceback: '' }];
  }
}

/**
 * An HTTP reason phrase saying `message`, for error answers whose body the code interpreter
 * SDKs do not read: printable ASCII (what Node lets through), one line, at most 200 characters.
 */
export function reasonPhrase(message: string): string {
  const phrase = message.replace(/[^\x20-\x7e]+/g, ' ').trim();
  return phrase.length > 200 ? `${phrase.slice(0, 197)}...` : phrase;
}
