"""Every frozen result torchmem returns, with its ``to_dict()``, ``from_dict()`` and plain-text rendering.

This layer sits directly above ``devices/`` and imports only the base helpers (``torchmem._*``): analysis
returns these types, capture and actions produce them, report renders them, and capture files store their
``to_dict()`` and read them back with ``from_dict()``. A type's ``str()`` is its plain-text rendering,
written beside it; richer renderings (rich tables, HTML, plots) live in ``torchmem.report`` and import only
this layer.

Modules: ``stats`` (MemoryStats, Breakdown), ``track`` (TrackResult), ``holders`` (HolderPath and its typed
steps), ``live`` (LiveTensorReport), ``release`` (ReleaseReport), ``leaks`` (LeakReport, Culprit, Growth),
``oom`` (OOMDiagnosis and its parts), ``fit`` (MemoryEstimate, BatchSizeResult), ``profile``
(ProfileReport), ``capture`` (the capture file's records and Capture). This package's ``__init__`` imports
none of them, so importing one result type loads only its module.
"""
