"""The package version, in one place (imported by the writer, the scanner and the CLI)."""

__version__ = "0.1.0"
