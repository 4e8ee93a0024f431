/** The checkout's root (testkit compiles to dist/testkit). */
import { resolve } from 'node:path';

export const ROOT = resolve(import.meta.dirname, '..', '..');
