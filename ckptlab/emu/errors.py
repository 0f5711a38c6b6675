"""The emulator's errors: faults in kernels, launches it refuses, builds that fail."""

from __future__ import annotations


class EmuError(RuntimeError):
    """A fault inside an emulated kernel, or a launch the emulator refuses.

    Attributes (None where unknown): kind, kernel, block, thread, file, line.
    """

    def __init__(self, message, *, kind=None, kernel=None, block=None, thread=None, file=None,
                 line=None):
        super().__init__(message)
        self.kind, self.kernel, self.block, self.thread = kind, kernel, block, thread
        self.file, self.line = file, line


class EmuCompileError(EmuError):
    """The C++ compiler rejected a kernel file (the message carries its output) or is missing,
    or the build cache is not safe to use."""


class CompilerUnusable(EmuCompileError):
    """No compiler here can build the emulator: none on the PATH, clang where g++ is asked for
    (macOS), a g++ older than GCC 10, or a system other than Linux. The message is one line and
    names what to do instead."""
