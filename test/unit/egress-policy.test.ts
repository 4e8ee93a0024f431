import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  EgressRuleError,
  INTERNAL_HOST,
  MAX_RULES,
  NO_NETWORK,
  checkEgressAddresses,
  checkEgressName,
  egressGate,
  hostName,
  parseEgressRules,
} from '../../src/core/egress-policy.js';
import { formatIp, parseIp, parseRange, specialRange } from '../../src/core/ip-address.js';

const env = { apiPort: 7070, hostAddresses: ['192.0.2.10', '2001:db8::10'] };

/** Whether `rules` let a connection to host:port reach `address` (both steps agreeing). */
function reaches(rules: string[], host: string, port: number, address: string): boolean {
  const parsed = parseEgressRules(rules);
  if (!checkEgressName(parsed, env, host, port).allow) return false;
  const verdict = checkEgressAddresses(parsed, env, host, port, [address]);
  return verdict.allow && verdict.addresses.includes(address);
}

test('rules parse into kinds, ports and normalised names', () => {
  const rules = parseEgressRules([
    '*',
    'Example.COM',
    'example.com:443',
    '*.example.com',
    '*.example.com:8443',
    '203.0.113.0/24',
    '203.0.113.0/24:443',
    '203.0.113.7',
    '203.0.113.7:80',
    '2001:db8::/32',
    '2001:db8::7',
    '[2001:db8::7]',
    '[2001:db8::7]:8080',
    '[2001:db8::/32]:443',
    'host.hostd.internal:5432',
    'bücher.de',
    'trailing.dot.',
  ]);
  assert.deepEqual(
    rules.map((r) => [r.kind, 'port' in r ? r.port : undefined]),
    [
      ['any', undefined],
      ['host', null],
      ['host', 443],
      ['subdomains', null],
      ['subdomains', 8443],
      ['range', null],
      ['range', 443],
      ['range', null],
      ['range', 80],
      ['range', null],
      ['range', null],
      ['range', null],
      ['range', 8080],
      ['range', 443],
      ['internal', 5432],
      ['host', null],
      ['host', null],
    ],
  );
  assert.equal(rules[1]!.kind === 'host' && rules[1]!.host, 'example.com');
  assert.equal(rules[15]!.kind === 'host' && rules[15]!.host, 'xn--bcher-kva.de');
  assert.equal(rules[16]!.kind === 'host' && rules[16]!.host, 'trailing.dot');
  assert.equal(rules[0]!.text, '*', 'each rule keeps its text, for messages and the API');
});

test('bad rules are refused with an error naming the rule and its index', () => {
  const bad = [
    '',
    ' example.com',
    'exa mple.com',
    '*foo.com',
    'foo.*.com',
    '*.',
    '**',
    'example.com:',
    'example.com:0',
    'example.com:65536',
    'example.com:http',
    'host.hostd.internal',
    '203.0.113.0/33',
    '203.0.113.256',
    '2001:db8::/129',
    '[2001:db8::7',
    '[2001:db8::7]x',
    '[203.0.113.7]:80',
    '1.2.3',
    '127.1',
    'exa$mple.com',
    '-leading.com',
    'a'.repeat(64) + '.com',
    'fe80::1%eth0',
    'x'.repeat(301),
  ];
  for (const rule of bad) {
    assert.throws(
      () => parseEgressRules(['example.org', rule]),
      (err: unknown) => {
        assert.ok(err instanceof EgressRuleError, `${rule} should be refused`);
        assert.equal(err.index, 1);
        assert.equal(err.rule, rule);
        return true;
      },
    );
  }
  for (const notRules of [null, 'example.com', [7], {}]) {
    assert.throws(() => parseEgressRules(notRules), EgressRuleError);
  }
  assert.throws(
    () => parseEgressRules(Array<string>(MAX_RULES + 1).fill('example.com')),
    EgressRuleError,
  );
});

test('no rules: no network, with a message that says how to get one', () => {
  assert.deepEqual(checkEgressName([], env, 'example.com', 443), {
    allow: false,
    reason: NO_NETWORK,
  });
  assert.deepEqual(checkEgressAddresses([], env, 'example.com', 443, ['93.184.216.34']), {
    allow: false,
    reason: NO_NETWORK,
  });
});

test('a host rule allows that name on any port, or on its port only', () => {
  assert.ok(reaches(['example.com'], 'example.com', 80, '93.184.216.34'));
  assert.ok(reaches(['example.com'], 'example.com', 8443, '93.184.216.34'));
  assert.ok(reaches(['example.com:443'], 'example.com', 443, '93.184.216.34'));
  assert.ok(!reaches(['example.com:443'], 'example.com', 80, '93.184.216.34'));
  assert.ok(!reaches(['example.com'], 'www.example.com', 443, '93.184.216.34'));
  assert.ok(!reaches(['example.com'], 'example.com.evil.net', 443, '93.184.216.34'));
  assert.ok(reaches(['EXAMPLE.com'], 'example.com', 443, '93.184.216.34'));
});

test('a *.domain rule allows its subdomains at any depth, not the domain itself', () => {
  const rules = ['*.example.com'];
  assert.ok(reaches(rules, 'www.example.com', 443, '93.184.216.34'));
  assert.ok(reaches(rules, 'a.b.example.com', 443, '93.184.216.34'));
  assert.ok(!reaches(rules, 'example.com', 443, '93.184.216.34'));
  assert.ok(!reaches(rules, 'badexample.com', 443, '93.184.216.34'));
  assert.ok(reaches(['*.example.com:443'], 'x.example.com', 443, '93.184.216.34'));
  assert.ok(!reaches(['*.example.com:443'], 'x.example.com', 80, '93.184.216.34'));
});

test('a name no rule can allow is refused before any DNS query', () => {
  const rules = parseEgressRules(['pypi.org:443', '*.pythonhosted.org']);
  const verdict = checkEgressName(rules, env, 'example.com', 443);
  assert.equal(verdict.allow, false);
  assert.ok(!verdict.allow && verdict.reason.includes('pypi.org:443, *.pythonhosted.org'));
  assert.equal(checkEgressName(rules, env, 'pypi.org', 80).allow, false);
  // ...but with a range rule, any name might resolve into it: it must be resolved to know
  const withRange = parseEgressRules(['203.0.113.0/24']);
  assert.equal(checkEgressName(withRange, env, 'anything.example', 443).allow, true);
  assert.equal(
    checkEgressName(parseEgressRules(['203.0.113.0/24:22']), env, 'a.b', 443).allow,
    false,
  );
});

test('* allows every public address and no special one', () => {
  const publicOnes = ['93.184.216.34', '1.1.1.1', '8.8.8.8', '2606:4700::1111', '203.0.113.7'];
  for (const address of publicOnes) assert.ok(reaches(['*'], 'some.name', 443, address), address);
  for (const address of publicOnes) assert.ok(reaches(['*'], address, 443, address), address);
});

const SPECIAL: [string, string][] = [
  ['0.0.0.0', '0.0.0.0/8'],
  ['0.1.2.3', '0.0.0.0/8'],
  ['10.0.0.1', '10.0.0.0/8'],
  ['10.255.255.255', '10.0.0.0/8'],
  ['100.64.0.1', '100.64.0.0/10'],
  ['100.127.255.254', '100.64.0.0/10'],
  ['127.0.0.1', '127.0.0.0/8'],
  ['127.255.0.9', '127.0.0.0/8'],
  ['169.254.169.254', '169.254.0.0/16'],
  ['172.16.0.1', '172.16.0.0/12'],
  ['172.31.255.255', '172.16.0.0/12'],
  ['192.0.0.8', '192.0.0.0/24'],
  ['192.168.1.1', '192.168.0.0/16'],
  ['198.18.0.1', '198.18.0.0/15'],
  ['224.0.0.251', '224.0.0.0/4'],
  ['239.255.255.250', '224.0.0.0/4'],
  ['240.0.0.1', '240.0.0.0/4'],
  ['255.255.255.255', '240.0.0.0/4'],
  ['::', '::/128'],
  ['::1', '::1/128'],
  ['::7f00:1', '::/96'],
  ['fc00::1', 'fc00::/7'],
  ['fd12:3456::1', 'fc00::/7'],
  ['fe80::1', 'fe80::/10'],
  ['febf::1', 'fe80::/10'],
  ['fec0::1', 'fec0::/10'],
  ['ff02::1', 'ff00::/8'],
  ['100::1', '100::/64'],
  ['64:ff9b:1::1', '64:ff9b:1::/48'],
  // IPv4-mapped and NAT64 forms are the IPv4 address they carry
  ['::ffff:127.0.0.1', '127.0.0.0/8'],
  ['::ffff:7f00:1', '127.0.0.0/8'],
  ['::ffff:10.1.2.3', '10.0.0.0/8'],
  ['::ffff:169.254.169.254', '169.254.0.0/16'],
  ['64:ff9b::a00:1', '64:ff9b::a00:0/104'],
  ['64:ff9b::7f00:1', '64:ff9b::7f00:0/104'],
];

test('special addresses: never through * or a name, each in its range', () => {
  for (const [address, range] of SPECIAL) {
    const found = specialRange(parseIp(address)!);
    assert.ok(found, `${address} is special`);
    assert.equal(formatIp(found.range.base) + '/' + found.range.prefix, range, address);
    assert.ok(!reaches(['*'], 'public.example', 443, address), `* must not reach ${address}`);
    assert.ok(!reaches(['public.example'], 'public.example', 443, address), address);
    assert.ok(!reaches(['*.example'], 'public.example', 443, address), address);
    assert.ok(!reaches(['*'], address, 443, address), `* must not reach the literal ${address}`);
  }
  for (const address of [
    '93.184.216.34',
    '100.63.255.255',
    '100.128.0.0',
    '172.15.0.1',
    '172.32.0.1',
    '2001:4860::8888',
    '64:ff9b::808:808',
  ]) {
    assert.equal(specialRange(parseIp(address)!), null, `${address} is public`);
  }
});

test('a special address is allowed by a rule naming it or a range inside its special range', () => {
  assert.ok(reaches(['10.0.0.0/8'], 'db.internal.example', 5432, '10.1.2.3'));
  assert.ok(reaches(['10.1.0.0/16'], '10.1.2.3', 5432, '10.1.2.3'));
  assert.ok(reaches(['10.1.2.3'], '10.1.2.3', 5432, '10.1.2.3'));
  assert.ok(reaches(['10.1.2.3:5432'], '10.1.2.3', 5432, '10.1.2.3'));
  assert.ok(!reaches(['10.1.2.3:5432'], '10.1.2.3', 22, '10.1.2.3'));
  assert.ok(reaches(['127.0.0.1:8000'], 'localhost', 8000, '127.0.0.1'));
  assert.ok(reaches(['[::1]:8080'], '::1', 8080, '::1'));
  assert.ok(reaches(['169.254.169.254'], '169.254.169.254', 80, '169.254.169.254'));
  assert.ok(reaches(['fd00::/8'], 'fd00::5', 80, 'fd00::5'));
  assert.ok(reaches(['10.0.0.0/8'], '::ffff:10.0.0.1', 80, '::ffff:10.0.0.1'));
  assert.ok(reaches(['::ffff:10.0.0.0/104'], '10.0.0.1', 80, '10.0.0.1'));
  // A range wider than the special range holding the address is not explicit about it
  assert.ok(!reaches(['0.0.0.0/0'], '10.1.2.3', 80, '10.1.2.3'));
  assert.ok(!reaches(['0.0.0.0/0'], '127.0.0.1', 80, '127.0.0.1'));
  assert.ok(!reaches(['::/0'], '::1', 80, '::1'));
  assert.ok(!reaches(['::/0'], 'fe80::1', 80, 'fe80::1'));
  assert.ok(!reaches(['8.0.0.0/5'], '10.0.0.1', 80, '10.0.0.1'));
  // ...but it allows the public addresses in it
  assert.ok(reaches(['0.0.0.0/0'], '93.184.216.34', 80, '93.184.216.34'));
  assert.ok(reaches(['::/0'], '2606:4700::1111', 80, '2606:4700::1111'));
});

test('a public name resolving to a private address is refused with the reason', () => {
  const rules = parseEgressRules(['rebind.example']);
  const verdict = checkEgressAddresses(rules, env, 'rebind.example', 80, ['10.0.0.7']);
  assert.equal(verdict.allow, false);
  assert.ok(!verdict.allow && verdict.reason.includes('10.0.0.7'));
  assert.ok(!verdict.allow && verdict.reason.includes('rebind.example'));
});

test('only the allowed addresses of a name are returned, in their order', () => {
  const rules = parseEgressRules(['example.com', '10.0.0.0/8']);
  assert.deepEqual(
    checkEgressAddresses(rules, env, 'example.com', 443, [
      '127.0.0.1',
      '93.184.216.34',
      '192.168.0.1',
      '10.0.0.2',
      'not an address',
      '2606:2800::1',
    ]),
    { allow: true, addresses: ['93.184.216.34', '10.0.0.2', '2606:2800::1'] },
  );
});

test('an IP literal is judged on its address at the first step already', () => {
  const rules = parseEgressRules(['example.com']);
  assert.equal(checkEgressName(rules, env, '93.184.216.34', 443).allow, false);
  assert.equal(checkEgressName(parseEgressRules(['*']), env, '93.184.216.34', 443).allow, true);
  assert.equal(checkEgressName(parseEgressRules(['*']), env, '10.0.0.1', 443).allow, false);
  assert.equal(checkEgressName(parseEgressRules(['*']), env, '::ffff:127.0.0.1', 80).allow, false);
});

test('host.hostd.internal needs its own rule for each port; * and names never reach it', () => {
  const rules = [`${INTERNAL_HOST}:5432`];
  assert.ok(reaches(rules, INTERNAL_HOST, 5432, '127.0.0.1'));
  assert.ok(reaches(rules, 'HOST.hostd.internal', 5432, '127.0.0.1'));
  assert.ok(!reaches(rules, INTERNAL_HOST, 5433, '127.0.0.1'));
  assert.ok(!reaches(['*'], INTERNAL_HOST, 5432, '127.0.0.1'));
  assert.ok(!reaches(['*.hostd.internal'], INTERNAL_HOST, 5432, '127.0.0.1'));
  assert.ok(!reaches(['127.0.0.1'], INTERNAL_HOST, 5432, '127.0.0.1'));
  const verdict = checkEgressName(parseEgressRules(['*']), env, INTERNAL_HOST, 5432);
  assert.ok(!verdict.allow && verdict.reason.includes(`"${INTERNAL_HOST}:5432"`));
  // the rule does not make the name reach anything but the host's loopback
  assert.ok(!reaches(rules, INTERNAL_HOST, 5432, '93.184.216.34'));
});

test("hostd's own API port is never reachable, whatever the rules", () => {
  const rules = [
    `${INTERNAL_HOST}:7070`,
    '127.0.0.1:7070',
    '127.0.0.0/8',
    '[::1]:7070',
    '0.0.0.0/8',
    '192.0.2.10',
    '*',
  ];
  assert.ok(!reaches(rules, INTERNAL_HOST, 7070, '127.0.0.1'));
  assert.ok(!reaches(rules, '127.0.0.1', 7070, '127.0.0.1'));
  assert.ok(!reaches(rules, '127.0.0.2', 7070, '127.0.0.2'));
  assert.ok(!reaches(rules, '::1', 7070, '::1'));
  assert.ok(!reaches(rules, '0.0.0.0', 7070, '0.0.0.0'));
  assert.ok(!reaches(rules, 'myhost.example', 7070, '192.0.2.10'), "the host's own address");
  assert.ok(!reaches(rules, 'myhost.example', 7070, '2001:db8::10'));
  // other ports of those addresses follow the rules as usual
  assert.ok(reaches(rules, '127.0.0.1', 7071, '127.0.0.1'));
  assert.ok(reaches(rules, 'public.example', 7070, '93.184.216.34'));
});

test('the gate wraps both steps for the network channel', () => {
  const gate = egressGate(parseEgressRules(['example.com:443']), env);
  assert.equal(gate.checkName('example.com', 443).allow, true);
  assert.deepEqual(gate.checkAddresses('example.com', 443, ['93.184.216.34']), {
    allow: true,
    addresses: ['93.184.216.34'],
  });
  assert.equal(gate.checkName('example.com', 80).allow, false);
});

test('host names: punycode, case, trailing dot; numeric forms refused', () => {
  assert.equal(hostName('Bücher.de'), 'xn--bcher-kva.de');
  assert.equal(hostName('WWW.Example.COM.'), 'www.example.com');
  assert.equal(hostName('_dmarc.example.com'), '_dmarc.example.com');
  for (const bad of ['127.1', '0x7f.1', '1.2.3', 'a..b', '', 'a b', 'x'.repeat(254), '-a.com']) {
    assert.equal(hostName(bad), null, bad);
  }
});

test('IP parsing and ranges', () => {
  assert.equal(formatIp(parseIp('::ffff:1.2.3.4')!), '1.2.3.4');
  assert.equal(formatIp(parseIp('2001:DB8:0:0:0:0:0:7')!), '2001:db8::7');
  assert.equal(formatIp(parseIp('::')!), '::');
  assert.equal(parseIp('01.2.3.4'), null);
  assert.equal(parseIp('fe80::1%eth0'), null);
  assert.deepEqual(parseRange('10.1.2.3/8'), parseRange('10.0.0.0/8'), 'host bits cleared');
  assert.equal(parseRange('10.0.0.0/'), null);
  assert.equal(parseRange('10.0.0.0/-1'), null);
});
