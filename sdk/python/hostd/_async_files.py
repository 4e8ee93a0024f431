"""``sandbox.files`` for AsyncSandbox: the asyncio twin of Files (_files.py), method for method.
Local disk work (reading a file being uploaded, building or unpacking a tar) runs in worker
threads, so the event loop never waits on the disk."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, List, Union

from . import _ahttp, _calls
from ._ahttp import AsyncResponse
from ._config import ClientConfig
from ._files import WriteData, upload_body
from ._tar import extract_tar, tar_directory
from ._types import EntryInfo, TransferInfo, WriteInfo

_CHUNK = 65536


class AsyncFileStream:
    """A file being downloaded: ``await read(n)``, ``async for`` over chunks as they arrive,
    ``await close()``; also an async context manager."""

    def __init__(self, response: AsyncResponse) -> None:
        self._response = response

    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes as soon as some arrive (all that is left when ``size`` < 0);
        ``b""`` at the end."""
        if size is None or size < 0:
            return await self._response.read_all()
        return await self._response.read_chunk(size)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._response.read_chunk(_CHUNK)
            if not chunk:
                return
            yield chunk

    async def close(self) -> None:
        """Closes the download, also when it is not finished."""
        await self._response.aclose()

    async def __aenter__(self) -> "AsyncFileStream":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class _BlockingReader:
    """A blocking ``read(n)`` over an AsyncResponse, for tarfile running in a worker thread:
    each read is done on the event loop, and the thread waits for it."""

    def __init__(self, response: AsyncResponse, loop: asyncio.AbstractEventLoop) -> None:
        self._response = response
        self._loop = loop

    def read(self, size: int = -1) -> bytes:
        return asyncio.run_coroutine_threadsafe(self._response.read_chunk(size if size > 0 else _CHUNK), self._loop).result()


class AsyncFiles:
    """The files of one sandbox; use ``sandbox.files``."""

    def __init__(self, sandbox_id: str, config: ClientConfig) -> None:
        self._id = sandbox_id
        self._config = config

    async def write(self, path: str, data: WriteData, mode: Union[int, str, None] = None) -> WriteInfo:
        """Writes ``data`` (text, bytes, a binary file, an iterable or an async iterable of
        bytes) to the file at ``path``; see Files.write."""
        return await _ahttp.call_json(self._config, _calls.write_file(self._id, path, upload_body(data), mode))

    async def read(self, path: str) -> bytes:
        """The bytes of the file at ``path``; SandboxFileNotFoundError if there is none."""
        return await _ahttp.call_bytes(self._config, _calls.read_file(self._id, path))

    async def read_stream(self, path: str) -> AsyncFileStream:
        """The file at ``path`` as a stream, returned once hostd has answered::

            async with await sandbox.files.read_stream("/root/big.bin") as stream:
                async for chunk in stream:
                    ...
        """
        return AsyncFileStream(await _ahttp.send(self._config, _calls.read_file(self._id, path)))

    async def list(self, path: str) -> List[EntryInfo]:
        """The entries of directory ``path``, one level, sorted by name."""
        return (await _ahttp.call_json(self._config, _calls.list_dir(self._id, path)))["entries"]

    async def stat(self, path: str) -> EntryInfo:
        """What is at ``path`` (a symlink is described, not followed)."""
        return await _ahttp.call_json(self._config, _calls.stat(self._id, path))

    async def mkdir(self, path: str) -> None:
        """Creates directory ``path`` and its parents; no error if it exists."""
        await _ahttp.call_bytes(self._config, _calls.mkdir(self._id, path))

    async def move(self, path: str, to: str) -> str:
        """Renames ``path`` to ``to``; see Files.move."""
        return (await _ahttp.call_json(self._config, _calls.move(self._id, path, to)))["path"]

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Removes the file or symlink at ``path``, or a whole directory with ``recursive=True``."""
        await _ahttp.call_bytes(self._config, _calls.remove(self._id, path, recursive))

    async def upload_dir(self, local_dir: str, remote_dir: str) -> TransferInfo:
        """Uploads everything under ``local_dir`` into ``remote_dir``; see Files.upload_dir."""
        call = _calls.upload_tar(self._id, remote_dir, lambda: tar_directory(local_dir))
        return await _ahttp.call_json(self._config, call)

    async def download_dir(self, remote_dir: str, local_dir: str) -> TransferInfo:
        """Downloads everything under ``remote_dir`` into ``local_dir``; see Files.download_dir."""
        response = await _ahttp.send(self._config, _calls.download_tar(self._id, remote_dir))
        try:
            reader = _BlockingReader(response, asyncio.get_running_loop())
            files, size = await asyncio.get_running_loop().run_in_executor(None, extract_tar, reader, local_dir)
        finally:
            await response.aclose()
        return {"path": local_dir, "files": files, "size": size}

