/**
 * Rich outputs: `display` events reach exec's iterator in order with the output lines, and
 * run() decodes them into `displays` (images as bytes, text types as strings, the raw bundle
 * kept) and hands each to `onDisplay` as it arrives.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox, toDisplay, type Display, type ExecEvent } from '../src/index.js';
import { eventLine, startFakeHostd, type FakeHostd } from './helpers/fake-hostd.js';

const ID = 'sbx_' + '6'.repeat(32);
const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 1, 2, 255]);
const FIGURE = { 'image/png': PNG.toString('base64'), 'text/plain': '<Figure size 640x480>' };
const TABLE = { 'text/html': '<table></table>', 'text/plain': '   a\n0  1' };

describe('display events', () => {
  let fake: FakeHostd;
  let sandbox: Sandbox;
  before(async () => {
    fake = await startFakeHostd(async (req, res) => {
      if (req.method === 'GET') {
        res.writeHead(200, { 'content-type': 'application/json' });
        return void res.end(JSON.stringify({ id: ID, state: 'ready' }));
      }
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(eventLine('stdout', 'before', 0));
      res.write(eventLine('display', FIGURE, 1));
      res.write(eventLine('display', TABLE, 2));
      res.end(eventLine('exit', 0, 3));
    });
    sandbox = await Sandbox.connect(ID, { baseUrl: fake.url });
  });
  after(() => fake.close());

  test('exec yields display events with their bundles, in seq order', async () => {
    const events: ExecEvent[] = [];
    for await (const e of sandbox.exec('plt.show()', { display: true })) events.push(e);
    assert.deepEqual(
      events.map((e) => [e.type, e.seq]),
      [
        ['stdout', 0],
        ['display', 1],
        ['display', 2],
        ['exit', 3],
      ],
    );
    assert.deepEqual(events[1]!.data, FIGURE);
  });

  test('run() collects displays, decoded, and calls onDisplay as each arrives', async () => {
    const seen: Display[] = [];
    const result = await sandbox.run('x', { display: true, onDisplay: (d) => seen.push(d) });
    assert.equal(result.stdout, 'before\n');
    assert.equal(result.displays.length, 2);
    const [figure, table] = result.displays;
    assert.deepEqual(figure!.png, PNG);
    assert.equal(figure!.text, '<Figure size 640x480>');
    assert.deepEqual(figure!.data, FIGURE);
    assert.equal(table!.html, '<table></table>');
    assert.equal(table!.png, undefined);
    assert.deepEqual(seen, result.displays);
  });
});

describe('toDisplay', () => {
  test('names the common MIME types and keeps the rest in data', () => {
    const bundle = {
      'text/plain': 'x',
      'text/markdown': '# x',
      'text/latex': '$x$',
      'image/svg+xml': '<svg/>',
      'image/jpeg': Buffer.from('jpeg').toString('base64'),
      'application/json': { a: [1, 2] },
      'application/vnd.custom': 'kept',
    };
    const d = toDisplay(bundle);
    assert.deepEqual(
      { ...d, jpeg: d.jpeg?.toString() },
      {
        data: bundle,
        text: 'x',
        markdown: '# x',
        latex: '$x$',
        svg: '<svg/>',
        jpeg: 'jpeg',
        json: { a: [1, 2] },
      },
    );
  });

  test('leaves a value of the wrong kind in data only', () => {
    const d = toDisplay({ 'text/plain': 'x', 'image/png': 42 });
    assert.equal(d.png, undefined);
    assert.equal(d.data['image/png'], 42);
  });
});
