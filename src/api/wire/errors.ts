/** The error body every non-2xx answer has (docs/api.md, Errors). */
import Type, { type Static } from 'typebox';
import { errorCodes } from '../../errors.js';

/** Every code of the native API, from the registry, so a new error is in the contract at once. */
const CODES = [...errorCodes('native').keys()].sort();

export const ErrorBody = Type.Object(
  {
    error: Type.String({ description: 'A human-readable message; may change between versions.' }),
    code: Type.Unsafe<string>({
      type: 'string',
      description: 'A stable machine-readable code.',
      enum: CODES,
    }),
  },
  {
    $id: 'Error',
    description:
      "The body of every non-2xx response: the contract's `error` message plus the stable `code` clients branch on (docs/api.md, Errors). Any route may also answer what Node's HTTP parser refuses before a route is chosen: 400 `invalid_request` (not HTTP), 408 `request_timeout` (headers too slow), 431 `headers_too_large` (request line and headers over 16 KiB).",
    additionalProperties: false,
  },
);
export type ErrorBody = Static<typeof ErrorBody>;
