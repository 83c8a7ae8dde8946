"""Errors that carry what went wrong and what to do about it."""

from __future__ import annotations


class SpbuildError(Exception):
    """A failure the user can act on: `str(err)` says what happened, `hint` what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class SourceError(SpbuildError):
    """No source could provide the pinned llama.cpp commit."""


class VerificationError(SpbuildError):
    """A source provided something other than the pinned commit, or a corrupt download."""


class PatchConflict(SpbuildError):
    """A patch of the series did not apply."""

    def __init__(self, patch: str, files: list[str], hunks: list[str], output: str) -> None:
        lines = [f"patch {patch} does not apply"]
        if files:
            lines.append("conflicting files: " + ", ".join(files))
        lines.extend(f"  {h}" for h in hunks)
        super().__init__(
            "\n".join(lines),
            hint=(
                "Rebase the patch: run `spbuild patch --stop-at-conflict`, resolve the conflict in the tree, "
                "`git am --continue`, then `spbuild export-patches`."
            ),
        )
        self.patch = patch
        self.files = files
        self.hunks = hunks
        self.output = output


class OverlayCollision(SpbuildError):
    """A file of cpp/ exists upstream too: the overlay would overwrite it."""


class BuildError(SpbuildError):
    """The compiler or CMake failed."""


class ToolMissing(SpbuildError):
    """A required tool or library is not installed."""
