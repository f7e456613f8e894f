"""Adapters between a Receiver and inference engines.

- :class:`HttpReload`: after a commit, tell an engine that loads weights
  from disk to reload them over HTTP (SGLang's ``POST
  /update_weights_from_disk`` by default; URL and payload configurable).
- :func:`load_state_dict`: copy changed tensors into a PyTorch module's
  parameters through its own ``load_state_dict`` (Hugging Face
  ``transformers`` models).
- :func:`feed_load_weights`: hand ``(name, tensor)`` pairs to an engine
  model's native ``load_weights(iterable)`` (vLLM, SGLang model classes).

PyTorch is imported only by the functions that need it.
"""

from __future__ import annotations

import json
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
