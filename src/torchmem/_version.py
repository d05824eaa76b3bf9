"""The torchmem version, in one place (lower layers import it from here, never from the package root)."""

__version__ = "0.1.0"
