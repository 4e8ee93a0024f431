"""``Sandbox``: one hostd sandbox (a microVM with a persistent Python REPL) and what can be
done with it. Every method maps onto one HTTP call of docs/api.md; AsyncSandbox
(_async_sandbox.py) is the asyncio twin, method for method."""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Union

from . import _calls, _http
from ._config import ClientConfig, resolve_config
from ._display import to_display
from ._errors import HostdError
from ._exec import exec_events
from ._files import Files
from ._snapshot import Snapshot
from ._types import CellError, ContextInfo, Display, ExecEvent, RunResult, SandboxInfo


def gone(e: HostdError) -> bool:
    """Whether a delete failed only because the sandbox is gone already (deleted, or merged away
    as a winner); ``not_found`` is what a server too old to send codes says."""
    return e.code in ("sandbox_not_found", "not_found")


class Sandbox:
    """A sandbox on a hostd server. Get one with ``Sandbox.create()`` or ``Sandbox.connect(id)``.

    As a context manager it deletes the sandbox on exit::

        with Sandbox.create() as sandbox:
            print(sandbox.run("print(6 * 7)").stdout)
    """

    def __init__(self, sandbox_id: str, config: Optional[ClientConfig] = None) -> None:
        """A handle on ``sandbox_id`` without checking that it exists (``connect`` checks);
        ``config`` defaults to the environment's."""
        #: ``sbx_`` followed by 32 lowercase hex characters.
        self.id = sandbox_id
        self._config = config if config is not None else resolve_config()
        #: The sandbox's files: read, write, list, upload and download directories.
        self.files = Files(sandbox_id, self._config)

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        snapshot: Union[Snapshot, str, None] = None,
        env: Optional[Dict[str, str]] = None,
        allow_out: Optional[List[str]] = None,
        metadata: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        on_timeout: Optional[str] = None,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> "Sandbox":
        """Creates a sandbox, from the template's warm pool when it has one ready, or from a
        snapshot (``snapshot``, a Snapshot or its id; not together with ``template``).
        ``template`` defaults to the server's first (``python``). ``env`` is the environment of
        every exec (fork children inherit it). ``allow_out`` lists what the sandbox may connect
        to (``example.com``, ``example.com:443``, ``*.example.com``, ``203.0.113.0/24``, ``*``,
        ``host.hostd.internal:PORT``); without it the sandbox has no network. ``metadata`` are
        labels of yours, kept with the sandbox. ``timeout`` is a lifetime in seconds of running
        time, after which the sandbox is deleted, or paused with ``on_timeout="pause"``; pausing
        stops the clock and each resume gives the whole lifetime again."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        snapshot_id = snapshot.id if hasattr(snapshot, "id") else snapshot
        created = _http.call_json(config, _calls.create(template, snapshot_id, env, allow_out, metadata, timeout, on_timeout))  # type: ignore[arg-type]
        return cls(created["id"], config)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> "Sandbox":
        """Attaches to an existing sandbox, checking that it exists (SandboxNotFoundError if not)."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        info = _http.call_json(config, _calls.info(sandbox_id))
        return cls(info["id"], config)

    @classmethod
    def list(
        cls,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> List[SandboxInfo]:
        """Every sandbox on the server, running, paused or failed."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return _http.call_json(config, _calls.list_sandboxes())["sandboxes"]

    def info(self) -> SandboxInfo:
        """The server's description of this sandbox (state, template, parent, busy, network, ...)."""
        return _http.call_json(self._config, _calls.info(self.id))

    def exec(
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
    ) -> Iterator[ExecEvent]:
        """Runs code and yields its events in ``seq`` order as they arrive: ``stdout`` and
        ``stderr`` lines, ``display`` bundles (with ``display=True``), then one ``exit`` with the
        exit code. ``language`` is ``python`` (the persistent REPL) or ``bash`` (a fresh
        process). ``timeout`` in seconds interrupts the code (exit code 124); it also bounds how
        long the SDK waits on a silent stream (``timeout`` plus ``request_timeout``): without
        it, a running exec may stay silent forever. ``env`` and ``cwd`` apply to this exec only.
        ``context`` names the REPL context to run in (``create_context``; one the sandbox lacks
        raises ContextNotFoundError). ``notebook=True`` runs the code as a notebook cell
        (docs/api.md, Notebook mode): ``execution_count``, ``result`` and ``error`` events, rich
        outputs on, IPython's ``!cmd`` and ``%magic`` lines.

        The request is sent when iteration starts; closing the generator early closes the
        connection, which interrupts the code. A 429 or 503 answer is retried like any request
        (no event was streamed yet); a failure of the sandbox during the exec raises
        ExecutorError::

            for event in sandbox.exec("print(1)"):
                print(event.type, event.data)
        """
        call = _calls.exec_code(
            self._config, self.id, code, language, timeout, env, cwd, display, context, notebook
        )
        yield from exec_events(_http.send(self._config, call))

    def run(
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
        """Runs code to completion and collects its output and (with ``display=True``) its rich
        outputs; a notebook cell (``notebook=True``) also its ``result``, ``error`` and
        ``execution_count``. A non-zero exit code (an uncaught Python exception gives 1) is a
        result, not an exception::

            result = sandbox.run("x = 41\\nprint(x + 1)")   # result.stdout == "42\\n"
        """
        collected = _Collector(on_stdout, on_stderr, on_display, on_result, on_error)
        events = self.exec(
            code, language, timeout, env=env, cwd=cwd, display=display, context=context, notebook=notebook
        )
        for event in events:
            collected.add(event)
        return collected.result()

    def create_context(self, id: Optional[str] = None, cwd: Optional[str] = None) -> ContextInfo:
        """Creates a REPL context: an independent Python namespace with its own working
        directory, for execs that name it (``context=``). ``id`` defaults to 16 random hex
        digits, ``cwd`` (an existing directory) to the default context's. Fork children get
        their parent's contexts::

            ctx = sandbox.create_context(cwd="/tmp")
            sandbox.run("x = 1", context=ctx["id"])
        """
        return _http.call_json(self._config, _calls.create_context(self.id, id, cwd))

    def list_contexts(self) -> List[ContextInfo]:
        """The sandbox's REPL contexts, ``default`` (its own namespace) first."""
        return _http.call_json(self._config, _calls.list_contexts(self.id))["contexts"]

    def restart_context(self, context: str) -> ContextInfo:
        """Gives a context a fresh namespace, its first working directory and a count of 0."""
        return _http.call_json(self._config, _calls.restart_context(self.id, context))

    def delete_context(self, context: str) -> None:
        """Deletes a context (not ``default``: restart that one)."""
        _http.call_bytes(self._config, _calls.delete_context(self.id, context))

    def fork(self, n: int) -> List["Sandbox"]:
        """Creates ``n`` (1 to 32) copy-on-write children that start from this sandbox's whole
        state: REPL variables, files, processes. Children come back in no particular order."""
        body = _http.call_json(self._config, _calls.fork(self.id, n))
        return [Sandbox(child["id"], self._config) for child in body["children"]]

    def merge(self, winner: Union["Sandbox", str]) -> None:
        """Makes this sandbox adopt ``winner``'s state: from now on this id drives the winner's
        VM, this sandbox's previous VM is destroyed, and the winner's id no longer exists."""
        winner_id = winner if isinstance(winner, str) else winner.id
        _http.call_bytes(self._config, _calls.merge(self.id, winner_id))

    def snapshot(self, name: Optional[str] = None) -> Snapshot:
        """Saves this sandbox's whole state (memory and files) as a snapshot to create sandboxes
        from, any number of times; ``name`` is a name of yours for it (not unique). The sandbox
        keeps running::

            snap = sandbox.snapshot()
            copy = Sandbox.create(snapshot=snap)
        """
        return Snapshot(_http.call_json(self._config, _calls.take_snapshot(self.id, name)), self._config)

    def pause(self) -> None:
        """Writes the sandbox to disk and stops its VM, so that it costs no host memory; its next
        use (or ``resume``) brings it back with its state. Pausing a paused sandbox does nothing."""
        _http.call_bytes(self._config, _calls.pause(self.id))

    def set_timeout(self, timeout: Optional[float], on_timeout: Optional[str] = None) -> SandboxInfo:
        """Sets the sandbox's lifetime to ``timeout`` seconds of running time from now (shorter or
        longer than before); ``None`` removes it. ``on_timeout`` (``delete`` or ``pause``) is kept
        as it was unless given. Returns the sandbox's info, with its new ``expires_at``."""
        return _http.call_json(self._config, _calls.set_timeout(self.id, timeout, on_timeout))  # type: ignore[return-value]

    def resume(self) -> None:
        """Starts a paused sandbox again now, rather than on its next use."""
        _http.call_bytes(self._config, _calls.resume(self.id))

    def delete(self) -> None:
        """Destroys the sandbox. Deleting it twice raises SandboxNotFoundError."""
        _http.call_bytes(self._config, _calls.delete(self.id))

    def logs(self) -> str:
        """The tail of the VM's console and QEMU's stderr, for debugging a misbehaving guest."""
        return _http.call_bytes(self._config, _calls.logs(self.id)).decode("utf-8", errors="replace")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.delete()
        except HostdError as e:
            if not gone(e):
                raise

    def __repr__(self) -> str:
        return "Sandbox(%r)" % self.id

    def __str__(self) -> str:
        return self.id


class _Collector:
    """What ``run`` gathers from the events, calling the callbacks as they arrive."""

    def __init__(
        self,
        on_stdout: Optional[Callable[[str], None]],
        on_stderr: Optional[Callable[[str], None]],
        on_display: Optional[Callable[[Display], None]],
        on_result: Optional[Callable[[Display], None]] = None,
        on_error: Optional[Callable[[CellError], None]] = None,
    ) -> None:
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._on_display, self._on_result, self._on_error = on_display, on_result, on_error
        self._lines: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        self._displays: List[Display] = []
        self._exit_code = -1
        self._result: Optional[Display] = None
        self._error: Optional[CellError] = None
        self._count: Optional[int] = None

    def add(self, event: ExecEvent) -> None:
        if event.type == "exit":
            self._exit_code = int(event.data)  # type: ignore[arg-type]
        elif event.type == "display":
            display = to_display(event.data)  # type: ignore[arg-type]
            self._displays.append(display)
            if self._on_display is not None:
                self._on_display(display)
        elif event.type == "result":
            self._result = to_display(event.data)  # type: ignore[arg-type]
            if self._on_result is not None:
                self._on_result(self._result)
        elif event.type == "error":
            self._error = event.data  # type: ignore[assignment]
            if self._on_error is not None:
                self._on_error(self._error)  # type: ignore[arg-type]
        elif event.type == "execution_count":
            self._count = int(event.data)  # type: ignore[arg-type]
        else:
            self._lines[event.type].append(str(event.data) if event.partial else "%s\n" % event.data)
            callback = self._callbacks[event.type]
            if callback is not None:
                callback(str(event.data))

    def result(self) -> RunResult:
        return RunResult(
            "".join(self._lines["stdout"]),
            "".join(self._lines["stderr"]),
            self._exit_code,
            self._displays,
            self._result,
            self._error,
            self._count,
        )
