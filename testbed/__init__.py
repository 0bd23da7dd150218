"""testbed: emulate multi-data-center LLM training on one machine or across real hosts."""

__version__ = "0.1.0"
