"""``Template``: the guest environments a server offers (``python``, ``python-slim``, users'
own), with their build state and resources. Pick one with ``Sandbox.create(template=...)``.
AsyncTemplate is the asyncio twin."""

from __future__ import annotations

from typing import List, Optional

from . import _ahttp, _calls, _http
from ._config import resolve_config
from ._types import TemplateInfo


class Template:
    """The server's templates, as it describes them (no instances: classmethods only)."""

    @classmethod
    def list(
        cls,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> List[TemplateInfo]:
        """Every template, in the server's order: the first is the default."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return _http.call_json(config, _calls.list_templates())["templates"]

    @classmethod
    def get(
        cls,
        name: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> TemplateInfo:
        """The template ``name``; TemplateNotFoundError if the server has none by that name."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return _http.call_json(config, _calls.get_template(name))

    @classmethod
    def log(
        cls,
        name: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> str:
        """The end of template ``name``'s last build log: what each build step printed, for a
        template that failed (its ``error`` quotes only the last lines) or is still building.
        Empty when it was never built on that server."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return _http.call_bytes(config, _calls.template_log(name)).decode("utf-8", errors="replace")


class AsyncTemplate:
    """The asyncio twin of Template."""

    @classmethod
    async def list(
        cls,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> List[TemplateInfo]:
        """Every template, in the server's order: the first is the default."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return (await _ahttp.call_json(config, _calls.list_templates()))["templates"]

    @classmethod
    async def get(
        cls,
        name: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> TemplateInfo:
        """The template ``name``; TemplateNotFoundError if the server has none by that name."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return await _ahttp.call_json(config, _calls.get_template(name))

    @classmethod
    async def log(
        cls,
        name: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> str:
        """The end of template ``name``'s last build log (see Template.log)."""
        config = resolve_config(api_key, base_url, request_timeout=request_timeout, max_retries=max_retries)
        return (await _ahttp.call_bytes(config, _calls.template_log(name))).decode("utf-8", errors="replace")
