/**
 * What the network channel (net-channel.ts) asks before it opens a connection for a guest:
 * the decision itself is the sandbox's policy (core/egress-policy.ts builds one from its
 * `network.allow_out` rules). Asked twice: before any DNS query, so that a name no rule can
 * allow is refused without being resolved, and again with every address the name resolved
 * to, so that a public name resolving to a private or loopback address is caught; the channel
 * then connects to an address this second answer allowed, never resolving the name again.
 */

/** The host machine's name inside every sandbox: it reaches the host's 127.0.0.1. */
export const HOST_ALIAS = 'host.hostd.internal';

export type EgressVerdict =
  | { readonly allow: true }
  | {
      readonly allow: false;
      /** Sent to the guest's client in the 403 body: names the sandbox's rules. */
      readonly reason: string;
    };

export type EgressAddressVerdict =
  | {
      readonly allow: true;
      /** The resolved addresses the sandbox may reach, in the order to try them. */
      readonly addresses: readonly string[];
    }
  | { readonly allow: false; readonly reason: string };

export interface EgressGate {
  /** `host` is lowercase: a name, or an IP literal without brackets. */
  checkName(host: string, port: number): EgressVerdict;
  checkAddresses(host: string, port: number, addresses: readonly string[]): EgressAddressVerdict;
}

/** The gate of a machine whose sandbox's rules are not applied yet: nothing gets out. */
export const NO_EGRESS: EgressGate = {
  checkName: () => ({ allow: false, reason: 'the network of this sandbox is not set up yet' }),
  checkAddresses: () => ({ allow: false, reason: 'the network of this sandbox is not set up yet' }),
};
