/**
 * A sandbox's outbound network rules (`network.allow_out`, docs/api.md "Network"): parsing
 * them, and deciding whether a connection may go out. Pure functions; hostd enforces the
 * decision outside the VM (vm/channels/net-channel.ts asks through an EgressGate, built here).
 *
 * The decision has two steps because names lie: a rule for `example.com` allows the name,
 * but the addresses it resolves to are judged again, and loopback, private, link-local,
 * CGNAT, multicast and reserved addresses (ip-address.ts) are reachable only through a rule
 * naming that address or a range inside its special range (`10.0.0.0/8`, `127.0.0.1`; not
 * `0.0.0.0/0`). `host.hostd.internal` is the host's loopback, allowed by its own rule per
 * port. hostd's API port on the host is never reachable, whatever the rules say.
 */
import { domainToASCII } from 'node:url';
import { show } from '../errors.js';
import {
  type EgressAddressVerdict,
  type EgressGate,
  type EgressVerdict,
  HOST_ALIAS,
} from '../vm/channels/egress-gate.js';
import {
  type IpRange,
  formatIp,
  formatRange,
  inRange,
  parseIp,
  parseRange,
  rangeWithin,
  specialRange,
} from './ip-address.js';

/** The host machine's name inside every sandbox. */
export const INTERNAL_HOST = HOST_ALIAS;
/** Rules are checked linearly per connection; a bounded list keeps that cheap. */
export const MAX_RULES = 256;
const MAX_RULE_LENGTH = 300;
/** The reason every connection of a sandbox without rules is refused with (its 403 body). */
export const NO_NETWORK = 'this sandbox has no network: create it with network.allow_out';

/** A parsed rule; `text` is the rule as given, for messages and the sandbox's `network` field. */
export type EgressRule = { readonly text: string } & (
  | { readonly kind: 'any' }
  | { readonly kind: 'host'; readonly host: string; readonly port: number | null }
  | { readonly kind: 'subdomains'; readonly domain: string; readonly port: number | null }
  | { readonly kind: 'range'; readonly range: IpRange; readonly port: number | null }
  | { readonly kind: 'internal'; readonly port: number }
);

/** A rule that cannot be parsed; the api layer answers 400 invalid_request with the message. */
export class EgressRuleError extends Error {
  constructor(
    readonly index: number,
    readonly rule: unknown,
    readonly reason: string,
  ) {
    super(`network.allow_out[${index}] ${show(rule)}: ${reason}`);
    this.name = 'EgressRuleError';
  }
}

/** The host's side of the decision: where hostd's own API listens. */
export interface EgressEnvironment {
  readonly apiPort: number;
  /** hostd's other ports on the host (the E2B front's), closed to sandboxes like `apiPort`. */
  readonly otherApiPorts?: readonly number[];
  /** The host's own addresses (its interfaces'): the API port is closed on all of them. */
  readonly hostAddresses: readonly string[];
}

/**
 * Parses `network.allow_out`. Throws EgressRuleError naming the first bad rule.
 * @example parseEgressRules(['pypi.org:443', '*.pythonhosted.org', '10.0.0.0/8'])
 */
export function parseEgressRules(rules: unknown): EgressRule[] {
  if (!Array.isArray(rules)) throw new EgressRuleError(0, rules, 'allow_out must be an array');
  if (rules.length > MAX_RULES) {
    throw new EgressRuleError(MAX_RULES, rules[MAX_RULES], `at most ${MAX_RULES} rules`);
  }
  return rules.map((rule: unknown, index) => {
    if (typeof rule !== 'string') throw new EgressRuleError(index, rule, 'a rule is a string');
    const parsed = parseRule(rule);
    if (typeof parsed === 'string') throw new EgressRuleError(index, rule, parsed);
    return parsed;
  });
}

/** A rule, or why it is not one. */
function parseRule(text: string): EgressRule | string {
  if (text.length === 0 || text.length > MAX_RULE_LENGTH) {
    return `a rule has 1 to ${MAX_RULE_LENGTH} characters`;
  }
  if (/\s/.test(text)) return 'a rule holds no spaces';
  if (text === '*') return { text, kind: 'any' };
  if (text.startsWith('[')) return bracketed(text);
  // A bare IPv6 address or range has several colons and no port
  if ((text.match(/:/g) ?? []).length > 1) return rangeRule(text, text, null);
  const colon = text.lastIndexOf(':');
  const hostText = colon < 0 ? text : text.slice(0, colon);
  const port = colon < 0 ? null : parsePort(text.slice(colon + 1));
  if (port === 'bad') return 'the port must be a number from 1 to 65535';
  if (/^[\d./]+$/.test(hostText)) return rangeRule(text, hostText, port);
  const lower = hostText.toLowerCase();
  if (lower === INTERNAL_HOST || lower === `${INTERNAL_HOST}.`) {
    if (port === null) return `${INTERNAL_HOST} needs a port: ${INTERNAL_HOST}:PORT`;
    return { text, kind: 'internal', port };
  }
  if (lower.startsWith('*.')) {
    const domain = hostName(lower.slice(2));
    if (domain === null) return 'not a valid domain after "*."';
    return { text, kind: 'subdomains', domain, port };
  }
  if (lower.includes('*')) return '"*" is either the whole rule or a leading "*." label';
  const host = hostName(lower);
  if (host === null) return 'not a host name, IP address, CIDR range or "*"';
  return { text, kind: 'host', host, port };
}

/** `[v6]`, `[v6]:port`, `[v6/len]`, `[v6/len]:port`. */
function bracketed(text: string): EgressRule | string {
  const close = text.indexOf(']');
  if (close < 0) return 'a "[" without its "]"';
  const rest = text.slice(close + 1);
  let port: number | null = null;
  if (rest) {
    if (!rest.startsWith(':')) return 'only ":PORT" may follow "]"';
    const parsed = parsePort(rest.slice(1));
    if (parsed === 'bad' || parsed === null) return 'the port must be a number from 1 to 65535';
    port = parsed;
  }
  const inner = text.slice(1, close);
  if (!inner.includes(':')) return 'brackets hold an IPv6 address';
  return rangeRule(text, inner, port);
}

function rangeRule(text: string, range: string, port: number | null): EgressRule | string {
  const parsed = parseRange(range);
  if (parsed === null) return 'not a valid IP address or CIDR range';
  return { text, kind: 'range', range: parsed, port };
}

function parsePort(text: string): number | null | 'bad' {
  if (!/^\d{1,5}$/.test(text)) return 'bad';
  const port = Number(text);
  return port >= 1 && port <= 65535 ? port : 'bad';
}

const LABEL = /^(?!-)[a-z0-9_-]{1,63}(?<!-)$/;

/** The ASCII (punycode) form of a host name, lowercase, without a trailing dot; or null. */
export function hostName(text: string): string | null {
  const trimmed = text.endsWith('.') ? text.slice(0, -1) : text;
  // Names that end in a number would be taken as IPv4 in some forms ("127.1"): refuse them
  const labels = trimmed.split('.');
  if (/^(\d+|0x[0-9a-f]*)$/i.test(labels[labels.length - 1] ?? '')) return null;
  const ascii = /^[\x21-\x7e]*$/.test(trimmed) ? trimmed.toLowerCase() : domainToASCII(trimmed);
  if (!ascii || ascii.length > 253) return null;
  return ascii.split('.').every((label) => LABEL.test(label)) ? ascii : null;
}

// ---- decisions ------------------------------------------------------------------------

const portMatches = (rulePort: number | null, port: number): boolean =>
  rulePort === null || rulePort === port;

/** Whether a rule allows the name itself (public addresses it resolves to). */
function nameRuleMatches(rule: EgressRule, host: string, port: number): boolean {
  if (host === INTERNAL_HOST) return false; // only its own rule
  switch (rule.kind) {
    case 'any':
      return true;
    case 'host':
      return rule.host === host && portMatches(rule.port, port);
    case 'subdomains':
      return host.endsWith(`.${rule.domain}`) && portMatches(rule.port, port);
    default:
      return false;
  }
}

function describeRules(rules: readonly EgressRule[]): string {
  const shown = rules.slice(0, 20).map((r) => r.text);
  if (rules.length > shown.length) shown.push(`and ${rules.length - shown.length} more`);
  return `this sandbox's network.allow_out: ${shown.join(', ')}`;
}

const deny = (reason: string): { allow: false; reason: string } => ({ allow: false, reason });

/**
 * First step, before any DNS query: whether a connection to host:port could be allowed.
 * `host` is a name or an IP literal (no brackets).
 */
export function checkEgressName(
  rules: readonly EgressRule[],
  env: EgressEnvironment,
  host: string,
  port: number,
): EgressVerdict {
  if (rules.length === 0) return deny(NO_NETWORK);
  if (parseIp(host) !== null) {
    const verdict = checkEgressAddresses(rules, env, host, port, [host]);
    return verdict.allow ? { allow: true } : verdict;
  }
  const name = hostName(host);
  if (name === null) return deny(`${JSON.stringify(host)} is not a valid host name`);
  if (name === INTERNAL_HOST) {
    if (isApiPort(env, port)) return deny(apiPortReason(port));
    if (rules.some((r) => r.kind === 'internal' && r.port === port)) return { allow: true };
    return deny(
      `${INTERNAL_HOST}:${port} needs the rule "${INTERNAL_HOST}:${port}" (${describeRules(rules)})`,
    );
  }
  const possible = rules.some(
    (r) => nameRuleMatches(r, name, port) || (r.kind === 'range' && portMatches(r.port, port)),
  );
  if (possible) return { allow: true };
  return deny(`${name}:${port} is not allowed by ${describeRules(rules)}`);
}

function isApiPort(env: EgressEnvironment, port: number): boolean {
  return port === env.apiPort || (env.otherApiPorts?.includes(port) ?? false);
}

function apiPortReason(port: number): string {
  return `port ${port} of the host is hostd's own API, which no sandbox may reach`;
}

/**
 * Second step: which of the addresses `host` resolved to the sandbox may reach. An address
 * is allowed by a range rule holding it (inside the address's special range, for a special
 * one), or, when public, by a rule allowing the name.
 */
export function checkEgressAddresses(
  rules: readonly EgressRule[],
  env: EgressEnvironment,
  host: string,
  port: number,
  addresses: readonly string[],
): EgressAddressVerdict {
  if (rules.length === 0) return deny(NO_NETWORK);
  const name = parseIp(host) === null ? hostName(host) : null;
  const hostAddresses = new Set(env.hostAddresses.map((a) => parseIp(a)).map(key));
  const allowed: string[] = [];
  let firstRefusal: string | null = null;
  for (const text of addresses) {
    const address = parseIp(text);
    if (address === null) continue;
    const special = specialRange(address);
    const isHost =
      hostAddresses.has(key(address)) ||
      special?.label === 'loopback' ||
      (special?.label.startsWith('unspecified') ?? false);
    let refusal: string | null = null;
    if (isApiPort(env, port) && isHost) {
      refusal = apiPortReason(port);
    } else if (name === INTERNAL_HOST) {
      const ruled = rules.some((r) => r.kind === 'internal' && r.port === port);
      if (!ruled || special?.label !== 'loopback') {
        refusal = `${INTERNAL_HOST}:${port} needs the rule "${INTERNAL_HOST}:${port}"`;
      }
    } else {
      const explicit = rules.some(
        (r) =>
          r.kind === 'range' &&
          portMatches(r.port, port) &&
          inRange(address, r.range) &&
          (special === null || rangeWithin(r.range, special.range)),
      );
      const named =
        special === null &&
        rules.some((r) => (name === null ? r.kind === 'any' : nameRuleMatches(r, name, port)));
      if (!explicit && !named) {
        const shown = formatIp(address);
        const subject = name === null ? shown : `${name} resolves to ${shown},`;
        refusal = special
          ? `${subject} a ${special.label} address (${formatRange(special.range)}): only a rule ` +
            `naming that address or a range inside it allows it (${describeRules(rules)})`
          : `${name ?? shown}:${port} (${shown}) is not allowed by ${describeRules(rules)}`;
      }
    }
    if (refusal === null) allowed.push(text);
    else firstRefusal ??= refusal;
  }
  if (allowed.length > 0) return { allow: true, addresses: allowed };
  return deny(firstRefusal ?? `${host} resolved to no usable address`);
}

function key(address: ReturnType<typeof parseIp>): string {
  return address === null ? '' : `${address.version}:${address.value}`;
}

/** The gate the network channel of a sandbox with these rules asks. */
export function egressGate(rules: readonly EgressRule[], env: EgressEnvironment): EgressGate {
  return {
    checkName: (host, port) => checkEgressName(rules, env, host, port),
    checkAddresses: (host, port, addresses) =>
      checkEgressAddresses(rules, env, host, port, addresses),
  };
}
