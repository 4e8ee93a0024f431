"""The blocking client: sends a Call (see _calls.py) over http.client with the request timeout,
retries 429 and 503 answers, maps error responses onto exception classes, and reads bodies with
a timeout on each silence. One connection per request."""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any, Iterable, Iterator, Optional, Tuple

from ._calls import Call
from ._config import ClientConfig
from ._errors import ConnectionException, HostdError, RequestTimeoutError, error_from_response
from ._retry import parse_retry_after, retry_delay_ms
from ._trace import traceparent

_READ_ERRORS = (OSError, http.client.HTTPException, ValueError)


class _SourceError(Exception):
    """What an upload's own source raised (a local file that could not be read), carried out of
    http.client so that it reaches the caller as itself, not as a connection failure."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def guarded(chunks: Iterable[Any]) -> Iterator[bytes]:
    """The chunks of an upload source as bytes (text as UTF-8), its failures as _SourceError."""
    it = iter(chunks)
    while True:
        try:
            chunk = next(it)
        except StopIteration:
            return
        except Exception as e:
            raise _SourceError(e) from e
        yield chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)


def headers_for(config: ClientConfig, call: Call) -> dict:
    headers = {"accept": call.accept, "traceparent": traceparent()}
    if config.api_key is not None:
        headers["authorization"] = "Bearer %s" % config.api_key
    if call.json is not None:
        headers["content-type"] = "application/json"
    elif call.body is not None:
        headers["content-type"] = call.content_type or "application/octet-stream"
    return headers


def body_for(call: Call) -> Any:
    """The body of one attempt: bytes, or an iterator of bytes (sent chunked)."""
    if call.json is not None:
        return json.dumps(call.json).encode("utf-8")
    if call.body is None or isinstance(call.body, bytes):
        return call.body
    return guarded(call.body() if callable(call.body) else call.body)


def timeout_error(config: ClientConfig, seconds: float, where: str) -> RequestTimeoutError:
    return RequestTimeoutError(
        "hostd at %s sent nothing for %g s %s (request_timeout)" % (config.base_url, seconds, where)
    )


def error_message(status: int, reason: str, data: bytes) -> Tuple[str, Optional[str]]:
    """The server's ``{"error", "code"}``, or whatever text it sent, or the status line."""
    text = data.decode("utf-8", errors="replace")
    message: Optional[str] = None
    code: Optional[str] = None
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            if isinstance(parsed.get("error"), str) and parsed["error"]:
                message = parsed["error"]
            if isinstance(parsed.get("code"), str) and parsed["code"]:
                code = parsed["code"]
    except ValueError:
        pass  # not JSON: a proxy's HTML page, say
    if message is None:
        text = text.strip()
        if not text:
            message = ("HTTP %d %s" % (status, reason)).strip()
        else:
            message = text if len(text) <= 200 else text[:200] + "…"
    return message, code


class Response:
    """A 2xx response with its body unread. Reads raise RequestTimeoutError after a silence
    longer than the timeout, ConnectionException when the connection breaks."""

    def __init__(self, config: ClientConfig, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._config = config
        self._conn = conn
        self._resp = resp
        self._timeout = config.request_timeout
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    def set_timeout(self, seconds: float) -> None:
        """The longest silence allowed from now on; 0 for none."""
        self._timeout = seconds
        if self._conn.sock is not None:
            self._conn.sock.settimeout(seconds or None)

    def _failed(self, e: BaseException) -> HostdError:
        if isinstance(e, socket.timeout):
            return timeout_error(self._config, self._timeout, "in the middle of its answer")
        return ConnectionException("the connection to hostd broke: %s" % (e or type(e).__name__))

    def read_all(self) -> bytes:
        try:
            return self._resp.read()
        except _READ_ERRORS as e:
            raise self._failed(e) from e

    def read_chunk(self, size: int = 65536) -> bytes:
        """Up to ``size`` bytes, as soon as some arrive; ``b""`` at the end."""
        try:
            data = self._resp.read1(size)
        except _READ_ERRORS as e:
            raise self._failed(e) from e
        # read1 ends quietly where read would raise IncompleteRead: a body cut short.
        if not data and size and self._resp.length:
            raise ConnectionException("the connection to hostd broke: %d bytes short" % self._resp.length)
        return data

    def readline(self) -> bytes:
        try:
            return self._resp.readline()
        except _READ_ERRORS as e:
            raise self._failed(e) from e

    def close(self) -> None:
        """Closes the connection (which, for an exec, tells hostd to interrupt the code)."""
        self._conn.close()

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _exchange(config: ClientConfig, call: Call) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    timeout = config.request_timeout or None
    if config.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(config.host, config.port, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(config.host, config.port, timeout=timeout)
    send_error: Optional[BaseException] = None
    try:
        conn.request(call.method, call.target(config), body=body_for(call), headers=headers_for(config, call))
    except _SourceError as e:
        conn.close()
        raise e.error from None
    except socket.timeout as e:
        conn.close()
        raise timeout_error(config, config.request_timeout, "before answering") from e
    except (OSError, http.client.HTTPException) as e:
        send_error = e
        if conn.sock is None:  # never connected
            conn.close()
            raise ConnectionException("cannot reach hostd at %s: %s" % (config.base_url, e)) from e
    # hostd may answer before it read the whole upload (an unknown sandbox, a body too large)
    # and stop reading; its answer is then what the caller wants to see.
    try:
        return conn, conn.getresponse()
    except socket.timeout as e:
        conn.close()
        raise timeout_error(config, config.request_timeout, "before answering") from e
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        cause = send_error or e
        raise ConnectionException("cannot reach hostd at %s: %s" % (config.base_url, cause)) from cause


def send(config: ClientConfig, call: Call) -> Response:
    """Sends ``call``, retrying 429 and 503 answers as _config.py describes, and returns the 2xx
    response with its body unread (close it). Any other status raises its exception class."""
    attempt = 0
    while True:
        conn, resp = _exchange(config, call)
        if 200 <= resp.status < 300:
            response = Response(config, conn, resp)
            response.set_timeout(config.request_timeout if call.body_timeout is None else call.body_timeout)
            return response
        try:
            payload = resp.read()
        except _READ_ERRORS:
            payload = b""
        finally:
            conn.close()
        message, code = error_message(resp.status, resp.reason, payload)
        retry_after = parse_retry_after(resp.getheader("retry-after"))
        err = error_from_response(resp.status, code, message, retry_after)
        delay = retry_delay_ms(resp.status, retry_after, attempt, config.max_retries) if call.replayable else None
        if delay is None:
            raise err
        time.sleep(delay / 1000)
        attempt += 1


def call_bytes(config: ClientConfig, call: Call) -> bytes:
    """The whole body of the 2xx answer to ``call``."""
    with send(config, call) as response:
        return response.read_all()


def call_json(config: ClientConfig, call: Call) -> Any:
    data = call_bytes(config, call)
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        raise HostdError("hostd sent a response that is not JSON: %r" % data[:200]) from None
