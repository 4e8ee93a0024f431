"""Every request of docs/api.md as data: method, path, query, body, and how long its body may
stay silent. The blocking classes (Sandbox, Files, ...) and their asyncio twins (AsyncSandbox,
AsyncFiles, ...) build their requests here and only send them differently, so the two cannot
drift apart in what they ask of the server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Union
from urllib.parse import quote

from ._config import ClientConfig

#: A raw request body: bytes (sent again on a retry), a function that makes a fresh iterable of
#: bytes for each attempt (so it can be retried too), or a one-shot iterable of bytes (an upload
#: from a stream), which is never retried. The asyncio client also takes an async iterable.
Body = Union[bytes, Callable[[], Iterable[bytes]], Iterable[bytes], Any]


@dataclass
class Call:
    method: str
    #: From ``/v1/...``; the base URL's own path goes in front.
    path: str
    #: Encoded like JavaScript's encodeURIComponent; None values are left out.
    query: Optional[Dict[str, Optional[str]]] = None
    #: Sent as ``application/json``.
    json: Optional[Dict[str, Any]] = None
    body: Body = None
    #: Of ``body``; default ``application/octet-stream``.
    content_type: Optional[str] = None
    accept: str = "application/json"
    #: The longest silence (seconds) while the response body is read: None for the request
    #: timeout, 0 for none.
    body_timeout: Optional[float] = None

    @property
    def replayable(self) -> bool:
        """Whether the body can be sent again (so a 429 or 503 can be retried)."""
        return self.body is None or isinstance(self.body, bytes) or callable(self.body)

    def target(self, config: ClientConfig) -> str:
        """The request target: the base URL's path, the route, the query string."""
        pairs = [(k, v) for k, v in (self.query or {}).items() if v is not None]
        query = "&".join("%s=%s" % (_component(k), _component(v)) for k, v in pairs)
        return config.prefix + self.path + ("?" + query if query else "")


def _component(value: str) -> str:
    """As encodeURIComponent, so that both SDKs send byte-identical URLs."""
    return quote(value, safe="!*'()")


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return "/v1/sandboxes/%s%s" % (quote(sandbox_id, safe=""), suffix)


# --- sandboxes ---------------------------------------------------------------------------------


def create(
    template: Optional[str],
    snapshot: Optional[str],
    env: Optional[Dict[str, str]],
    allow_out: Optional[List[str]],
    metadata: Optional[Dict[str, str]] = None,
    timeout: Optional[float] = None,
    on_timeout: Optional[str] = None,
) -> Call:
    body: Dict[str, Any] = {}
    if template is not None:
        body["template"] = template
    if snapshot is not None:
        body["snapshot"] = snapshot
    if env is not None:
        body["env"] = dict(env)
    if allow_out is not None:
        body["network"] = {"allow_out": list(allow_out)}
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if timeout is not None:
        body["timeout"] = timeout
    if on_timeout is not None:
        body["on_timeout"] = on_timeout
    return Call("POST", "/v1/sandboxes", json=body)


def list_sandboxes() -> Call:
    return Call("GET", "/v1/sandboxes")


def info(sandbox_id: str) -> Call:
    return Call("GET", sandbox_path(sandbox_id))


def exec_code(
    config: ClientConfig,
    sandbox_id: str,
    code: str,
    language: str,
    timeout: Optional[float],
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    display: Optional[bool],
    context: Optional[str] = None,
    notebook: Optional[bool] = None,
) -> Call:
    body: Dict[str, Any] = {"code": code, "language": language}
    if timeout is not None:
        body["timeout"] = timeout
    if env is not None:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if display is not None:
        body["display"] = display
    if context is not None:
        body["context"] = context
    if notebook is not None:
        body["notebook"] = notebook
    # A running exec may print nothing for as long as its own timeout allows; without one, for
    # as long as the code runs.
    silence = config.request_timeout
    body_timeout = timeout + silence if timeout is not None and silence > 0 else 0
    return Call(
        "POST",
        sandbox_path(sandbox_id, "/exec"),
        json=body,
        accept="application/x-ndjson",
        body_timeout=body_timeout,
    )


def create_context(sandbox_id: str, context_id: Optional[str], cwd: Optional[str]) -> Call:
    body: Dict[str, Any] = {}
    if context_id is not None:
        body["id"] = context_id
    if cwd is not None:
        body["cwd"] = cwd
    return Call("POST", sandbox_path(sandbox_id, "/contexts"), json=body)


def list_contexts(sandbox_id: str) -> Call:
    return Call("GET", sandbox_path(sandbox_id, "/contexts"))


def restart_context(sandbox_id: str, context: str) -> Call:
    return Call("POST", sandbox_path(sandbox_id, "/contexts/%s/restart" % quote(context, safe="")))


def delete_context(sandbox_id: str, context: str) -> Call:
    return Call("DELETE", sandbox_path(sandbox_id, "/contexts/%s" % quote(context, safe="")))


def fork(sandbox_id: str, n: int) -> Call:
    return Call("POST", sandbox_path(sandbox_id, "/fork"), json={"n": n})


def merge(sandbox_id: str, winner_id: str) -> Call:
    return Call("POST", sandbox_path(sandbox_id, "/merge_into/%s" % quote(winner_id, safe="")))


def take_snapshot(sandbox_id: str, name: Optional[str] = None) -> Call:
    if name is None:
        return Call("POST", sandbox_path(sandbox_id, "/snapshot"))
    return Call("POST", sandbox_path(sandbox_id, "/snapshot"), json={"name": name})


def pause(sandbox_id: str) -> Call:
    return Call("POST", sandbox_path(sandbox_id, "/pause"))


def set_timeout(sandbox_id: str, timeout: Optional[float], on_timeout: Optional[str]) -> Call:
    body: Dict[str, Any] = {"timeout": timeout}
    if on_timeout is not None:
        body["on_timeout"] = on_timeout
    return Call("POST", sandbox_path(sandbox_id, "/timeout"), json=body)


def resume(sandbox_id: str) -> Call:
    return Call("POST", sandbox_path(sandbox_id, "/resume"))


def delete(sandbox_id: str) -> Call:
    return Call("DELETE", sandbox_path(sandbox_id))


def logs(sandbox_id: str) -> Call:
    return Call("GET", sandbox_path(sandbox_id, "/logs"), accept="text/plain")


# --- files -------------------------------------------------------------------------------------


def _files(sandbox_id: str, suffix: str = "") -> str:
    return sandbox_path(sandbox_id, "/files" + suffix)


def mode_string(mode: Union[int, str, None]) -> Optional[str]:
    """``0o755`` and ``"0755"`` both become ``"0755"``, the octal string hostd takes."""
    if mode is None or isinstance(mode, str):
        return mode
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise ValueError("mode must be a permission number from 0 to 0o7777, got %r" % (mode,))
    return format(mode, "04o")


def write_file(sandbox_id: str, path: str, body: Body, mode: Union[int, str, None]) -> Call:
    return Call("PUT", _files(sandbox_id), query={"path": path, "mode": mode_string(mode)}, body=body)


def read_file(sandbox_id: str, path: str) -> Call:
    return Call("GET", _files(sandbox_id), query={"path": path}, accept="application/octet-stream")


def list_dir(sandbox_id: str, path: str) -> Call:
    return Call("GET", _files(sandbox_id, "/list"), query={"path": path})


def stat(sandbox_id: str, path: str) -> Call:
    return Call("GET", _files(sandbox_id, "/stat"), query={"path": path})


def mkdir(sandbox_id: str, path: str) -> Call:
    return Call("POST", _files(sandbox_id, "/mkdir"), query={"path": path})


def move(sandbox_id: str, path: str, to: str) -> Call:
    return Call("POST", _files(sandbox_id, "/move"), query={"path": path, "to": to})


def remove(sandbox_id: str, path: str, recursive: bool) -> Call:
    return Call("DELETE", _files(sandbox_id), query={"path": path, "recursive": "1" if recursive else None})


def upload_tar(sandbox_id: str, remote_dir: str, make_tar: Callable[[], Iterable[bytes]]) -> Call:
    return Call(
        "PUT", _files(sandbox_id), query={"path": remote_dir}, body=make_tar, content_type="application/x-tar"
    )


def download_tar(sandbox_id: str, remote_dir: str) -> Call:
    return Call(
        "GET", _files(sandbox_id), query={"path": remote_dir, "format": "tar"}, accept="application/x-tar"
    )


# --- snapshots and templates ---------------------------------------------------------------------


def _snapshot_path(snapshot_id: str) -> str:
    return "/v1/snapshots/%s" % quote(snapshot_id, safe="")


def list_snapshots() -> Call:
    return Call("GET", "/v1/snapshots")


def get_snapshot(snapshot_id: str) -> Call:
    return Call("GET", _snapshot_path(snapshot_id))


def delete_snapshot(snapshot_id: str) -> Call:
    return Call("DELETE", _snapshot_path(snapshot_id))


def list_templates() -> Call:
    return Call("GET", "/v1/templates")


def get_template(name: str) -> Call:
    return Call("GET", "/v1/templates/%s" % quote(name, safe=""))


def template_log(name: str) -> Call:
    return Call("GET", "/v1/templates/%s/log" % quote(name, safe=""), accept="text/plain")
