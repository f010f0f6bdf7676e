"""Declarative, measured tuning profiles for SGLang on your own GPU servers."""

__version__ = "0.1.0"
