"""Hearing about new versions (the ``watch`` request, docs/protocol.md).

:meth:`Client.watch` subscribes to a model on a connection of its own and returns a
:class:`Watcher`, an iterator of :class:`WatchEvent`; :meth:`Client.watch_session` returns a
:class:`SessionHandle`, which keeps an ``onnxruntime.InferenceSession`` of the model's current
artifact and swaps in a new one, opened on a background thread, each time the artifact
changes: ``handle.current()`` always returns a usable session.
"""

from __future__ import annotations

import dataclasses
import os
import select
import socket
import threading
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple

from .errors import ConnectionFailed, ShuttingDown, TrtcacheError, UnexpectedResponse

if TYPE_CHECKING:  # no import cycle at run time: Client passes itself in
    import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

    from . import Artifact, Client

__all__ = ["WatchEvent", "Watcher", "SessionHandle", "WATCH_REASONS"]

Json = Dict[str, Any]

WATCH_REASONS = ("ready", "changed", "removed", "evicted", "failed", "resync")
"""Every ``WatchEvent.reason`` this client knows (docs/protocol.md, ``watch``)."""


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """A change of a watched model's ready artifact.

    ``reason``: ``ready`` (a variant's artifact became ready: ``key`` is the key to acquire,
    ``origin`` where it came from), ``evicted`` (it was evicted), ``failed`` (building the new
    content failed: ``message`` says why) name the variant in ``profile`` and ``backend``;
    ``changed`` (the model's files changed: new content or version), ``removed`` (the model
    left the repository) and ``resync`` (this watcher fell behind and events were dropped:
    ask for ``status``) are model-wide, with no profile, backend or key."""

    model: str
    reason: str
    version: Optional[int] = None
    profile: Optional[str] = None
    backend: Optional[str] = None
    key: Optional[str] = None
    origin: Optional[str] = None
    message: Optional[str] = None

    @classmethod
    def from_wire(cls, msg: Json) -> "WatchEvent":
        """The event of a ``watch_event`` frame."""
        version = msg.get("version")

        def opt(name: str) -> Optional[str]:
            v = msg.get(name)
            return None if v is None else str(v)

        return cls(
            model=str(msg.get("model", "")),
            reason=str(msg.get("reason", "")),
            version=None if version is None else int(version),
            profile=opt("profile"),
            backend=opt("backend"),
            key=opt("key"),
            origin=opt("origin"),
            message=opt("message"),
        )


class Watcher:
    """A subscription to one model (see :meth:`Client.watch`) on a connection of its own,
    which takes no other request. ``.status`` is the model's state when it started (a
    ``ModelStatus`` dict); every change after it arrives as a :class:`WatchEvent`. Iterating
    yields events until the connection ends (the daemon stopped, or :meth:`close`).
    Close it (or use ``with``) to end the subscription."""

    def __init__(self, client: "Client", model: str) -> None:
        self._client = client
        self.model: str = model
        try:
            msg, fds = client._channel()._call({"op": "watch", "model": model})
            _close(fds)
            self.status: Json = dict(client._channel()._expect(msg, "watching", "model"))
        except BaseException:
            client.close()  # refused (not_found, busy): the connection is of no further use
            raise

    def next(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """The next event, or None when none arrives within ``timeout`` seconds (None: wait
        for ever). The client's own ``timeout`` bounds reading an event once it started to
        arrive, not the wait for one. Raises :class:`ConnectionFailed` once the connection
        has ended and :class:`ShuttingDown` when the daemon says it stops."""
        sock = self._client._channel()._sock
        if sock is None:
            raise ConnectionFailed("the watch of %r has ended" % self.model)
        try:
            ready, _, _ = select.select([sock], [], [], timeout)
        except (OSError, ValueError) as e:  # closed by another thread
            raise ConnectionFailed("the watch of %r has ended: %s" % (self.model, e)) from e
        if not ready:
            return None
        msg, fds = self._client._channel()._recv()
        _close(fds)
        if msg.get("kind") != "watch_event":
            raise UnexpectedResponse("expected 'watch_event', got %r" % msg.get("kind"))
        return WatchEvent.from_wire(msg)

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        try:
            ev = self.next()
        except (ConnectionFailed, ShuttingDown):
            raise StopIteration from None
        if ev is None:  # cannot happen without a timeout; keeps the type exact
            raise StopIteration
        return ev

    def interrupt(self) -> None:
        """Ends the subscription from another thread: a :meth:`next` waiting there raises
        :class:`ConnectionFailed` (the socket is shut down, not closed, so that thread never
        reads a reused descriptor)."""
        sock = self._client._channel()._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Ends the subscription and closes its connection."""
        self.interrupt()
        self._client.close()

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(fds: Any) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class SessionHandle:
    """An ``onnxruntime.InferenceSession`` that follows a model (see
    :meth:`Client.watch_session`). :meth:`current` returns the session of the model's
    current artifact (``InferenceSession.run`` may be called from many threads at once).

    A background thread watches the model; on a ``ready`` event of its variant (its profile
    and backend) with a new key, and after a ``resync`` or a reconnect, it acquires the
    artifact, opens a session and swaps it in under a lock; the old session is freed once no
    caller holds it. ``changed``, ``evicted``, ``removed`` and ``failed`` events keep the
    current session (it keeps working after its artifact is evicted or its model replaced).
    When the daemon goes away the thread reconnects (every 1 s, up to every 30 s) and keeps
    the session meanwhile. ``swaps`` counts swaps, ``last_error`` says why the last attempt
    failed (None after a swap), ``last_event`` is the last event seen. Close it (or use
    ``with``) to stop the thread."""

    def __init__(
        self,
        client: "Client",
        model: str,
        profile: Optional[str] = None,
        backend: Optional[str] = None,
        timeout: Optional[float] = None,
        **ort_kwargs: Any,
    ) -> None:
        self.model: str = model
        self._path = client.path
        self._client_timeout = client.timeout
        self._max_response = client.max_response
        self._acquire: Json = {"profile": profile, "backend": backend, "timeout": timeout}
        self._ort_kwargs = ort_kwargs
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.swaps: int = 0
        self.last_error: Optional[str] = None
        self.last_event: Optional[WatchEvent] = None
        # Subscribe first, then acquire: a change in between is an event, never missed.
        self._watcher: Optional[Watcher] = Watcher(self._client(), model)
        try:
            self._metadata, self._session = self._load()
        except BaseException:
            self._watcher.close()
            raise
        self._thread = threading.Thread(
            target=self._follow, name="trtcache-watch-%s" % model, daemon=True
        )
        self._thread.start()

    def current(self) -> "onnxruntime.InferenceSession":
        """The session of the current artifact."""
        with self._cond:
            return self._session

    @property
    def metadata(self) -> Json:
        """The current session's artifact metadata (docs/protocol.md)."""
        with self._cond:
            return self._metadata

    @property
    def key(self) -> str:
        """The current session's cache key."""
        return str(self.metadata.get("key", ""))

    def wait_swap(self, after: int, timeout: Optional[float] = None) -> bool:
        """Waits until more than ``after`` swaps happened (read ``swaps`` before the change)
        or ``timeout`` seconds pass; returns whether one did."""
        with self._cond:
            return self._cond.wait_for(lambda: self.swaps > after, timeout)

    def close(self) -> None:
        """Stops following: the thread exits once a build it waits for is over."""
        self._stop.set()
        with self._cond:
            w = self._watcher
            self._cond.notify_all()
        if w is not None:
            w.interrupt()

    def __enter__(self) -> "SessionHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the thread ----------------------------------------------------------------
    def _client(self) -> "Client":
        from . import Client

        # Over the socket, never the ready index: the index is written just after the daemon
        # announces a change, so right after an event it may still name the old artifact.
        return Client(
            self._path, timeout=self._client_timeout, max_response=self._max_response, ready_index=False
        )

    def _load(self) -> Tuple[Json, "onnxruntime.InferenceSession"]:
        # A fresh connection per acquire: they are rare, and a kept one is closed as idle.
        c = self._client()
        try:
            art: Artifact = c.acquire(self.model, **self._acquire)
        finally:
            c.close()
        with art:
            return art.metadata, art.session(**self._ort_kwargs)

    def _refresh(self) -> None:
        try:
            meta, sess = self._load()
        except Exception as e:  # keep the current session whatever went wrong
            with self._cond:
                self.last_error = "%s: %s" % (type(e).__name__, e)
            return
        with self._cond:
            if meta.get("key") == self._metadata.get("key"):
                return
            old = self._session
            self._metadata, self._session = meta, sess
            self.swaps += 1
            self.last_error = None
            self._cond.notify_all()
        del old  # outside the lock: freeing a session takes a while

    def _news(self, ev: WatchEvent) -> bool:
        if ev.reason == "resync":
            return True
        with self._cond:
            m = self._metadata
        return (
            ev.reason == "ready"
            and ev.backend == m.get("backend")
            and ev.profile == m.get("profile")
            and ev.key != m.get("key")
        )

    def _follow(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            with self._cond:
                w = self._watcher
            if w is None:
                try:
                    w = Watcher(self._client(), self.model)
                except TrtcacheError as e:
                    with self._cond:
                        self.last_error = "watching %r: %s" % (self.model, e)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                with self._cond:
                    self._watcher = w
                backoff = 1.0
                if self._stop.is_set():
                    break
                self._refresh()  # catch up with what changed while away
                continue
            try:
                ev = w.next()
            except TrtcacheError as e:
                if not self._stop.is_set():
                    with self._cond:
                        self.last_error = "the watch of %r ended: %s" % (self.model, e)
                w.close()
                with self._cond:
                    self._watcher = None
                continue
            if ev is None:
                continue
            with self._cond:
                self.last_event = ev
            if self._news(ev):
                self._refresh()
        with self._cond:
            w, self._watcher = self._watcher, None
        if w is not None:
            w.close()
