"""``sandbox.files``: reading and writing a sandbox's files without going through code
(docs/api.md, "Files"). Both directions stream: uploads are read from their source as hostd
takes them, downloads written as they arrive. File operations have their own lane on the
server, so they do not wait behind a running exec. AsyncFiles (_async_files.py) is the asyncio
twin, method for method."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Union

from . import _calls, _http
from ._config import ClientConfig
from ._tar import extract_tar, tar_directory
from ._types import EntryInfo, TransferInfo, WriteInfo

#: What ``files.write`` takes: text (written as UTF-8), bytes, a binary file object (read in
#: chunks as it is sent), or an iterable of bytes. A file object or an iterable can be read only
#: once, so its upload is not retried on a 429 or 503.
WriteData = Union[str, bytes, bytearray, memoryview, Any, Iterable[bytes]]

_CHUNK = 65536


def upload_body(data: WriteData) -> _calls.Body:
    """Bytes for what is already in memory, a one-shot iterator of chunks for the rest."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return iter(lambda: data.read(_CHUNK), data.read(0))
    if hasattr(data, "__iter__") or hasattr(data, "__aiter__"):
        return data
    raise TypeError("files.write takes str, bytes, a binary file or an iterable of bytes, not %s" % type(data).__name__)


class FileStream:
    """A file being downloaded: ``read(n)``, iteration over chunks as they arrive, ``close()``;
    also a context manager. Works with ``shutil.copyfileobj``."""

    def __init__(self, response: _http.Response) -> None:
        self._response = response

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes as soon as some arrive (all that is left when ``size`` < 0);
        ``b""`` at the end."""
        if size is None or size < 0:
            return self._response.read_all()
        return self._response.read_chunk(size)

    def readable(self) -> bool:
        return True

    def __iter__(self) -> Iterator[bytes]:
        while True:
            chunk = self._response.read_chunk(_CHUNK)
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        """Closes the download, also when it is not finished."""
        self._response.close()

    def __enter__(self) -> "FileStream":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Files:
    """The files of one sandbox; use ``sandbox.files``."""

    def __init__(self, sandbox_id: str, config: ClientConfig) -> None:
        self._id = sandbox_id
        self._config = config

    def write(self, path: str, data: WriteData, mode: Union[int, str, None] = None) -> WriteInfo:
        """Writes ``data`` to the file at ``path`` (absolute), replacing it, creating its parent
        directories. ``mode`` is ``0o755`` or ``"0755"`` (default ``0644``). The file appears
        only once complete: a failed upload leaves nothing::

            with open("data.csv", "rb") as f:
                sandbox.files.write("/root/data.csv", f)
        """
        return _http.call_json(self._config, _calls.write_file(self._id, path, upload_body(data), mode))

    def read(self, path: str) -> bytes:
        """The bytes of the file at ``path``; SandboxFileNotFoundError (a FileNotFoundError)
        if there is none. Use ``read_stream`` for files too big to hold in memory."""
        return _http.call_bytes(self._config, _calls.read_file(self._id, path))

    def read_stream(self, path: str) -> FileStream:
        """The file at ``path`` as a stream, returned once hostd has answered (so a missing file
        raises here, not in the middle of the stream)::

            with sandbox.files.read_stream("/root/big.bin") as src, open("big.bin", "wb") as dst:
                shutil.copyfileobj(src, dst)
        """
        return FileStream(_http.send(self._config, _calls.read_file(self._id, path)))

    def list(self, path: str) -> List[EntryInfo]:
        """The entries of directory ``path``, one level, sorted by name."""
        return _http.call_json(self._config, _calls.list_dir(self._id, path))["entries"]

    def stat(self, path: str) -> EntryInfo:
        """What is at ``path`` (a symlink is described, not followed)."""
        return _http.call_json(self._config, _calls.stat(self._id, path))

    def mkdir(self, path: str) -> None:
        """Creates directory ``path`` and its parents; no error if it exists."""
        _http.call_bytes(self._config, _calls.mkdir(self._id, path))

    def move(self, path: str, to: str) -> str:
        """Renames ``path`` to ``to`` (a file or a whole directory), making ``to``'s parents;
        returns the new path. A file at ``to`` is replaced."""
        return _http.call_json(self._config, _calls.move(self._id, path, to))["path"]

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes the file or symlink at ``path``, or a whole directory with ``recursive=True``
        (without it, a directory is InvalidRequestError with code ``is_a_directory``)."""
        _http.call_bytes(self._config, _calls.remove(self._id, path, recursive))

    def upload_dir(self, local_dir: str, remote_dir: str) -> TransferInfo:
        """Uploads everything under the local directory ``local_dir`` into ``remote_dir``
        (created if missing) as one tar stream. Symlinks are sent as links."""
        call = _calls.upload_tar(self._id, remote_dir, lambda: tar_directory(local_dir))
        return _http.call_json(self._config, call)

    def download_dir(self, remote_dir: str, local_dir: str) -> TransferInfo:
        """Downloads everything under ``remote_dir`` into the local directory ``local_dir``
        (created if missing). The archive comes from untrusted code, so nothing is written
        outside ``local_dir`` or through a symlink (UnsafeArchiveError). On failure, what
        arrived so far stays."""
        with FileStream(_http.send(self._config, _calls.download_tar(self._id, remote_dir))) as stream:
            files, size = extract_tar(stream, local_dir)  # type: ignore[arg-type]
        return {"path": local_dir, "files": files, "size": size}
