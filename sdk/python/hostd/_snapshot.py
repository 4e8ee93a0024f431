"""``Snapshot``: a sandbox's whole state (REPL memory and files) kept on disk by hostd, to create
any number of sandboxes from later (``Sandbox.create(snapshot=...)``). Snapshots survive hostd
restarts. Made by ``sandbox.snapshot()``. AsyncSnapshot is the asyncio twin."""

from __future__ import annotations

from typing import List, Optional

from . import _ahttp, _calls, _http
from ._config import ClientConfig, resolve_config
from ._types import SnapshotInfo


class Snapshot:
    """A snapshot on a hostd server; ``id`` (``snap_…``) is what ``Sandbox.create(snapshot=)``
    takes, ``info`` the server's description when this object was made."""

    def __init__(self, info: SnapshotInfo, config: ClientConfig) -> None:
        self.id: str = info["snapshot_id"]
        self.info = info
        self._config = config

    @classmethod
    def list(
        cls,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> List["Snapshot"]:
        """Every snapshot on the server, newest first."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return [cls(info, config) for info in _http.call_json(config, _calls.list_snapshots())["snapshots"]]

    @classmethod
    def get(
        cls,
        snapshot_id: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> "Snapshot":
        """The snapshot ``snapshot_id``; SnapshotNotFoundError if it does not exist."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return cls(_http.call_json(config, _calls.get_snapshot(snapshot_id)), config)

    def delete(self) -> None:
        """Removes the snapshot from the list and from new creates. Sandboxes made from it keep
        running; hostd frees its files when the last of them goes."""
        _http.call_bytes(self._config, _calls.delete_snapshot(self.id))

    def __repr__(self) -> str:
        return "Snapshot(%r)" % self.id

    def __str__(self) -> str:
        return self.id


class AsyncSnapshot:
    """The asyncio twin of Snapshot."""

    def __init__(self, info: SnapshotInfo, config: ClientConfig) -> None:
        self.id: str = info["snapshot_id"]
        self.info = info
        self._config = config

    @classmethod
    async def list(
        cls,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> List["AsyncSnapshot"]:
        """Every snapshot on the server, newest first."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        body = await _ahttp.call_json(config, _calls.list_snapshots())
        return [cls(info, config) for info in body["snapshots"]]

    @classmethod
    async def get(
        cls,
        snapshot_id: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> "AsyncSnapshot":
        """The snapshot ``snapshot_id``; SnapshotNotFoundError if it does not exist."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return cls(await _ahttp.call_json(config, _calls.get_snapshot(snapshot_id)), config)

    async def delete(self) -> None:
        """Removes the snapshot from the list and from new creates."""
        await _ahttp.call_bytes(self._config, _calls.delete_snapshot(self.id))

    def __repr__(self) -> str:
        return "AsyncSnapshot(%r)" % self.id

    def __str__(self) -> str:
        return self.id
