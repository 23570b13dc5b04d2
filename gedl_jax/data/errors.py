"""Error classes of the data package.

Every error names the file (or dataset) concerned, what was expected and what to do about it.
All of them derive from `DataError`, so a caller can catch the whole family at once.
"""

from __future__ import annotations


class DataError(Exception):
    """Base class of every data-loading error raised by `gedl_jax.data`."""


class MissingDataError(DataError, FileNotFoundError):
    """A required file (or the data folder itself) is absent. Raised before any decoding and
    before TFDS is asked to prepare anything, so it never waits on the network."""


class ChecksumError(DataError, ValueError):
    """A file is present but its size or sha256 differs from the registered checksum."""


class CorruptDataError(DataError, ValueError):
    """A file (or a cache entry) could not be decoded, or decoded to the wrong shapes/values."""
