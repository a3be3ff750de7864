"""schedport's version: a leaf module any layer may import without importing the package's API."""

__version__ = "0.1.0"
