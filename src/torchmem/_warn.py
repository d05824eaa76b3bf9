"""One way to tell the user something went wrong inside torchmem without ever breaking their program."""

from __future__ import annotations

import logging
import warnings

_log = logging.getLogger("torchmem")


def emit_warning(
    message: str,
    category: type[Warning] = RuntimeWarning,
    *,
    stacklevel: int = 2,
    log_level: int = logging.WARNING,
    warn: bool = True,
) -> Exception | None:
    """Log ``message`` on the ``torchmem`` logger and issue it as a warning; never raise.

    ``stacklevel`` counts from the caller, as for ``warnings.warn``. Where the warnings filter turns the
    warning into an error, that error is returned instead of raised: a hook, an op or a step must go on.
    """
    _log.log(log_level, message)
    if not warn:
        return None
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    except Exception as exc:  # warnings configured as errors
        return exc
    return None
