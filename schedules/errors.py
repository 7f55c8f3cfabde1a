"""The error the kernel generators raise for a layer or kernel choice they cannot build."""


class KernelError(ValueError):
    """A layer, kernel kind or device outside what the generators here build; the message names the node and the
    kernel, what was asked and what is supported."""
