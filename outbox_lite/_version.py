"""The version of outbox_lite (``outbox_lite.__version__``; setup.cfg reads it here)."""

__version__ = "0.1.0"
