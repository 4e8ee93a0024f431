/**
 * Work on many items, a few at a time: the drain's hand-overs (core/cluster/drain.ts) and the
 * shutdown's pauses (core/sandbox-manager.ts) are each a burst of disk writes per item, so a
 * node does N of them at once rather than one (slow) or all (the disk thrashes). `turns` is the
 * same limit for work that is not a list of items: a fork's children run their guests N at a
 * time (core/lineage.ts).
 */

/**
 * Runs `each` on every item, at most `atOnce` at a time, each item once, in the order given (an
 * item starts when one before it ends). Resolves once every item is done. An item whose `each`
 * rejects does not stop the others: once all are done, the error of the first
 * that failed is thrown.
 */
export async function eachAtOnce<T>(
  items: Iterable<T>,
  atOnce: number,
  each: (item: T) => Promise<void>,
): Promise<void> {
  const todo = items[Symbol.iterator]();
  const errors: unknown[] = [];
  const worker = async (): Promise<void> => {
    for (let next = todo.next(); !next.done; next = todo.next()) {
      try {
        await each(next.value);
      } catch (err) {
        errors.push(err);
      }
    }
  };
  // At least one worker, whatever `atOnce` is (NaN included): the items are never skipped.
  const workers = Number.isFinite(atOnce) ? Math.max(1, Math.floor(atOnce)) : 1;
  await Promise.all(Array.from({ length: workers }, worker));
  if (errors.length > 0) throw errors[0];
}

/**
 * Turns for at most `atOnce` holders at a time, given in the order asked: `take` resolves with
 * the function that ends the turn (calling it again does nothing). Not finite or below 1:
 * no limit.
 */
export function turns(atOnce: number): () => Promise<() => void> {
  const limit = Number.isFinite(atOnce) && atOnce >= 1 ? Math.floor(atOnce) : Infinity;
  let held = 0;
  const waiting: (() => void)[] = [];
  const grant = (): (() => void) => {
    held++;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      held--;
      const next = waiting.shift();
      if (next) next();
    };
  };
  return () => {
    if (held < limit) return Promise.resolve(grant());
    return new Promise((resolve) => waiting.push(() => resolve(grant())));
  };
}
