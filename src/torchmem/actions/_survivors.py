"""Moved to :mod:`torchmem.analysis.holders.survivors`; re-exported for ``actions/release.py``,
``actions/scope.py`` and ``actions/limit.py``, which still import it from here."""

from __future__ import annotations

from torchmem.analysis.holders.survivors import _aliases, holder_paths_of_storages, holders_of_storages

__all__ = ["_aliases", "holder_paths_of_storages", "holders_of_storages"]
