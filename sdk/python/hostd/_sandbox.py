"""``Sandbox``: one hostd sandbox (a microVM with a persistent Python REPL) and what can be
done with it. Every method maps onto one HTTP call of docs/api.md."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Union
from urllib.parse import quote

from . import _http
from ._config import ClientConfig, resolve_config
from ._errors import NotFoundException
from ._exec import exec_events
from ._types import ExecEvent, RunResult


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

    @classmethod
    def create(
        cls, template: Optional[str] = None, api_key: Optional[str] = None, base_url: Optional[str] = None
    ) -> "Sandbox":
        """Creates a sandbox, from the template's warm pool when it has one ready. ``template``
        defaults to the server's first template (``python``)."""
        config = resolve_config(api_key, base_url)
        body = {} if template is None else {"template": template}
        created = _http.request_json(config, "POST", "/v1/sandboxes", body)
        return cls(created["id"], config)

    @classmethod
    def connect(
        cls, sandbox_id: str, api_key: Optional[str] = None, base_url: Optional[str] = None
    ) -> "Sandbox":
        """Attaches to an existing sandbox, checking that it exists (NotFoundException if not)."""
        config = resolve_config(api_key, base_url)
        info = _http.request_json(config, "GET", _http.sandbox_path(sandbox_id))
        return cls(info["id"], config)

    @classmethod
    def list(
        cls, api_key: Optional[str] = None, base_url: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        """Every live sandbox on the server, as the server describes them (dicts with ``id``,
        ``state``, ``template``, ``created_at``, ``last_used_at``, ``parent_id``, ``busy``,
        ``queued``)."""
        config = resolve_config(api_key, base_url)
        return _http.request_json(config, "GET", "/v1/sandboxes")["sandboxes"]

    def info(self) -> Dict[str, Any]:
        """The server's description of this sandbox (template, parent, busy, ...)."""
        return _http.request_json(self._config, "GET", _http.sandbox_path(self.id))

    def exec(
        self, code: str, language: str = "python", timeout: Optional[float] = None
    ) -> Iterator[ExecEvent]:
        """Runs code and yields its events in ``seq`` order as they arrive: ``stdout`` and
        ``stderr`` lines, then one ``exit`` with the exit code. ``language`` is ``python`` (the
        persistent REPL) or ``bash`` (a fresh process). ``timeout`` in seconds interrupts the
        code (exit code 124). The request is sent when iteration starts; closing the generator
        early closes the connection, which interrupts the code. A failure of the sandbox
        during the exec raises ExecutorException::

            for event in sandbox.exec("print(1)"):
                print(event.type, event.data)
        """
        body: Dict[str, Any] = {"code": code, "language": language}
        if timeout is not None:
            body["timeout"] = timeout
        lines = _http.stream_lines(self._config, "POST", _http.sandbox_path(self.id, "/exec"), body)
        return exec_events(lines)

    def run(
        self,
        code: str,
        language: str = "python",
        timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> RunResult:
        """Runs code to completion and collects its output. A non-zero exit code (an uncaught
        Python exception gives 1) is a result, not an exception::

            result = sandbox.run("x = 41\\nprint(x + 1)")   # result.stdout == "42\\n"
        """
        stdout: List[str] = []
        stderr: List[str] = []
        exit_code = -1
        for event in self.exec(code, language=language, timeout=timeout):
            if event.type == "exit":
                exit_code = int(event.data)
            elif event.type == "stdout":
                stdout.append("%s\n" % event.data)
                if on_stdout is not None:
                    on_stdout(str(event.data))
            else:
                stderr.append("%s\n" % event.data)
                if on_stderr is not None:
                    on_stderr(str(event.data))
        return RunResult("".join(stdout), "".join(stderr), exit_code)

    def fork(self, n: int) -> List["Sandbox"]:
        """Creates ``n`` (1 to 32) copy-on-write children that start from this sandbox's whole
        state: REPL variables, files, processes. Children come back in no particular order."""
        body = _http.request_json(self._config, "POST", _http.sandbox_path(self.id, "/fork"), {"n": n})
        return [Sandbox(child["id"], self._config) for child in body["children"]]

    def merge(self, winner: Union["Sandbox", str]) -> None:
        """Makes this sandbox adopt ``winner``'s state: from now on this id drives the winner's
        VM, this sandbox's previous VM is destroyed, and the winner's id no longer exists."""
        winner_id = winner.id if isinstance(winner, Sandbox) else winner
        suffix = "/merge_into/%s" % quote(winner_id, safe="")
        _http.request(self._config, "POST", _http.sandbox_path(self.id, suffix))

    def delete(self) -> None:
        """Destroys the sandbox. Deleting it twice raises NotFoundException."""
        _http.request(self._config, "DELETE", _http.sandbox_path(self.id))

    def logs(self) -> str:
        """The tail of the VM's console and QEMU's stderr, for debugging a misbehaving guest."""
        data = _http.request(self._config, "GET", _http.sandbox_path(self.id, "/logs"), accept="text/plain")
        return data.decode("utf-8", errors="replace")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.delete()
        except NotFoundException:
            pass  # already deleted, or merged away as a winner

    def __repr__(self) -> str:
        return "Sandbox(%r)" % self.id

    def __str__(self) -> str:
        return self.id
