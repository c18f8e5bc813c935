"""The client's exceptions: one subclass of :class:`TrtcacheError` per error code.

Codes the daemon sends (``docs/protocol.md``) map to the classes in :data:`BY_CODE`; a code
this client does not know (from a newer daemon) raises a plain :class:`TrtcacheError` with
that ``.code``. Errors found on the client's side have their own codes: ``connection``,
``timeout`` (:class:`ConnectionTimeout`), ``response_too_large``, ``descriptors_truncated``,
``provider_unavailable`` and ``unexpected_response``.
"""

from __future__ import annotations

from typing import Dict, Type

__all__ = [
    "TrtcacheError",
    "BadFrame",
    "FrameTooLarge",
    "UnknownRequest",
    "BadRequest",
    "UnsupportedVersion",
    "BadName",
    "NotFound",
    "NotReady",
    "BuildFailed",
    "Cancelled",
    "Timeout",
    "PermissionDenied",
    "Busy",
    "IdleTimeout",
    "ShuttingDown",
    "RuntimeUnavailable",
    "Internal",
    "ConnectionFailed",
    "ConnectionTimeout",
    "ResponseTooLarge",
    "DescriptorsTruncated",
    "ProviderUnavailable",
    "NotAnEngine",
    "UnexpectedResponse",
    "BY_CODE",
    "error_for",
]


class TrtcacheError(Exception):
    """Every error of this client. ``.code`` is the machine-readable code (match on it or on
    the subclass, never on the message); ``.message`` says what happened, for people."""

    code: str = "internal"

    def __init__(self, code: str, message: str) -> None:
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message


class _Coded(TrtcacheError):
    """A subclass with a fixed code: constructed with the message alone."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(code or type(self).code, message)


class BadFrame(_Coded):
    """The daemon could not read the request frame (not a JSON object with an ``op``)."""

    code = "bad_frame"


class FrameTooLarge(_Coded):
    """The request frame exceeded the daemon's ``max_frame_bytes``; the daemon closed the
    connection."""

    code = "frame_too_large"


class UnknownRequest(_Coded):
    """The daemon does not know this request (an older daemon)."""

    code = "unknown_request"


class BadRequest(_Coded):
    """The request's fields do not match its ``op``."""

    code = "bad_request"


class UnsupportedVersion(_Coded):
    """The daemon does not speak this client's protocol version."""

    code = "unsupported_version"


class BadName(_Coded):
    """The model name is a path, empty, hidden or has control characters."""

    code = "bad_name"


class NotFound(_Coded):
    """No such model, version, profile or backend."""

    code = "not_found"


class NotReady(_Coded):
    """The artifact is not built yet and the request did not wait."""

    code = "not_ready"


class BuildFailed(_Coded):
    """The build (or its validation) failed; remembered until the model or its config
    changes."""

    code = "build_failed"


class Cancelled(_Coded):
    """The build was cancelled (model replaced or removed, daemon stopping): ask again."""

    code = "cancelled"


class Timeout(_Coded):
    """The daemon's wait for a build exceeded the request's timeout."""

    code = "timeout"


class PermissionDenied(_Coded):
    """An admin request from a uid other than root or the daemon's."""

    code = "permission_denied"


class Busy(_Coded):
    """The daemon is at its connection limit."""

    code = "busy"


class IdleTimeout(_Coded):
    """The daemon closed an idle (or too slow) connection."""

    code = "idle_timeout"


class ShuttingDown(_Coded):
    """The daemon is stopping."""

    code = "shutting_down"


class RuntimeUnavailable(_Coded):
    """The consumer's runtime (its ``onnxruntime`` version, sent with ``acquire``) is not one
    the daemon has a library for: it can neither serve nor build an artifact for it. Add the
    library to the daemon's ``[runtimes]`` (docs/daemon.md, "Upgrading the runtime"), or pass
    ``runtime=None`` to take the daemon's current runtime's artifact."""

    code = "runtime_unavailable"


class Internal(_Coded):
    """An error on the daemon's side (I/O, a bug)."""

    code = "internal"


class ConnectionFailed(_Coded):
    """Connecting failed, or the connection broke (the daemon closed it, a socket error)."""

    code = "connection"


class ConnectionTimeout(Timeout):
    """No answer within the client's ``timeout``. The connection was reset: the late answer
    (and any descriptors with it) is dropped, and the next call connects again. Its code is
    ``timeout``, like the daemon's :class:`Timeout`, which it subclasses."""


class ResponseTooLarge(_Coded):
    """A response frame announced more bytes than the client's ``max_response``; the
    connection was reset."""

    code = "response_too_large"


class DescriptorsTruncated(_Coded):
    """The kernel dropped descriptors the daemon sent (``MSG_CTRUNC``): this process is at
    its open-files limit (``RLIMIT_NOFILE``). The descriptors that did arrive were closed;
    the connection stays usable."""

    code = "descriptors_truncated"


class ProviderUnavailable(_Coded):
    """The artifact needs an ONNX Runtime execution provider this ``onnxruntime`` lacks (a
    GPU artifact on the CPU-only wheel)."""

    code = "provider_unavailable"


class NotAnEngine(_Coded):
    """A TensorRT-engine accessor (``Artifact.engine_bytes()`` and the like) on an artifact
    that is not a ``trt`` engine (an ``ort-*`` backend's ONNX model)."""

    code = "not_an_engine"


class UnexpectedResponse(_Coded):
    """The daemon's answer does not fit the request (a protocol mismatch)."""

    code = "unexpected_response"


BY_CODE: Dict[str, Type[_Coded]] = {
    cls.code: cls
    for cls in (
        BadFrame,
        FrameTooLarge,
        UnknownRequest,
        BadRequest,
        UnsupportedVersion,
        BadName,
        NotFound,
        NotReady,
        BuildFailed,
        Cancelled,
        Timeout,
        PermissionDenied,
        Busy,
        IdleTimeout,
        ShuttingDown,
        RuntimeUnavailable,
        Internal,
        ConnectionFailed,
        ResponseTooLarge,
        DescriptorsTruncated,
        ProviderUnavailable,
        NotAnEngine,
        UnexpectedResponse,
    )
}
"""Error code -> exception class (the daemon's codes and the client's own)."""


def error_for(code: str, message: str) -> TrtcacheError:
    """The exception for an error code: its subclass, or a plain :class:`TrtcacheError` for
    a code this client does not know."""
    cls = BY_CODE.get(code)
    if cls is None:
        return TrtcacheError(code, message)
    return cls(message)
