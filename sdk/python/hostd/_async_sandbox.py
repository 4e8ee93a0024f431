"""``AsyncSandbox``: the asyncio twin of Sandbox (_sandbox.py), method for method, standard
library only. The requests are the same (both build them in _calls.py); they go through a small
HTTP/1.1 client over asyncio streams (_ahttp.py)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Generator, List, Optional, Union

from . import _ahttp, _calls
from ._async_files import AsyncFiles
from ._config import ClientConfig, resolve_config
from ._errors import HostdError
from ._exec import aexec_events
from ._sandbox import _Collector, gone
from ._snapshot import AsyncSnapshot, Snapshot
from ._types import CellError, ContextInfo, Display, ExecEvent, RunResult, SandboxInfo


class _Creating:
    """What ``AsyncSandbox.create`` returns: await it for the sandbox, or use it in
    ``async with`` to have the sandbox deleted at the end of the block."""

    def __init__(self, pending: Awaitable["AsyncSandbox"]) -> None:
        self._pending = pending
        self._sandbox: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._pending.__await__()

    async def __aenter__(self) -> "AsyncSandbox":
        self._sandbox = await self._pending
        return self._sandbox

    async def __aexit__(self, *exc_info: object) -> None:
        if self._sandbox is not None:
            await self._sandbox.__aexit__(*exc_info)


class AsyncSandbox:
    """A sandbox on a hostd server, for asyncio code::

        async with AsyncSandbox.create() as sandbox:     # deleted at the end of the block
            print((await sandbox.run("print(6 * 7)")).stdout)
    """

    def __init__(self, sandbox_id: str, config: Optional[ClientConfig] = None) -> None:
        """A handle on ``sandbox_id`` without checking that it exists (``connect`` checks)."""
        self.id = sandbox_id
        self._config = config if config is not None else resolve_config()
        #: The sandbox's files: read, write, list, upload and download directories.
        self.files = AsyncFiles(sandbox_id, self._config)

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        snapshot: Union[Snapshot, AsyncSnapshot, str, None] = None,
        env: Optional[Dict[str, str]] = None,
        allow_out: Optional[List[str]] = None,
        metadata: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        on_timeout: Optional[str] = None,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> _Creating:
        """Creates a sandbox; see Sandbox.create. Await the result, or ``async with`` it."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        snapshot_id = snapshot if snapshot is None or isinstance(snapshot, str) else snapshot.id

        async def created() -> "AsyncSandbox":
            body = await _ahttp.call_json(config, _calls.create(template, snapshot_id, env, allow_out, metadata, timeout, on_timeout))
            return cls(body["id"], config)

        return _Creating(created())

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> "AsyncSandbox":
        """Attaches to an existing sandbox, checking that it exists (SandboxNotFoundError if not)."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        info = await _ahttp.call_json(config, _calls.info(sandbox_id))
        return cls(info["id"], config)

    @classmethod
    async def list(
        cls,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> List[SandboxInfo]:
        """Every sandbox on the server, running, paused or failed."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return (await _ahttp.call_json(config, _calls.list_sandboxes()))["sandboxes"]

    async def info(self) -> SandboxInfo:
        """The server's description of this sandbox."""
        return await _ahttp.call_json(self._config, _calls.info(self.id))

    async def exec(
        self,
        code: str,
        language: str = "python",
        timeout: Optional[float] = None,
        *,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        display: Optional[bool] = None,
        context: Optional[str] = None,
        notebook: Optional[bool] = None,
    ) -> AsyncIterator[ExecEvent]:
        """Runs code and yields its events as they arrive; see Sandbox.exec. Closing the
        generator (``await events.aclose()``, or ``contextlib.aclosing``) closes the connection,
        which interrupts the code; leaving ``async for`` early without it leaves that to the
        garbage collector::

            async for event in sandbox.exec("print(1)"):
                print(event.type, event.data)
        """
        call = _calls.exec_code(
            self._config, self.id, code, language, timeout, env, cwd, display, context, notebook
        )
        async for event in aexec_events(await _ahttp.send(self._config, call)):
            yield event

    async def run(
        self,
        code: str,
        language: str = "python",
        timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        *,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        display: Optional[bool] = None,
        on_display: Optional[Callable[[Display], None]] = None,
        context: Optional[str] = None,
        notebook: Optional[bool] = None,
        on_result: Optional[Callable[[Display], None]] = None,
        on_error: Optional[Callable[[CellError], None]] = None,
    ) -> RunResult:
        """Runs code to completion and collects its output; see Sandbox.run."""
        collected = _Collector(on_stdout, on_stderr, on_display, on_result, on_error)
        events = self.exec(
            code, language, timeout, env=env, cwd=cwd, display=display, context=context, notebook=notebook
        )
        async for event in events:
            collected.add(event)
        return collected.result()

    async def create_context(self, id: Optional[str] = None, cwd: Optional[str] = None) -> ContextInfo:
        """Creates a REPL context; see Sandbox.create_context."""
        return await _ahttp.call_json(self._config, _calls.create_context(self.id, id, cwd))

    async def list_contexts(self) -> List[ContextInfo]:
        """The sandbox's REPL contexts, ``default`` first."""
        return (await _ahttp.call_json(self._config, _calls.list_contexts(self.id)))["contexts"]

    async def restart_context(self, context: str) -> ContextInfo:
        """Gives a context a fresh namespace; see Sandbox.restart_context."""
        return await _ahttp.call_json(self._config, _calls.restart_context(self.id, context))

    async def delete_context(self, context: str) -> None:
        """Deletes a context (not ``default``)."""
        await _ahttp.call_bytes(self._config, _calls.delete_context(self.id, context))

    async def fork(self, n: int) -> List["AsyncSandbox"]:
        """Creates ``n`` (1 to 32) copy-on-write children; see Sandbox.fork."""
        body = await _ahttp.call_json(self._config, _calls.fork(self.id, n))
        return [AsyncSandbox(child["id"], self._config) for child in body["children"]]

    async def merge(self, winner: Union["AsyncSandbox", str]) -> None:
        """Makes this sandbox adopt ``winner``'s state; see Sandbox.merge."""
        winner_id = winner if isinstance(winner, str) else winner.id
        await _ahttp.call_bytes(self._config, _calls.merge(self.id, winner_id))

    async def snapshot(self, name: Optional[str] = None) -> AsyncSnapshot:
        """Saves this sandbox's whole state as a snapshot; see Sandbox.snapshot."""
        return AsyncSnapshot(await _ahttp.call_json(self._config, _calls.take_snapshot(self.id, name)), self._config)

    async def pause(self) -> None:
        """Writes the sandbox to disk and stops its VM; see Sandbox.pause."""
        await _ahttp.call_bytes(self._config, _calls.pause(self.id))

    async def set_timeout(self, timeout: Optional[float], on_timeout: Optional[str] = None) -> SandboxInfo:
        """Sets the sandbox's lifetime; see Sandbox.set_timeout."""
        return await _ahttp.call_json(self._config, _calls.set_timeout(self.id, timeout, on_timeout))  # type: ignore[return-value]

    async def resume(self) -> None:
        """Starts a paused sandbox again now, rather than on its next use."""
        await _ahttp.call_bytes(self._config, _calls.resume(self.id))

    async def delete(self) -> None:
        """Destroys the sandbox. Deleting it twice raises SandboxNotFoundError."""
        await _ahttp.call_bytes(self._config, _calls.delete(self.id))

    async def logs(self) -> str:
        """The tail of the VM's console and QEMU's stderr."""
        return (await _ahttp.call_bytes(self._config, _calls.logs(self.id))).decode("utf-8", errors="replace")

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self.delete()
        except HostdError as e:
            if not gone(e):
                raise

    def __repr__(self) -> str:
        return "AsyncSandbox(%r)" % self.id

    def __str__(self) -> str:
        return self.id
