/**
 * A sandbox's REPL contexts (docs/api.md, Contexts): independent Python states in its one REPL
 * process, each with its own namespace, working directory and execution count. They live in
 * the guest, so they go wherever the VM goes (fork children, merges, pauses, snapshots) with
 * nothing kept here. Each request waits for the sandbox's turn like an exec (the REPL serves
 * one at a time), resumes a paused sandbox first, and turns the guest's answer into registry
 * errors.
 */
import type { Logger } from 'pino';
import { fail } from '../errors.js';
import type { ContextAnswer, ContextInfo, ContextRequest } from '../vm/machine.js';
import { asMachineError } from './machine-error.js';
import type { SandboxRegistry } from './registry.js';

export type { ContextInfo } from '../vm/machine.js';

/** The context execs run in when they name none: the REPL's own namespace. */
export const DEFAULT_CONTEXT = 'default';

export class SandboxContexts {
  constructor(
    private readonly registry: SandboxRegistry,
    private readonly log: Logger,
  ) {}

  /** Every context, the default one first, then in creation order. */
  async list(id: string, signal?: AbortSignal): Promise<ContextInfo[]> {
    const answer = await this.ask(id, { action: 'list' }, signal);
    return [...(answer.contexts ?? [])];
  }

  /** A new context: `context` is its id (else the guest picks one), `cwd` its directory. */
  async create(
    id: string,
    options: { context?: string; cwd?: string },
    signal?: AbortSignal,
  ): Promise<ContextInfo> {
    const answer = await this.ask(id, { action: 'create', ...options }, signal);
    return this.context(answer);
  }

  /** A fresh namespace, the directory the context was created with, a count of 0. */
  async restart(id: string, context: string, signal?: AbortSignal): Promise<ContextInfo> {
    return this.context(await this.ask(id, { action: 'restart', context }, signal));
  }

  async delete(id: string, context: string, signal?: AbortSignal): Promise<void> {
    await this.ask(id, { action: 'delete', context }, signal);
  }

  private async ask(
    id: string,
    request: ContextRequest,
    signal?: AbortSignal,
  ): Promise<ContextAnswer> {
    const { sandbox, release } = await this.registry.acquire(id, signal);
    let answer: ContextAnswer;
    try {
      answer = await sandbox.machine.contexts(request);
    } catch (err) {
      throw asMachineError(err, this.log, { sandbox: id }, 'vmOperationFailed', 'reach the REPL');
    } finally {
      sandbox.touch();
      release();
    }
    const error = answer.error;
    if (!error) return answer;
    const context = 'context' in request ? (request.context ?? '') : '';
    switch (error.code) {
      case 'context_not_found':
        throw fail('contextNotFound', id, context);
      case 'context_exists':
        throw fail('contextExists', id, context);
      case 'context_is_default':
        throw fail('contextIsDefault');
      case 'invalid_cwd':
        throw fail(
          'invalidField',
          'cwd',
          'an existing directory',
          'cwd' in request ? request.cwd : '',
        );
      case 'invalid_context_id':
        throw fail('invalidField', 'id', 'a context id', context);
      default:
        throw fail('vmOperationFailed', 'serve the context request', error.message);
    }
  }

  private context(answer: ContextAnswer): ContextInfo {
    if (!answer.context) throw fail('vmOperationFailed', 'create the context', 'no answer');
    return answer.context;
  }
}
