/**
 * The guest's refusals of file operations, as clients read them (docs/api.md, Files): the
 * registry's code and status for each, a message made by hostd from the client's own path and
 * tar member names, never from the guest's words.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { clientFileError } from '../../src/core/file-errors.js';
import { FileOpError, type FileErrorCode } from '../../src/vm/channels/file-channel.js';

const GUEST_WORDS = '/secret/guest/text: Input/output error';
const refusal = (code: FileErrorCode, reason: string | null = null, member: string | null = null) =>
  new FileOpError(code, '/p', GUEST_WORDS, reason, member);

test('each code of the guest is a client error with its status; the guest text never shows', () => {
  const cases: [FileOpError, string, number][] = [
    [refusal('file_not_found'), 'file_not_found', 404],
    [refusal('is_a_directory'), 'is_a_directory', 400],
    [refusal('not_a_directory'), 'not_a_directory', 400],
    [refusal('invalid_path', 'dot_dot'), 'invalid_path', 400],
    [refusal('invalid_path', 'symlink_leads_out', 'x'), 'invalid_path', 400],
    [refusal('sandbox_disk_full'), 'sandbox_disk_full', 507],
    [refusal('permission_denied', 'read_only'), 'permission_denied', 403],
    [refusal('file_too_large'), 'file_too_large', 413],
    [refusal('unsupported_file', 'io'), 'unsupported_file', 400],
    [refusal('unsupported_file', 'a_reason_hostd_does_not_know'), 'unsupported_file', 400],
    [refusal('invalid_archive'), 'invalid_archive', 400],
  ];
  for (const [err, code, status] of cases) {
    const mapped = clientFileError(err, 'sbx_1', '/p');
    assert.ok(mapped, `${err.code} is the client's`);
    assert.deepEqual([mapped.code, mapped.status], [code, status], err.code);
    assert.ok(!mapped.message.includes(GUEST_WORDS.slice(0, 12)), mapped.message);
    assert.ok(!mapped.message.includes('Input/output error'), mapped.message);
  }
});

test("a failure of the guest itself is not the client's: the caller answers it as its own", () => {
  for (const code of ['io_error', 'bad_request'] as const) {
    assert.equal(clientFileError(refusal(code), 'sbx_1', '/p'), null, code);
  }
});

test('a refused tar member is named, as the client sent it', () => {
  const mapped = clientFileError(refusal('invalid_path', 'symlink_leads_out', 'a/x'), 's', '/d');
  assert.equal(mapped?.entry, 'invalidPath');
  assert.deepEqual(mapped?.params, [
    '/d',
    'tar member "a/x" is a symbolic link leading out of the target',
  ]);
  const elsewhere = clientFileError(refusal('permission_denied', 'access', './a/x'), 's', '/d/');
  assert.deepEqual(elsewhere?.params, ['/d/a/x', 'access denied (EACCES)']);
});
