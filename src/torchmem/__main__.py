"""``python -m torchmem``."""

from torchmem.cli import run

run()
