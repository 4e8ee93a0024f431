/**
 * A sandbox's network, as core sees it: its `network.allow_out` rules (core/egress-policy.ts)
 * turned into what its machine enforces, on every machine the sandbox gets (created, forked,
 * resumed, re-adopted): a restored guest holds the connections and listeners of another VM.
 */
import type { Logger } from 'pino';
import { fail } from '../errors.js';
import { clientReason, logMachineFailure } from './machine-error.js';
import type { Machine, NetworkPolicy } from '../vm/machine.js';
import {
  EgressRuleError,
  egressGate,
  parseEgressRules,
  type EgressEnvironment,
} from './egress-policy.js';

export type { EgressEnvironment } from './egress-policy.js';

/**
 * Checks `network.allow_out` from a request; returns the rules as given. Bad rules are
 * `400 invalid_request` naming the first one.
 */
export function validateAllowOut(rules: unknown): string[] {
  try {
    return parseEgressRules(rules).map((r) => r.text);
  } catch (err) {
    if (err instanceof EgressRuleError) throw fail('invalidEgressRule', err.message);
    throw err;
  }
}

export class SandboxNetwork {
  constructor(
    private readonly env: EgressEnvironment,
    private readonly log: Logger,
  ) {}

  /** What a machine with these (validated) rules enforces. */
  policy(allowOut: readonly string[]): NetworkPolicy {
    const rules = parseEgressRules(allowOut);
    const hostPorts = rules.flatMap((r) => (r.kind === 'internal' ? [r.port] : []));
    return { gate: egressGate(rules, this.env), hostPorts: [...new Set(hostPorts)] };
  }

  /**
   * Applies the rules to `machine`. With rules, resolves once the guest listens where they say
   * (the sandbox is not handed out before); without, the reset goes on in the background: a
   * guest without network needs it only to be refused at once instead of hanging.
   */
  async bind(machine: Machine, allowOut: readonly string[]): Promise<void> {
    const applied = machine.setNetwork(this.policy(allowOut));
    if (allowOut.length > 0) {
      await applied.catch((err: unknown) => {
        logMachineFailure(this.log, err, { vm: machine.id }, 'set up the network');
        throw fail('vmOperationFailed', 'set up the network', clientReason(err));
      });
      return;
    }
    applied.catch((err: unknown) => {
      if (machine.alive) this.log.warn({ err, vm: machine.id }, 'network reset failed');
    });
  }
}
