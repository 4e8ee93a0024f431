/**
 * IP addresses as numbers, for egress rules (egress-policy.ts): parsing, ranges, and the
 * special ranges a sandbox must not reach through `*` or a host name (loopback, private,
 * link-local, CGNAT, multicast, reserved). IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) are
 * the IPv4 address they carry: a connect() to one reaches exactly that IPv4 address.
 */
import { isIPv4, isIPv6 } from 'node:net';

/** An address as a number, so that ranges are masks; `value` has 32 or 128 bits. */
export interface IpAddress {
  readonly version: 4 | 6;
  readonly value: bigint;
}

/** CIDR: `base` has its host bits cleared. */
export interface IpRange {
  readonly base: IpAddress;
  readonly prefix: number;
}

const bits = (version: 4 | 6): number => (version === 4 ? 32 : 128);

function parseV4(text: string): bigint | null {
  if (!isIPv4(text)) return null;
  return text.split('.').reduce((acc, part) => (acc << 8n) | BigInt(Number(part)), 0n);
}

function parseV6(text: string): bigint | null {
  if (!isIPv6(text) || text.includes('%')) return null; // zone ids mean nothing to the host
  let groups = text;
  const lastColon = groups.lastIndexOf(':');
  const tail = groups.slice(lastColon + 1);
  if (tail.includes('.')) {
    const v4 = parseV4(tail);
    if (v4 === null) return null;
    groups = `${groups.slice(0, lastColon + 1)}${(v4 >> 16n).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  const [left, right] = groups.includes('::') ? groups.split('::') : [groups, undefined];
  const head = left ? left.split(':') : [];
  const rest = right === undefined ? [] : right ? right.split(':') : [];
  const zeros = right === undefined ? 0 : 8 - head.length - rest.length;
  const all = [...head, ...Array<string>(zeros).fill('0'), ...rest];
  if (all.length !== 8) return null;
  return all.reduce((acc, group) => (acc << 16n) | BigInt(parseInt(group, 16)), 0n);
}

const MAPPED_PREFIX = 0xffffn << 32n;

/** Parses a literal address (no brackets, no port); IPv4-mapped IPv6 becomes IPv4. */
export function parseIp(text: string): IpAddress | null {
  const v4 = parseV4(text);
  if (v4 !== null) return { version: 4, value: v4 };
  const v6 = parseV6(text);
  if (v6 === null) return null;
  if (v6 >> 32n === 0xffffn) return { version: 4, value: v6 & 0xffffffffn };
  return { version: 6, value: v6 };
}

/** For messages: dotted IPv4, IPv6 with its first run of zero groups shortened. */
export function formatIp(address: IpAddress): string {
  if (address.version === 4) {
    return [24n, 16n, 8n, 0n].map((shift) => String((address.value >> shift) & 0xffn)).join('.');
  }
  const groups = Array.from({ length: 8 }, (_, i) =>
    ((address.value >> BigInt(112 - 16 * i)) & 0xffffn).toString(16),
  );
  return groups.join(':').replace(/(^|:)0(:0)+(:|$)/, '::');
}

/**
 * `base/prefix` or a single address, with base's host bits cleared; null when malformed. A
 * range inside IPv4-mapped space (::ffff:a.b.c.d/96 and longer) is that IPv4 range.
 */
export function parseRange(text: string): IpRange | null {
  const slash = text.indexOf('/');
  const addressText = slash < 0 ? text : text.slice(0, slash);
  const v4 = parseV4(addressText);
  const raw = v4 !== null ? { version: 4 as const, value: v4 } : rawV6(addressText);
  if (raw === null) return null;
  let prefix = bits(raw.version);
  if (slash >= 0) {
    const prefixText = text.slice(slash + 1);
    if (!/^\d{1,3}$/.test(prefixText) || Number(prefixText) > prefix) return null;
    prefix = Number(prefixText);
  }
  let base: IpAddress = raw;
  if (raw.version === 6 && prefix >= 96 && raw.value >> 32n === 0xffffn) {
    base = { version: 4, value: raw.value & 0xffffffffn };
    prefix -= 96;
  }
  return {
    base: { version: base.version, value: base.value & mask(base.version, prefix) },
    prefix,
  };
}

function rawV6(text: string): IpAddress | null {
  const value = parseV6(text);
  return value === null ? null : { version: 6, value };
}

function mask(version: 4 | 6, prefix: number): bigint {
  const width = BigInt(bits(version));
  const all = (1n << width) - 1n;
  return prefix === 0 ? 0n : (all << (width - BigInt(prefix))) & all;
}

/** Whether `address` is in `range` (an IPv4 address is also in an IPv6 range holding its mapped form). */
export function inRange(address: IpAddress, range: IpRange): boolean {
  if (address.version !== range.base.version) {
    // A v6 range may hold mapped addresses, which parse as IPv4
    if (address.version === 4 && range.base.version === 6) {
      return inRange({ version: 6, value: MAPPED_PREFIX | address.value }, range);
    }
    return false;
  }
  return (address.value & mask(address.version, range.prefix)) === range.base.value;
}

/** Whether every address of `inner` is in `outer`. */
export function rangeWithin(inner: IpRange, outer: IpRange): boolean {
  return inner.prefix >= outer.prefix && inRange(inner.base, outer);
}

/** For messages: `base/prefix`. */
export function formatRange(range: IpRange): string {
  return `${formatIp(range.base)}/${range.prefix}`;
}

export interface SpecialRange {
  readonly range: IpRange;
  /** What kind of address it is, for messages: "a private address". */
  readonly label: string;
}

function special(text: string, label: string): SpecialRange {
  const range = parseRange(text);
  if (range === null) throw new Error(`bad special range ${text}`);
  return { range, label };
}

/** Addresses neither `*` nor a host name may reach: only an explicit address or range rule. */
export const SPECIAL_RANGES: readonly SpecialRange[] = [
  special('0.0.0.0/8', 'unspecified ("this network", which reaches the host itself)'),
  special('10.0.0.0/8', 'private (RFC 1918)'),
  special('100.64.0.0/10', 'shared CGNAT'),
  special('127.0.0.0/8', 'loopback'),
  special('169.254.0.0/16', 'link-local'),
  special('172.16.0.0/12', 'private (RFC 1918)'),
  special('192.0.0.0/24', 'reserved (IETF protocol assignments)'),
  special('192.168.0.0/16', 'private (RFC 1918)'),
  special('198.18.0.0/15', 'reserved (benchmarking)'),
  special('224.0.0.0/4', 'multicast'),
  special('240.0.0.0/4', 'reserved'),
  special('::/128', 'unspecified'),
  special('::1/128', 'loopback'),
  special('::/96', 'reserved (IPv4-compatible)'),
  special('64:ff9b:1::/48', 'reserved (local NAT64)'),
  special('100::/64', 'reserved (discard)'),
  special('fc00::/7', 'private (unique local)'),
  special('fe80::/10', 'link-local'),
  special('fec0::/10', 'reserved (site-local)'),
  special('ff00::/8', 'multicast'),
];

const NAT64 = special('64:ff9b::/96', 'NAT64').range;

/**
 * The special range holding `address`, or null for a public address. A NAT64 address
 * (64:ff9b::/96) is judged by the IPv4 address it carries: the host's NAT64 would reach it.
 */
export function specialRange(address: IpAddress): SpecialRange | null {
  if (address.version === 6 && inRange(address, NAT64)) {
    const inner = specialRange({ version: 4, value: address.value & 0xffffffffn });
    if (inner === null) return null;
    const base = { version: 6 as const, value: NAT64.base.value | inner.range.base.value };
    return { range: { base, prefix: 96 + inner.range.prefix }, label: `${inner.label}, via NAT64` };
  }
  // The most specific range first (::1 before ::/96)
  let found: SpecialRange | null = null;
  for (const candidate of SPECIAL_RANGES) {
    if (
      inRange(address, candidate.range) &&
      (!found || candidate.range.prefix > found.range.prefix)
    ) {
      found = candidate;
    }
  }
  return found;
}
