"""Which features of docs/api.md the real hostd under test has. The server grows in parallel
with the SDKs, so an integration test of a feature the server lacks skips itself and says why,
rather than failing. A route the server lacks answers ``404 route_not_found``; a request field
it lacks answers ``400 invalid_request`` (it rejects unknown fields) to a probe that would
otherwise fail only on an unknown sandbox or template. Probes create nothing. The same probes as
sdk/typescript/test/helpers/features.ts, under the same names (README markers use them)."""

from typing import Dict, Optional

from hostd import HostdError, resolve_config
from hostd import _http
from hostd._calls import Call

_NOBODY = "/v1/sandboxes/sbx_" + "0" * 32

PROBES = {
    "files": ("files API", Call("GET", _NOBODY + "/files/stat", query={"path": "/"}), "route_not_found"),
    "snapshots": ("snapshots", Call("GET", "/v1/snapshots"), "route_not_found"),
    "pause": ("pause and resume", Call("POST", _NOBODY + "/pause"), "route_not_found"),
    "templates": ("templates API", Call("GET", "/v1/templates"), "route_not_found"),
    "exec-options": (
        "exec env, cwd and display",
        Call("POST", _NOBODY + "/exec", json={"code": "", "env": {}, "cwd": "/", "display": False}),
        "invalid_request",
    ),
    "notebook": (
        "notebook cells and contexts",
        Call("POST", _NOBODY + "/exec", json={"code": "", "context": "default", "notebook": False}),
        "invalid_request",
    ),
    "create-options": (
        "create env and network",
        Call(
            "POST",
            "/v1/sandboxes",
            json={"template": "hostd-sdk-probe-no-such-template", "env": {}, "network": {"allow_out": []}},
        ),
        "invalid_request",
    ),
}

_known: Dict[str, bool] = {}


def _has(feature: str) -> bool:
    _, call, lacking = PROBES[feature]
    try:
        _http.send(resolve_config(max_retries=0), call).close()
        return True
    except HostdError as e:
        return e.code != lacking


def lacks(*features: str) -> Optional[str]:
    """None when the server has every feature, else the reason to skip. Probed once each."""
    for feature in features:
        if feature not in _known:
            _known[feature] = _has(feature)
        if not _known[feature]:
            what, _, lacking = PROBES[feature]
            return "the server under test has no %s yet (it answers %s)" % (what, lacking)
    return None
