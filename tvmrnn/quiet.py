"""Keep TVM's C++ log lines (`[16:00:00] executable.cc:276: Warning: Scope Saving: ...`) out of what people read.

TVM 0.27 has no run-time switch for them: LOG(WARNING) writes straight to std::cerr (TVM_LOG_DEBUG only turns the
DLOG/VLOG ones on), so Python's sys.stderr redirection misses them. `tvm_logs_filtered` swaps file descriptor 2 for a
pipe and forwards everything that is not a TVM log line to the real stderr as it comes (tqdm's progress bars
included); TVM's lines are dropped, or rewritten (`rewrite`: a server logs them as JSON lines). Child processes
inherit the pipe, so a server's model workers are filtered too.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

# TVM's LogMessage prefix: "[HH:MM:SS] path/to/file.cc:LINE: " (then "Warning: ", "Error: " or the message)
TVM_LOG_LINE = re.compile(rb"^\[\d\d:\d\d:\d\d\] \S+:\d+: ")


def is_tvm_log_line(line: bytes) -> bool:
    return TVM_LOG_LINE.match(line.lstrip(b"\r")) is not None


def _forward(read_fd: int, out_fd: int, rewrite) -> None:
    """Copy read_fd to out_fd until EOF, TVM's lines as rewrite(line) gives them (None: dropped). A partial line is passed on at once (progress
    bars redraw with \\r and no newline) unless it may be the start of a TVM line, which waits for its newline."""
    pending = b""
    while chunk := os.read(read_fd, 65536):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            _write_line(out_fd, line, rewrite)
        if pending and not pending.lstrip(b"\r").startswith(b"["):
            os.write(out_fd, pending)
            pending = b""
    if pending:
        _write_line(out_fd, pending, rewrite)


def _write_line(out_fd: int, line: bytes, rewrite) -> None:
    if is_tvm_log_line(line):
        text = rewrite(line.decode(errors="replace").lstrip("\r"))
        if text is not None:
            os.write(out_fd, text.encode() + b"\n")
    else:
        os.write(out_fd, line + b"\n")


@contextlib.contextmanager
def tvm_logs_filtered(rewrite=None):
    """Within the block, TVM's log lines on fd 2 are dropped, or written as rewrite(line) gives them (None: dropped);
    the rest of stderr passes as it comes."""
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    thread = threading.Thread(target=_forward, args=(read_fd, saved, rewrite or (lambda _line: None)), daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end held here: the thread reads EOF once children let go
        thread.join(timeout=5)
        if not thread.is_alive():  # else a child still holds the pipe: the thread keeps forwarding until it exits
            os.close(read_fd)
            os.close(saved)

