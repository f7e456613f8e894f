"""refit: keep inference engines' weights in sync with the trainer by sending
only the bits that changed.

Trainer::

    pub = refit.Publisher("/shared/store", baseline="/ckpt/baseline",
                          members=["r0", "r1"], initial=model.state_dict())
    report = pub.publish(step, model.state_dict())

Inference worker::

    rcv = refit.Receiver("/shared/store", member="r0", checkpoint_dir="/ckpt/r0")
    rcv.sync()
    engine_model.load_weights(rcv.changed_tensors(framework="torch"))

Files: :func:`diff`, :func:`apply`, :func:`verify`, :func:`inspect`,
:func:`load`, :func:`save`. Errors: :mod:`refit.errors`. See docs/python.md.
"""

from . import adapters, errors
from ._native import (ApplyReport, DiffReport, InspectReport, PublishReport, StepResult,
                      TensorInspect, VerifyReport)
from ._tensors import Typed
from .errors import (AbortedError, AuthenticationError, CorruptDataError, DeadlineExceededError,
                     Error, InvalidArgumentError, NotFoundError, TransportError,
                     UnsupportedError, VersionMismatchError)
from .fanout import FanoutReceiver
from .files import Checkpoint, apply, copy_checkpoint, diff, inspect, load, save, verify
from .sync import Coordinator, Publisher, Receiver, SyncReport

__version__ = "0.1.0"


def generate_signing_key() -> tuple:
    """A fresh Ed25519 key pair (private, public), 32 raw bytes each.

    The publisher signs with the private key (``Publisher(sign_key=...)``),
    receivers verify with the public one (``Receiver(verify_key=...)``).
    """
    from . import _native

    return _native.generate_ed25519()


def as_dtype(tensor, dtype: str) -> Typed:
    """Marks `tensor` as holding elements of safetensors dtype `dtype`.

    For arrays whose NumPy dtype is only the bit pattern (uint16 for "BF16",
    uint8 for "F8_E4M3") or for DLPack objects refit cannot type itself.
    """
    return Typed(tensor, dtype)


__all__ = [
    "AbortedError", "ApplyReport", "AuthenticationError", "Checkpoint", "CorruptDataError",
    "DeadlineExceededError", "DiffReport", "Error", "FanoutReceiver", "InspectReport", "InvalidArgumentError",
    "NotFoundError", "PublishReport", "Publisher", "Coordinator", "Receiver", "StepResult", "SyncReport",
    "TensorInspect", "TransportError", "UnsupportedError", "VerifyReport",
    "VersionMismatchError", "adapters", "apply", "as_dtype", "copy_checkpoint", "diff",
    "errors", "generate_signing_key", "inspect", "load", "save", "verify",
]
