/**
 * The file tools: read (text in parts, images as images), write (text or base64) and list,
 * through the files API, which does not wait behind a running exec.
 */
import type { ContentBlock } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import type { Sandbox } from '../../sandbox.js';
import type { EntryInfo } from '../../types.js';
import { looksLikeText, sniffImage } from '../content.js';
import { ToolInputError, absolutePath, sandboxId, type ToolContext } from './common.js';

/** Entries list_files returns at most. */
const MAX_ENTRIES = 1000;
/** Bytes of an image file read_file shows as an image. */
const MAX_IMAGE_BYTES = 5 * 1024 * 1024;
/** Bytes of a binary file read_file hands over (base64) for the host to save. */
const MAX_BLOB_BYTES = 1024 * 1024;

/** A directory entry as list_files gives it: permissions in octal, time in ISO 8601. */
const ENTRY = z.object({
  name: z.string(),
  type: z.enum(['file', 'dir', 'symlink', 'other']),
  size: z.number(),
  mode: z.string().describe('octal permissions, e.g. 0644'),
  modified: z.string().describe('ISO 8601'),
  target: z.string().optional().describe('where a symlink points'),
});

export function registerFileTools(ctx: ToolContext): void {
  const { server, session, maxChars, guarded, structured } = ctx;
  server.registerTool(
    'read_file',
    {
      title: 'Read a file',
      description:
        "Read a file from a sandbox's filesystem. Text files come back as text (long ones in " +
        'parts: the result says which offset to read on from), images (PNG, JPEG, GIF, WebP) ' +
        'as images you can look at, other binary files as an attachment with a note. Faster ' +
        'than printing the file with run_code, and it works while code runs.',
      inputSchema: {
        sandbox_id: sandboxId,
        path: absolutePath.describe('Absolute path in the sandbox, e.g. /root/results.csv.'),
        offset: z
          .number()
          .int()
          .min(0)
          .default(0)
          .describe('Byte offset to start reading at, to read a long text file in parts.'),
      },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    guarded(async (args, extra) => {
      const sandbox = await session.connect(args.sandbox_id, extra.signal);
      const entry = await sandbox.files.stat(args.path, { signal: extra.signal });
      if (entry.type === 'dir') {
        throw new ToolInputError(`${args.path} is a directory: list it with list_files`);
      }
      // Enough for maxChars characters of UTF-8; an image or a binary file small enough to hand
      // over whole is read whole.
      let bytes = await readPart(sandbox, args.path, args.offset, maxChars * 4, extra.signal);
      const size = Math.max(entry.size, args.offset + bytes.length);
      const whole = async (): Promise<Buffer> =>
        bytes.length >= size ? bytes : sandbox.files.read(args.path, { signal: extra.signal });
      const image = args.offset === 0 ? sniffImage(bytes) : undefined;
      if (image !== undefined && size <= MAX_IMAGE_BYTES) {
        bytes = await whole();
        return {
          content: [
            { type: 'image', data: bytes.toString('base64'), mimeType: image },
            { type: 'text', text: `[${args.path}: ${image}, ${bytes.length} bytes]` },
          ],
        };
      }
      if (looksLikeText(bytes.subarray(0, 64 * 1024))) {
        const text = new TextDecoder('utf-8').decode(bytes);
        if (text.length <= maxChars && args.offset + bytes.length >= size) {
          return {
            content: [{ type: 'text', text: text === '' ? `[${args.path} is empty]` : text }],
          };
        }
        const shown = text.slice(0, maxChars);
        const next = args.offset + Buffer.byteLength(shown, 'utf8');
        return {
          content: [
            { type: 'text', text: shown },
            {
              type: 'text',
              text: `[${args.path}: bytes ${args.offset} to ${next} of ${size} shown; read_file with offset=${next} reads on]`,
            },
          ],
        };
      }
      const blocks: ContentBlock[] = [
        {
          type: 'text',
          text: `[${args.path} is a binary file of ${size} bytes, not shown as text. Inspect it with run_code (Python, or bash: xxd, file)]`,
        },
      ];
      if (args.offset === 0 && size <= MAX_BLOB_BYTES) {
        bytes = await whole();
        blocks.push({
          type: 'resource',
          resource: {
            uri: `hostd://sandbox/${sandbox.id}/files${encodeURI(args.path)}`,
            mimeType: 'application/octet-stream',
            blob: bytes.toString('base64'),
          },
          annotations: { audience: ['user'] },
        });
      }
      return { content: blocks };
    }),
  );

  server.registerTool(
    'write_file',
    {
      title: 'Write a file',
      description:
        "Write a file into a sandbox's filesystem, replacing it if it exists and creating " +
        'missing parent directories: data for the code, a script, a config file. Text is ' +
        'written as UTF-8; binary data can be given as base64.',
      inputSchema: {
        sandbox_id: sandboxId,
        path: absolutePath.describe('Absolute path in the sandbox, e.g. /root/data.csv.'),
        content: z
          .string()
          .describe('The file\'s contents: text, or base64 with encoding "base64".'),
        encoding: z
          .enum(['utf8', 'base64'])
          .default('utf8')
          .describe('How content is given: utf8 text (default) or base64 bytes.'),
        mode: z
          .string()
          .regex(/^0?[0-7]{3}$/, 'mode is octal permissions such as "0644" or "755"')
          .optional()
          .describe('Permissions as octal, e.g. "0755" for a script. Default "0644".'),
      },
      outputSchema: { path: z.string(), size: z.number() },
      annotations: {
        readOnlyHint: false,
        destructiveHint: true,
        idempotentHint: true,
        openWorldHint: false,
      },
    },
    guarded(async (args, extra) => {
      const sandbox = await session.connect(args.sandbox_id, extra.signal);
      let data: Buffer | string = args.content;
      if (args.encoding === 'base64') {
        if (!/^[A-Za-z0-9+/\s]*={0,2}\s*$/.test(args.content)) {
          throw new ToolInputError('content is not valid base64');
        }
        data = Buffer.from(args.content, 'base64');
      }
      const mode = args.mode === undefined ? undefined : args.mode.padStart(4, '0');
      const written = await sandbox.files.write(args.path, data, { mode, signal: extra.signal });
      return structured({ path: written.path, size: written.size });
    }),
  );

  server.registerTool(
    'list_files',
    {
      title: 'List a directory',
      description:
        "List the entries of a directory in a sandbox's filesystem (one level, sorted by " +
        'name): name, type (file, dir, symlink, other), size in bytes, octal permissions and ' +
        'modification time.',
      inputSchema: {
        sandbox_id: sandboxId,
        path: absolutePath.default('/root').describe('Absolute directory path. Default /root.'),
      },
      outputSchema: { path: z.string(), entries: z.array(ENTRY), truncated: z.boolean() },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    guarded(async (args, extra) => {
      const sandbox = await session.connect(args.sandbox_id, extra.signal);
      const entries = await sandbox.files.list(args.path, { signal: extra.signal });
      return structured({
        path: args.path,
        entries: entries.slice(0, MAX_ENTRIES).map(entryOf),
        truncated: entries.length > MAX_ENTRIES,
      });
    }),
  );
}

/** Up to `max` bytes of the file from `offset` on, reading no further than needed. */
async function readPart(
  sandbox: Sandbox,
  path: string,
  offset: number,
  max: number,
  signal: AbortSignal,
): Promise<Buffer> {
  const stream = await sandbox.files.readStream(path, { signal });
  const parts: Buffer[] = [];
  let skipped = 0;
  let kept = 0;
  try {
    for await (const chunk of stream as AsyncIterable<Buffer>) {
      let piece = chunk;
      if (skipped < offset) {
        const skip = Math.min(offset - skipped, piece.length);
        skipped += skip;
        piece = piece.subarray(skip);
      }
      if (piece.length === 0) continue;
      parts.push(piece.subarray(0, max - kept));
      kept += Math.min(piece.length, max - kept);
      if (kept >= max) break;
    }
  } finally {
    stream.destroy();
  }
  return Buffer.concat(parts);
}

function entryOf(e: EntryInfo): z.infer<typeof ENTRY> {
  return {
    name: e.name,
    type: e.type,
    size: e.size,
    mode: e.mode.toString(8).padStart(4, '0'),
    modified: new Date(e.mtime_ms).toISOString(),
    ...(e.target === undefined || e.target === null ? {} : { target: e.target }),
  };
}
