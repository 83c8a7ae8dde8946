"""spbuild: fetch a pinned llama.cpp, apply the llama-specprefill patch series, build it."""

__version__ = "0.1.0"
