/**
 * Tar archives with entries no honest tool would write (`../x`, links out of the directory),
 * made with Python's tarfile so that the SDK's own writer is not the one under test.
 */
import { spawnSync } from 'node:child_process';

export interface Member {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'hardlink' | 'fifo';
  data?: string;
  linkname?: string;
  mode?: number;
}

const SCRIPT = `
import io, json, sys, tarfile
out = io.BytesIO()
kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
         "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}
with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
    for m in json.load(sys.stdin):
        info = tarfile.TarInfo(m["name"])
        info.type = kinds[m["type"]]
        info.mode = m.get("mode", 0o644)
        info.linkname = m.get("linkname", "")
        data = m.get("data", "").encode()
        info.size = len(data) if m["type"] == "file" else 0
        tar.addfile(info, io.BytesIO(data) if info.size else None)
sys.stdout.buffer.write(out.getvalue())
`;

export function craftTar(members: Member[]): Buffer {
  const r = spawnSync('python3', ['-c', SCRIPT], { input: JSON.stringify(members) });
  if (r.status !== 0) throw new Error(`python3 could not make the tar: ${r.stderr.toString()}`);
  return r.stdout;
}
