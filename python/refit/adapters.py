"""Adapters between a Receiver and inference engines.

- :class:`HttpReload`: after a commit, tell an engine that loads weights
  from disk to reload them over HTTP (SGLang's ``POST
  /update_weights_from_disk`` by default; URL and payload configurable).
- :func:`load_state_dict`: copy changed tensors into a PyTorch module's
  parameters through its own ``load_state_dict`` (Hugging Face
  ``transformers`` models).
- :func:`feed_load_weights`: hand ``(name, tensor)`` pairs to an engine
  model's native ``load_weights(iterable)`` (vLLM, SGLang model classes).
- :class:`PausingEngine`: drives a two-phase receiver for an engine that
  pauses itself: versions are prepared on a background thread while the
  engine generates; the engine applies a prepared one between batches.

PyTorch is imported only by the functions that need it.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

from ._tensors import import_torch
from .errors import InvalidArgumentError, TransportError

Payload = Union[None, Mapping[str, Any], Callable[[Any], Mapping[str, Any]]]


class HttpReload:
    """A Receiver commit hook that POSTs a JSON payload to an engine.

    url: e.g. ``http://127.0.0.1:30000/update_weights_from_disk``.
    payload: a mapping, or a callable taking the SyncReport and returning
      one; default ``{"model_path": <checkpoint dir>}`` (SGLang's field).
    A non-2xx status, a refused connection, or a JSON answer whose
    ``success`` field is false raises refit.TransportError; the version is
    committed on disk either way, so the caller can retry the reload.
    """

    def __init__(self, url: str, payload: Payload = None, *, method: str = "POST",
                 timeout: float = 120.0, headers: Optional[Mapping[str, str]] = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise InvalidArgumentError(f"HttpReload needs an http(s) URL, not {url!r}",
                                       "INVALID_ARGUMENT")
        self.url = url
        self.payload = payload
        self.method = method
        self.timeout = timeout
        self.headers = dict(headers or {})
        #: the decoded answer of the last call (JSON, or the text)
        self.last_response: Any = None

    def body(self, report: Any) -> Dict[str, Any]:
        if self.payload is None:
            return {"model_path": report.checkpoint_dir}
        if callable(self.payload):
            return dict(self.payload(report))
        return dict(self.payload)

    def __call__(self, report: Any) -> Any:
        data = json.dumps(self.body(report)).encode()
        req = urllib.request.Request(self.url, data=data, method=self.method,
                                     headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            raise TransportError(f"{self.method} {self.url} answered HTTP {e.code}: "
                                 f"{e.read().decode('utf-8', 'replace')[:500]}",
                                 "UNAVAILABLE") from e
        except (urllib.error.URLError, OSError) as e:
            raise TransportError(f"{self.method} {self.url} failed: {e}", "UNAVAILABLE") from e
        try:
            answer: Any = json.loads(text)
        except ValueError:
            answer = text
        self.last_response = answer
        if isinstance(answer, dict) and answer.get("success") is False:
            raise TransportError(f"{self.url} refused the reload: {answer.get('message', answer)}",
                                 "UNAVAILABLE")
        return answer


def load_state_dict(module: Any, named_tensors: Iterable[Tuple[str, Any]]) -> int:
    """Copies (name, tensor) pairs into `module` through ``module.load_state_dict``.

    The pairs use Hugging Face names, which are the module's state_dict
    keys. Only the given tensors are loaded (strict=False), but a name the
    module does not have raises refit.InvalidArgumentError. Returns how many
    tensors were loaded.
    """
    torch = import_torch()
    state = {}
    for name, t in named_tensors:
        state[name] = t if isinstance(t, torch.Tensor) else torch.from_numpy(t)
    result = module.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise InvalidArgumentError(f"the module has no parameters named {result.unexpected_keys}",
                                   "INVALID_ARGUMENT")
    return len(state)


def feed_load_weights(model: Any, named_tensors: Iterable[Tuple[str, Any]]) -> Any:
    """Calls ``model.load_weights(named_tensors)`` (vLLM / SGLang model classes)."""
    return model.load_weights(named_tensors)


class PausingEngine:
    """A two-phase :class:`refit.Receiver` driven for an engine that pauses itself.

    A background thread calls ``receiver.prepare()`` whenever nothing is
    prepared: it fetches, checks and stages the next version, votes and
    waits for the commit, while the engine keeps generating with the active
    weights. Between batches (or on a ``collective_rpc`` from the engine's
    controller) the engine calls :meth:`activate_if_ready`: when a version
    is prepared it is applied in place in one pause and its SyncReport is
    returned; otherwise it returns None at once, never waiting for the
    background work. The receiver is not used from two threads at a time.
    An error of the background thread is raised by the next
    :meth:`activate_if_ready` (the thread stops; :meth:`start` again to
    retry). Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, receiver: Any, *, poll_interval: float = 0.01) -> None:
        if not getattr(receiver, "two_phase", False):
            raise InvalidArgumentError("PausingEngine needs a two-phase receiver (CUDA tensors, "
                                       "or Receiver(two_phase=True))", "INVALID_ARGUMENT")
        self.receiver = receiver
        self._poll = float(poll_interval)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "PausingEngine":
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._error = None
            self._thread = threading.Thread(target=self._run, name="refit-prepare",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    if not self.receiver.prepared:
                        self.receiver.prepare(timeout=0)
            except BaseException as e:  # noqa: BLE001 (handed to the engine's thread)
                self._error = e
                return
            self._stop.wait(self._poll)

    def activate_if_ready(self) -> Any:
        """The pause: applies a prepared version and returns its SyncReport, else None."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if not self._lock.acquire(blocking=False):
            return None  # a preparation (or its wait for the commit) is under way
        try:
            if not self.receiver.prepared:
                return None
            return self.receiver.activate()
        finally:
            self._lock.release()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> "PausingEngine":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
