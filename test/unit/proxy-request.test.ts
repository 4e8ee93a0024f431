import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  MAX_HEAD_BYTES,
  parseProxyRequest,
  proxyAnswer,
} from '../../src/vm/channels/proxy-request.js';

const parse = (text: string): ReturnType<typeof parseProxyRequest> =>
  parseProxyRequest(Buffer.from(text, 'latin1'));

test('CONNECT names host and port; bytes after the head are kept', () => {
  assert.deepEqual(
    parse('CONNECT Example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n\x16\x03'),
    {
      kind: 'connect',
      host: 'example.com',
      port: 443,
      rest: Buffer.from('\x16\x03', 'latin1'),
    },
  );
  const v6 = parse('CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n');
  assert.equal(v6?.kind === 'connect' && v6.host, '2001:db8::1');
});

test('an incomplete head is waited for; an endless one is refused with 431', () => {
  assert.equal(parse('CONNECT example.com:443 HTTP/1.1\r\nHost: x'), null);
  const endless = parse('GET http://x/ HTTP/1.1\r\nX: ' + 'a'.repeat(MAX_HEAD_BYTES));
  assert.equal(endless?.kind === 'invalid' && endless.status, 431);
});

test('absolute-form requests are forwarded in origin form, Host from the URL, Connection: close', () => {
  const request = parse(
    'POST http://api.example:8080/v1/x?q=1#frag HTTP/1.1\r\n' +
      'Host: other.example\r\n' +
      'Proxy-Connection: keep-alive\r\n' +
      'Proxy-Authorization: Basic eA==\r\n' +
      'Connection: keep-alive, X-Secret\r\n' +
      'X-Secret: 1\r\n' +
      'Content-Length: 4\r\n' +
      'User-Agent: test\r\n\r\nbody',
  );
  assert.equal(request?.kind, 'forward');
  if (request?.kind !== 'forward') return;
  assert.equal(request.host, 'api.example');
  assert.equal(request.port, 8080);
  assert.equal(
    request.head.toString('latin1'),
    'POST /v1/x?q=1 HTTP/1.1\r\nHost: api.example:8080\r\nContent-Length: 4\r\n' +
      'User-Agent: test\r\nConnection: close\r\n\r\n',
  );
  assert.equal(request.rest.toString(), 'body');
});

test('a URL without a path or port gets / and 80', () => {
  const request = parse('GET http://example.com HTTP/1.0\n\n');
  assert.ok(request?.kind === 'forward');
  assert.equal(request.port, 80);
  assert.ok(request.head.toString().startsWith('GET / HTTP/1.0\r\nHost: example.com\r\n'));
  const query = parse('GET http://example.com?a=b HTTP/1.1\r\n\r\n');
  assert.ok(query?.kind === 'forward' && query.head.toString().startsWith('GET /?a=b '));
});

test('what a proxy does not take is a 400 (or 505), never a relayed request', () => {
  const refused: [string, number][] = [
    ['GET /path HTTP/1.1\r\n\r\n', 400],
    ['GET https://example.com/ HTTP/1.1\r\n\r\n', 400],
    ['GET ftp://example.com/ HTTP/1.1\r\n\r\n', 400],
    ['GET http://user:pw@example.com/ HTTP/1.1\r\n\r\n', 400],
    ['GET http://exa mple.com/ HTTP/1.1\r\n\r\n', 400],
    ['GET http://example.com:0/ HTTP/1.1\r\n\r\n', 400],
    ['GET http://example.com:99999/ HTTP/1.1\r\n\r\n', 400],
    ['CONNECT example.com HTTP/1.1\r\n\r\n', 400],
    ['CONNECT [::1 HTTP/1.1\r\n\r\n', 400],
    ['CONNECT [fe80::1%eth0]:443 HTTP/1.1\r\n\r\n', 400],
    ['garbage\r\n\r\n', 400],
    ['GET http://example.com/ HTTP/2.0\r\n\r\n', 505],
    ['GET http://example.com/ HTTP/1.1\r\nno colon here\r\n\r\n', 400],
    ['GET http://example.com/ HTTP/1.1\r\nBad Name: x\r\n\r\n', 400],
  ];
  for (const [text, status] of refused) {
    const request = parse(text);
    assert.equal(request?.kind === 'invalid' && request.status, status, JSON.stringify(text));
  }
});

test('answers carry the status, a text reason, and the egress marker header', () => {
  const answer = proxyAnswer(403, 'example.org:443 is not allowed').toString();
  assert.ok(answer.startsWith('HTTP/1.1 403 Forbidden\r\n'));
  assert.ok(answer.includes('\r\nX-Hostd-Egress: refused\r\n'));
  assert.ok(answer.includes('\r\nConnection: close\r\n'));
  const body = answer.slice(answer.indexOf('\r\n\r\n') + 4);
  assert.equal(body, 'hostd: example.org:443 is not allowed\n');
  assert.ok(answer.includes(`\r\nContent-Length: ${Buffer.byteLength(body)}\r\n`));
  assert.ok(proxyAnswer(502, 'x').toString().includes('X-Hostd-Egress: failed'));
});
