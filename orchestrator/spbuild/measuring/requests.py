"""What a measuring command asks for, past its parser: each command's request is a frozen dataclass whose fields are
its options (spbuild.measuring.bench's BenchRequest, spbuild.measuring.eval_cli's EvalRequest)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any, TypeVar

Request = TypeVar("Request")


def from_options(cls: type[Request], args: argparse.Namespace) -> Request:
    """The request `args` describe: each field from the option of its name, `plots` from --no-plots."""
    values: dict[str, Any] = {f.name: getattr(args, f.name) for f in fields(cls) if f.name != "plots"}
    return cls(**values, plots=not args.no_plots)
