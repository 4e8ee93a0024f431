"""The asyncio client: a small HTTP/1.1 client over asyncio streams (the standard library has
none), sending the same Calls as the blocking client (_http.py) with the same timeouts,
retries and error mapping. One connection per request (``Connection: close``), which is also
how an exec is interrupted: closing it. Bodies are framed by content-length, chunked encoding,
or the end of the connection."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, AsyncIterator, Dict, Optional, Tuple

from ._calls import Call
from ._config import ClientConfig
from ._errors import ConnectionException, HostdError, error_from_response
from ._http import _SourceError, body_for, error_message, headers_for, timeout_error
from ._retry import parse_retry_after, retry_delay_ms

_CHUNK = 65536
_MAX_LINE = 65536


class _Closed(Exception):
    """The server closed the connection where HTTP said more was to come."""


class AsyncResponse:
    """An HTTP response whose body is read on demand. Reads raise RequestTimeoutError after a
    silence longer than the timeout, ConnectionException when the connection breaks."""

    def __init__(
        self,
        config: ClientConfig,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        status: int,
        reason: str,
        headers: Dict[str, str],
        method: str,
    ) -> None:
        self._config = config
        self._reader = reader
        self._writer = writer
        self._timeout = config.request_timeout
        self.status = status
        self.reason = reason
        self.headers = headers
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left: Optional[int] = None  # bytes left in the body (or the current chunk)
        if method == "HEAD" or status in (204, 304):
            self._left, self._chunked = 0, False
        elif not self._chunked and length is not None:
            self._left = int(length)
        self._done = self._left == 0 and not self._chunked
        self._pending = b""  # read past a line's end by readline

    def set_timeout(self, seconds: float) -> None:
        """The longest silence allowed from now on; 0 for none."""
        self._timeout = seconds

    async def _io(self, op: Any) -> Any:
        try:
            if self._timeout:
                return await asyncio.wait_for(op, self._timeout)
            return await op
        except asyncio.TimeoutError:
            raise timeout_error(self._config, self._timeout, "in the middle of its answer") from None
        except (asyncio.IncompleteReadError, _Closed, OSError, ValueError) as e:
            raise ConnectionException("the connection to hostd broke: %s" % (e or type(e).__name__)) from e

    async def _raw(self, size: int) -> bytes:
        """Up to ``size`` body bytes as soon as some arrive; ``b""`` at the end of the body."""
        if self._done:
            return b""
        if self._chunked:
            if not self._left:
                line = await self._reader.readline()
                if not line.endswith(b"\n"):
                    raise _Closed("in a chunk header")
                self._left = int(line.split(b";")[0].strip() or b"0", 16)
                if self._left == 0:
                    while (await self._reader.readline()).strip():
                        pass  # trailers
                    self._done = True
                    return b""
            data = await self._reader.read(min(size, self._left))
            if not data:
                raise _Closed("in a chunk")
            self._left -= len(data)
            if self._left == 0:
                await self._reader.readexactly(2)  # the chunk's CRLF
            return data
        if self._left is None:  # until the connection ends
            data = await self._reader.read(size)
            self._done = not data
            return data
        data = await self._reader.read(min(size, self._left))
        if not data:
            raise _Closed("%d bytes short" % self._left)
        self._left -= len(data)
        self._done = self._left == 0
        return data

    async def read_chunk(self, size: int = _CHUNK) -> bytes:
        """Up to ``size`` bytes, as soon as some arrive; ``b""`` at the end."""
        if self._pending:
            data, self._pending = self._pending[:size], self._pending[size:]
            return data
        return await self._io(self._raw(size))

    async def read_all(self) -> bytes:
        parts = []
        while True:
            data = await self.read_chunk()
            if not data:
                return b"".join(parts)
            parts.append(data)

    async def readline(self) -> bytes:
        """One line with its newline, or what is left at the end (``b""`` when nothing is)."""
        while b"\n" not in self._pending:
            data = await self._io(self._raw(_CHUNK))
            if not data:
                line, self._pending = self._pending, b""
                return line
            self._pending += data
        end = self._pending.index(b"\n") + 1
        line, self._pending = self._pending[:end], self._pending[end:]
        return line

    async def aclose(self) -> None:
        """Closes the connection (which, for an exec, tells hostd to interrupt the code)."""
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (OSError, asyncio.CancelledError):
            pass

    async def __aenter__(self) -> "AsyncResponse":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _chunks_of(body: Any) -> AsyncIterator[bytes]:
    """An upload body's chunks: an async iterable's directly; a blocking iterable's (a local
    file being read, a tar being built) each from a worker thread, so the loop never waits on
    the disk."""
    if hasattr(body, "__aiter__"):
        source = body.__aiter__()
        while True:
            try:
                chunk = await source.__anext__()
            except StopAsyncIteration:
                return
            except Exception as e:
                raise _SourceError(e) from e
            yield chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
    it = iter(body)
    end = object()
    while True:
        chunk = await asyncio.get_running_loop().run_in_executor(None, next, it, end)
        if chunk is end:
            return
        yield chunk


async def _exchange(config: ClientConfig, call: Call) -> AsyncResponse:
    timeout = config.request_timeout or None

    async def bounded(op: Any) -> Any:
        return await (asyncio.wait_for(op, timeout) if timeout else op)

    tls = ssl.create_default_context() if config.scheme == "https" else None
    try:
        reader, writer = await bounded(
            asyncio.open_connection(
                config.host, config.port, ssl=tls, server_hostname=config.host if tls else None, limit=_MAX_LINE * 4
            )
        )
    except asyncio.TimeoutError:
        raise timeout_error(config, config.request_timeout, "before answering") from None
    except OSError as e:
        raise ConnectionException("cannot reach hostd at %s: %s" % (config.base_url, e)) from e
    try:
        return await _send_and_read_head(config, call, reader, writer, bounded)
    except BaseException:
        writer.close()
        raise


async def _send_and_read_head(
    config: ClientConfig, call: Call, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bounded: Any
) -> AsyncResponse:
    default_port = 443 if config.scheme == "https" else 80
    host = config.host if ":" not in config.host else "[%s]" % config.host
    headers = {"host": host if config.port == default_port else "%s:%d" % (host, config.port)}
    headers.update(headers_for(config, call))
    headers["connection"] = "close"
    body = call.body if hasattr(call.body, "__aiter__") else body_for(call)
    if isinstance(body, bytes):
        headers["content-length"] = str(len(body))
    elif body is not None:
        headers["transfer-encoding"] = "chunked"
    elif call.method in ("POST", "PUT", "PATCH"):
        headers["content-length"] = "0"  # as http.client sends it, so both clients send alike
    head = "%s %s HTTP/1.1\r\n%s\r\n" % (
        call.method,
        call.target(config),
        "".join("%s: %s\r\n" % kv for kv in headers.items()),
    )
    send_error: Optional[BaseException] = None
    try:
        writer.write(head.encode("latin-1"))
        if isinstance(body, bytes):
            writer.write(body)
        elif body is not None:
            async for chunk in _chunks_of(body):
                if chunk:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await bounded(writer.drain())
            writer.write(b"0\r\n\r\n")
        await bounded(writer.drain())
    except _SourceError as e:
        raise e.error from None
    except asyncio.TimeoutError:
        raise timeout_error(config, config.request_timeout, "before answering") from None
    except (ConnectionError, OSError) as e:
        # hostd may answer before it read the whole upload and stop reading; its answer is
        # then what the caller wants to see.
        send_error = e
    try:
        status, reason, response_headers = await bounded(_read_head(reader))
    except asyncio.TimeoutError:
        raise timeout_error(config, config.request_timeout, "before answering") from None
    except (asyncio.IncompleteReadError, OSError, ValueError) as e:
        cause = send_error or e
        raise ConnectionException("cannot reach hostd at %s: %s" % (config.base_url, cause or "no answer")) from cause
    return AsyncResponse(config, reader, writer, status, reason, response_headers, call.method)


async def _read_head(reader: asyncio.StreamReader) -> Tuple[int, str, Dict[str, str]]:
    while True:
        line = (await reader.readuntil(b"\r\n")).decode("latin-1")
        parts = line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ValueError("not an HTTP response: %r" % line[:100])
        status = int(parts[1])
        headers: Dict[str, str] = {}
        while True:
            field = (await reader.readuntil(b"\r\n")).decode("latin-1").rstrip("\r\n")
            if not field:
                break
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status != 100:  # a 100 Continue is followed by the real answer
            return status, (parts[2].strip() if len(parts) > 2 else ""), headers


async def send(config: ClientConfig, call: Call) -> AsyncResponse:
    """Sends ``call``, retrying 429 and 503 answers as _config.py describes, and returns the 2xx
    response with its body unread (close it). Any other status raises its exception class."""
    attempt = 0
    while True:
        response = await _exchange(config, call)
        if 200 <= response.status < 300:
            response.set_timeout(config.request_timeout if call.body_timeout is None else call.body_timeout)
            return response
        try:
            payload = await response.read_all()
        except HostdError:
            payload = b""
        finally:
            await response.aclose()
        message, code = error_message(response.status, response.reason, payload)
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        err = error_from_response(response.status, code, message, retry_after)
        replayable = call.replayable and not hasattr(call.body, "__aiter__")
        delay = retry_delay_ms(response.status, retry_after, attempt, config.max_retries) if replayable else None
        if delay is None:
            raise err
        await asyncio.sleep(delay / 1000)
        attempt += 1


async def call_bytes(config: ClientConfig, call: Call) -> bytes:
    """The whole body of the 2xx answer to ``call``."""
    async with await send(config, call) as response:
        return await response.read_all()


async def call_json(config: ClientConfig, call: Call) -> Any:
    data = await call_bytes(config, call)
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        raise HostdError("hostd sent a response that is not JSON: %r" % data[:200]) from None
