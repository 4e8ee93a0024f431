/**
 * hostd's MCP server (docs/mcp.md) against real VMs, driven by the MCP SDK's own client over
 * both transports: Streamable HTTP at hostd's `/mcp`, and stdio through `sbx mcp` (the SDK's
 * CLI), plus one session of each through the MCP inspector's command-line mode, an outside
 * client. What a model would see is checked: output and tracebacks, a chart as a PNG image, a
 * DataFrame as text and HTML, state kept between calls, fork and merge, files, snapshots, and
 * the sandboxes a session made going away when it ends.
 */
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult, ContentBlock } from '@modelcontextprotocol/sdk/types.js';
import { eventually } from '../../testkit/eventually.js';
import { run } from '../../testkit/exec.js';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { ROOT } from '../../testkit/root.js';
import { createSandbox, reportFailure, sandboxInfo } from '../../testkit/sandboxes.js';

const KEY = 'mcp-test-key';
const OTHER_KEY = 'mcp-other-key';
const SDK = join(ROOT, 'sdk', 'typescript');
const CLI = join(SDK, 'dist', 'src', 'cli.js');
const INSPECTOR = join(
  ROOT,
  'node_modules',
  '@modelcontextprotocol',
  'inspector-cli',
  'build',
  'cli.js',
);
/** Under TCG on a busy host a first exec can take a while; the SDK client's default is 60 s. */
const CALL = { timeout: 300_000 };
const PNG_MAGIC = '89504e470d0a1a0a';

let hostd: Hostd;

before(async () => {
  await buildCli();
  hostd = await startHostd({
    apiKey: KEY,
    startTimeoutMs: 900_000,
    env: {
      SERVICE_API_KEYS: `${KEY},${OTHER_KEY}`,
      // python-slim, the default, for everything but the chart, which needs the data stack.
      SERVICE_TEMPLATES: 'python-slim:pool=1,python:pool=1',
    },
  });
});

after(async () => {
  if (!hostd) return;
  // Whatever a failed test left (sandboxes are the sessions', snapshots outlive them).
  const { body } = await hostd.json<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes');
  for (const s of body?.sandboxes ?? []) await hostd.request('DELETE', `/v1/sandboxes/${s.id}`);
  const snaps = await hostd.json<{ snapshots: { snapshot_id: string }[] }>('GET', '/v1/snapshots');
  for (const s of snaps.body?.snapshots ?? []) {
    await hostd.request('DELETE', `/v1/snapshots/${s.snapshot_id}`);
  }
  await hostd.stop();
});

/**
 * `sbx mcp` runs the SDK's built CLI: sdk/test.sh builds it before these tests in `npm test`;
 * run alone, this builds it when a source is newer than the build.
 */
async function buildCli(): Promise<void> {
  const newest = (dir: string): number =>
    Math.max(
      0,
      ...readdirSync(dir, { withFileTypes: true }).map((e) =>
        e.isDirectory() ? newest(join(dir, e.name)) : statSync(join(dir, e.name)).mtimeMs,
      ),
    );
  let built = 0;
  try {
    built = statSync(CLI).mtimeMs;
  } catch {
    // not built
  }
  if (built > newest(join(SDK, 'src'))) return;
  await promisify(execFile)(join(ROOT, 'node_modules', '.bin', 'tsc'), ['-p', SDK], {
    cwd: ROOT,
  });
}

/** Runs a test's body; on failure prints every sandbox still alive and hostd's log tail. */
async function reporting(fn: () => Promise<void>): Promise<void> {
  try {
    await fn();
  } catch (err) {
    const { body } = await hostd.json<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes');
    for (const s of body?.sandboxes ?? []) await reportFailure(hostd, s.id);
    if ((body?.sandboxes ?? []).length === 0) console.error(hostd.logs.slice(-30).join('\n'));
    throw err;
  }
}

interface Session {
  client: Client;
  /** Ends the session as its client would: DELETE over HTTP, closing stdin over stdio. */
  end(): Promise<void>;
}

async function overHttp(
  key = KEY,
): Promise<Session & { transport: StreamableHTTPClientTransport }> {
  const transport = new StreamableHTTPClientTransport(new URL(`${hostd.url}/mcp`), {
    requestInit: { headers: { authorization: `Bearer ${key}` } },
  });
  const client = new Client({ name: 'hostd-test', version: '0' });
  await client.connect(transport);
  return {
    client,
    transport,
    async end() {
      await transport.terminateSession();
      await client.close();
    },
  };
}

async function overStdio(
  args: string[] = [],
): Promise<Session & { transport: StdioClientTransport; stderr: () => string }> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [CLI, 'mcp', ...args],
    env: { PATH: process.env.PATH ?? '', SERVICE_HOSTD_URL: hostd.url, SERVICE_API_KEY: KEY },
    stderr: 'pipe',
  });
  let stderr = '';
  transport.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  const client = new Client({ name: 'hostd-test', version: '0' });
  await client.connect(transport);
  return { client, transport, stderr: () => stderr, end: () => client.close() };
}

async function call(
  session: Session,
  name: string,
  args: Record<string, unknown> = {},
): Promise<CallToolResult> {
  return (await session.client.callTool(
    { name, arguments: args },
    undefined,
    CALL,
  )) as CallToolResult;
}

/** The text blocks of a result, joined. */
function text(result: CallToolResult): string {
  return result.content
    .filter((b): b is Extract<ContentBlock, { type: 'text' }> => b.type === 'text')
    .map((b) => b.text)
    .join('');
}

/** The sandbox a run_code result says it ran in. */
function ranIn(result: CallToolResult): string {
  const id = /sandbox (sbx_[0-9a-f]{32})/.exec(text(result))?.[1];
  assert.ok(id, `no sandbox named in ${text(result)}`);
  return id;
}

async function exists(id: string): Promise<boolean> {
  return (await hostd.request('GET', `/v1/sandboxes/${id}`)).status === 200;
}

describe('over Streamable HTTP at /mcp', { timeout: 900_000 }, () => {
  test('the tools and their schemas are listed', () =>
    reporting(async () => {
      const s = await overHttp();
      try {
        const { tools } = await s.client.listTools();
        assert.deepEqual(tools.map((t) => t.name).sort(), [
          'create_sandbox',
          'delete_sandboxes',
          'fork_sandbox',
          'list_files',
          'list_sandboxes',
          'list_snapshots',
          'list_templates',
          'merge_sandbox',
          'read_file',
          'run_code',
          'snapshot_sandbox',
          'write_file',
        ]);
        assert.equal(s.client.getServerVersion()?.name, 'hostd');
        assert.match(s.client.getInstructions() ?? '', /run_code/);
        const templates = await call(s, 'list_templates');
        const names = (templates.structuredContent as { templates: { name: string }[] }).templates;
        assert.deepEqual(
          names.map((t) => t.name),
          ['python-slim', 'python'],
        );
      } finally {
        await s.end();
      }
    }));

  test('run_code keeps state in the default sandbox; an exception is an error with its traceback; bash runs', () =>
    reporting(async () => {
      const s = await overHttp();
      try {
        const first = await call(s, 'run_code', { code: 'x = 41\nprint("ready")' });
        assert.equal(first.isError, undefined, text(first));
        assert.match(
          text(first),
          /^ready\n\[new sandbox sbx_[0-9a-f]{32} \(template python-slim\)/,
        );
        const id = ranIn(first);

        const second = await call(s, 'run_code', { code: 'x + 1' });
        assert.match(text(second), /^42\n/, 'the last expression is shown, x survived');
        assert.equal(ranIn(second), id, 'no id: the same default sandbox');

        const failed = await call(s, 'run_code', { code: 'def f():\n    return 1 / 0\nf()' });
        assert.equal(failed.isError, true);
        assert.match(text(failed), /Traceback \(most recent call last\)[\s\S]*ZeroDivisionError/);
        assert.match(text(failed), /exit code 1/);

        const bash = await call(s, 'run_code', {
          code: 'echo "$((6 * 7))" && exit 3',
          language: 'bash',
          sandbox_id: id,
        });
        assert.equal(bash.isError, true, 'a non-zero exit is an error');
        assert.match(text(bash), /^42\n[\s\S]*exit code 3/);

        const lines: string[] = [];
        await s.client.callTool(
          { name: 'run_code', arguments: { code: 'print("streamed")', sandbox_id: id } },
          undefined,
          { ...CALL, onprogress: (p) => void (p.message && lines.push(p.message)) },
        );
        assert.deepEqual(lines, ['streamed'], 'output lines come as progress notifications');
      } finally {
        await s.end();
      }
    }));

  test('a chart comes back as a PNG image and a DataFrame as text and HTML', () =>
    reporting(async () => {
      const s = await overHttp();
      try {
        const chart = await call(s, 'run_code', {
          template: 'python',
          code: [
            'import matplotlib.pyplot as plt, pandas as pd',
            'plt.plot([1, 2, 3], [1, 4, 9])',
            'plt.title("squares")',
            'plt.show()',
            'pd.DataFrame({"n": [1, 2, 3], "square": [1, 4, 9]})',
          ].join('\n'),
        });
        assert.equal(chart.isError, undefined, text(chart));
        const image = chart.content.find((b) => b.type === 'image');
        assert.ok(image && image.type === 'image', 'the figure is an image block');
        assert.equal(image.mimeType, 'image/png');
        assert.equal(Buffer.from(image.data, 'base64').subarray(0, 8).toString('hex'), PNG_MAGIC);
        assert.match(text(chart), /n\s+square\n0\s+1\s+1\n1\s+2\s+4\n2\s+3\s+9/);
        const html = chart.content.find((b) => b.type === 'resource');
        assert.ok(html && html.type === 'resource');
        assert.equal(html.resource.mimeType, 'text/html');
        assert.match((html.resource as { text: string }).text, /<table[\s\S]*<td>9<\/td>/);
        assert.match(text(chart), /template python\)/);
      } finally {
        await s.end();
      }
    }));

  test('output past the limit is cut in the middle with a note', () =>
    reporting(async () => {
      const s = await overHttp();
      try {
        // 400 lines of 102 characters (newline included): 40 800, 10 800 over the limit.
        const big = await call(s, 'run_code', {
          code: 'for i in range(400):\n    print(f"line {i:05d} " + "x" * 90)',
        });
        const out = text(big);
        assert.ok(out.startsWith(`line 00000 ${'x'.repeat(90)}\n`));
        assert.match(out, /line 00399 x{90}\n/);
        assert.match(out, /\[\.\.\. 10800 characters of output omitted here/);
        assert.ok(out.length < 32_000, `${out.length} characters came back`);
      } finally {
        await s.end();
      }
    }));

  test('fork into children, merge the winner, delete the rest', () =>
    reporting(async () => {
      const s = await overHttp();
      try {
        const id = ranIn(await call(s, 'run_code', { code: 'score = 0' }));
        const fork = await call(s, 'fork_sandbox', { sandbox_id: id, n: 2 });
        assert.equal(fork.isError, undefined, text(fork));
        const { children } = fork.structuredContent as { children: string[] };
        assert.equal(children.length, 2);
        const [winner, loser] = children as [string, string];
        await call(s, 'run_code', { code: 'score = 10', sandbox_id: winner });
        await call(s, 'run_code', { code: 'score = 20', sandbox_id: loser });
        assert.match(
          text(await call(s, 'run_code', { code: 'score' })),
          /^0\n/,
          'the parent is untouched',
        );

        const merged = await call(s, 'merge_sandbox', { sandbox_id: id, winner_id: winner });
        assert.deepEqual(merged.structuredContent, { sandbox_id: id, merged: winner });
        assert.match(text(await call(s, 'run_code', { code: 'score' })), /^10\n/);
        const gone = await call(s, 'run_code', { code: 'score', sandbox_id: winner });
        assert.equal(gone.isError, true);
        assert.match(text(gone), /sandbox_not_found/);

        const deleted = await call(s, 'delete_sandboxes', { sandbox_ids: [loser] });
        assert.deepEqual(deleted.structuredContent, {
          deleted: [loser],
          not_found: [],
          failed: [],
        });
        assert.equal(await exists(loser), false);
      } finally {
        await s.end();
      }
    }));

  test('files: write, read back as text and as an image, list', () =>
    reporting(async () => {
      const s = await overHttp();
      try {
        const created = await call(s, 'create_sandbox', {});
        const id = (created.structuredContent as { sandbox_id: string }).sandbox_id;
        const written = await call(s, 'write_file', {
          sandbox_id: id,
          path: '/root/data/notes.txt',
          content: 'héllo\nwörld\n',
        });
        assert.deepEqual(written.structuredContent, { path: '/root/data/notes.txt', size: 14 });
        const png = Buffer.from(`${PNG_MAGIC}0000000d49484452`, 'hex');
        await call(s, 'write_file', {
          sandbox_id: id,
          path: '/root/data/dot.png',
          content: png.toString('base64'),
          encoding: 'base64',
        });
        const read = await call(s, 'read_file', { sandbox_id: id, path: '/root/data/notes.txt' });
        assert.equal(text(read), 'héllo\nwörld\n');
        const image = await call(s, 'read_file', { sandbox_id: id, path: '/root/data/dot.png' });
        assert.deepEqual(image.content[0], {
          type: 'image',
          data: png.toString('base64'),
          mimeType: 'image/png',
        });
        const listed = await call(s, 'list_files', { sandbox_id: id, path: '/root/data' });
        const { entries } = listed.structuredContent as {
          entries: { name: string; type: string }[];
        };
        assert.deepEqual(
          entries.map((e) => [e.name, e.type]),
          [
            ['dot.png', 'file'],
            ['notes.txt', 'file'],
          ],
        );
        const python = await call(s, 'run_code', {
          code: 'print(open("/root/data/notes.txt").read().split())',
          sandbox_id: id,
        });
        assert.match(text(python), /\['héllo', 'wörld'\]/, 'code sees the written file');
        const missing = await call(s, 'read_file', { sandbox_id: id, path: '/root/nope.txt' });
        assert.equal(missing.isError, true);
        assert.match(text(missing), /file_not_found/);
      } finally {
        await s.end();
      }
    }));

  test('snapshot a sandbox and create another from the snapshot', () =>
    reporting(async () => {
      const s = await overHttp();
      let snapshot = '';
      try {
        const id = ranIn(await call(s, 'run_code', { code: 'saved = "state"' }));
        const snap = await call(s, 'snapshot_sandbox', { sandbox_id: id });
        assert.equal(snap.isError, undefined, text(snap));
        snapshot = (snap.structuredContent as { snapshot_id: string }).snapshot_id;
        const listed = await call(s, 'list_snapshots');
        assert.ok(
          (listed.structuredContent as { snapshots: { snapshot_id: string }[] }).snapshots.some(
            (x) => x.snapshot_id === snapshot,
          ),
        );
        const copy = await call(s, 'create_sandbox', { snapshot_id: snapshot });
        const copyId = (copy.structuredContent as { sandbox_id: string }).sandbox_id;
        assert.notEqual(copyId, id);
        assert.match(
          text(await call(s, 'run_code', { code: 'saved', sandbox_id: copyId })),
          /^'state'\n/,
        );
      } finally {
        await s.end();
        if (snapshot) await hostd.request('DELETE', `/v1/snapshots/${snapshot}`);
      }
    }));

  test('ending the session deletes the sandboxes it created and leaves the others', () =>
    reporting(async () => {
      const theirs = await createSandbox(hostd);
      try {
        const s = await overHttp();
        const own = ranIn(await call(s, 'run_code', { code: 'x = 1' }));
        await call(s, 'run_code', { code: 'y = 2', sandbox_id: theirs });
        const list = await call(s, 'list_sandboxes');
        const rows = (
          list.structuredContent as { sandboxes: { sandbox_id: string; this_session: boolean }[] }
        ).sandboxes;
        assert.deepEqual(
          rows.filter((r) => r.this_session).map((r) => r.sandbox_id),
          [own],
        );
        await s.end();
        assert.equal(await exists(own), false, 'deleted before DELETE /mcp answered');
        assert.equal((await sandboxInfo(hostd, theirs)).state, 'ready');
      } finally {
        await hostd.request('DELETE', `/v1/sandboxes/${theirs}`);
      }
    }));

  test('/mcp takes the API key of /v1, and a session answers only the key that started it', () =>
    reporting(async () => {
      const init = {
        jsonrpc: '2.0',
        id: 0,
        method: 'initialize',
        params: {
          protocolVersion: '2025-06-18',
          capabilities: {},
          clientInfo: { name: 'x', version: '0' },
        },
      };
      const headers = {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
      };
      const anonymous = await fetch(`${hostd.url}/mcp`, {
        method: 'POST',
        headers,
        body: JSON.stringify(init),
      });
      assert.equal(anonymous.status, 401);
      assert.equal(((await anonymous.json()) as { code: string }).code, 'missing_api_key');
      const wrong = await fetch(`${hostd.url}/mcp`, {
        method: 'POST',
        headers: { ...headers, authorization: 'Bearer nope' },
        body: JSON.stringify(init),
      });
      assert.equal(wrong.status, 401);
      assert.equal(((await wrong.json()) as { code: string }).code, 'invalid_api_key');

      const s = await overHttp(KEY);
      try {
        const other = await fetch(`${hostd.url}/mcp`, {
          method: 'POST',
          headers: {
            ...headers,
            authorization: `Bearer ${OTHER_KEY}`,
            'mcp-session-id': s.transport.sessionId!,
            'mcp-protocol-version': '2025-06-18',
          },
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
        });
        assert.equal(other.status, 404, "another key cannot drive this key's session");
        await other.body?.cancel();
      } finally {
        await s.end();
      }
    }));
});

describe('over stdio through sbx mcp', { timeout: 900_000 }, () => {
  test('the same tools; closing stdin deletes the sandboxes the session created', () =>
    reporting(async () => {
      const s = await overStdio();
      const first = await call(s, 'run_code', { code: 'x = 6 * 7\nx' });
      assert.match(text(first), /^42\n\[new sandbox/);
      const id = ranIn(first);
      const fork = await call(s, 'fork_sandbox', { sandbox_id: id, n: 1 });
      const [child] = (fork.structuredContent as { children: string[] }).children as [string];
      assert.match(text(await call(s, 'run_code', { code: 'x', sandbox_id: child })), /^42\n/);
      // Closing stdin is how a host ends a stdio server.
      await s.end();
      await eventually(
        'the session to delete its sandboxes',
        async () => !(await exists(id)) && !(await exists(child)),
      );
      assert.match(s.stderr(), /session ended: 2 sandbox\(es\) deleted/);
    }));

  test('--session-end pause keeps the sandboxes paused; SIGTERM ends the session too', () =>
    reporting(async () => {
      const s = await overStdio(['--session-end', 'pause']);
      const id = ranIn(await call(s, 'run_code', { code: 'kept = True' }));
      const pid = s.transport.pid!;
      process.kill(pid, 'SIGTERM');
      await eventually(
        'sbx mcp to pause its sandbox and exit',
        async () => {
          try {
            process.kill(pid, 0);
            return false;
          } catch {
            return true;
          }
        },
        { timeoutMs: 120_000, everyMs: 50 },
      );
      await s.client.close();
      try {
        assert.equal((await sandboxInfo(hostd, id)).state, 'paused');
        const { stdout } = await run(hostd, id, 'print(kept)');
        assert.equal(stdout, 'True\n', 'resumed with its state');
      } finally {
        await hostd.request('DELETE', `/v1/sandboxes/${id}`);
      }
    }));
});

describe(
  'one session through the MCP inspector CLI, an outside client',
  { timeout: 900_000 },
  () => {
    test('over stdio (sbx mcp) and over HTTP (/mcp)', () =>
      reporting(async () => {
        const stdio = await inspector([
          process.execPath,
          CLI,
          'mcp',
          '-e',
          `SERVICE_HOSTD_URL=${hostd.url}`,
          '-e',
          `SERVICE_API_KEY=${KEY}`,
          '--method',
          'tools/call',
          '--tool-name',
          'run_code',
          '--tool-arg',
          'code=print(6 * 7)',
        ]);
        assert.match(stdio.content[0]?.type === 'text' ? stdio.content[0].text : '', /^42\n/);

        const listed = (await inspector([
          `${hostd.url}/mcp`,
          '--transport',
          'http',
          '--header',
          `Authorization: Bearer ${KEY}`,
          '--method',
          'tools/list',
        ])) as unknown as { tools: { name: string }[] };
        assert.ok(listed.tools.some((t) => t.name === 'run_code'));
        const http = await inspector([
          `${hostd.url}/mcp`,
          '--transport',
          'http',
          '--header',
          `Authorization: Bearer ${KEY}`,
          '--method',
          'tools/call',
          '--tool-name',
          'run_code',
          '--tool-arg',
          'code=import sys; print(sys.version_info[0])',
        ]);
        assert.match(http.content[0]?.type === 'text' ? http.content[0].text : '', /^3\n/);
        // The inspector ends its stdio server when done, which deletes the session's sandbox. (Its
        // HTTP session stays open until it expires: the inspector sends no DELETE.)
        const stdioSandbox = ranIn(stdio);
        await eventually(
          'the stdio session to delete its sandbox',
          async () => !(await exists(stdioSandbox)),
        );
        assert.ok(await exists(ranIn(http)));
      }));
  },
);

/**
 * Runs the inspector's CLI mode (`inspector --cli ARGS`) and parses the JSON it prints. From its
 * own build directory: the CLI looks for its package.json relative to the working directory
 * (and imports it relative to itself), which only agree there when it is installed on its own.
 */
async function inspector(args: string[]): Promise<CallToolResult> {
  const child = spawn(process.execPath, [INSPECTOR, '--cli', ...args], {
    cwd: dirname(INSPECTOR),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  assert.equal(code, 0, `inspector exited ${code}\nstdout:\n${stdout}\nstderr:\n${stderr}`);
  return JSON.parse(stdout.slice(stdout.indexOf('{'))) as CallToolResult;
}
