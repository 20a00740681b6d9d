"""A child's processes end with the process that started them, however it ends.

``capstack run`` (and ``--nproc``, for torchrun) starts a command through a keeper: this file,
run as a script (``python -I keeper.py PARENT_PID STATUS_FD PROGRAM ARGV...``). The keeper
starts the command in a process group of its own, holds whatever the parent handed it (the
stage's lock) and waits. So every process of the command (a shell's children, DataLoader
workers, torchrun's processes) ends with it:

* the parent stopped (SIGTERM, Ctrl-C) asks the keeper to stop, which passes SIGTERM to the
  command and waits for it: a capstack training ends at a batch boundary and records itself
  ``stopped``, as when it is stopped by hand;
* the parent killed (SIGKILL, the out-of-memory killer) cannot ask: the kernel sends the keeper
  SIGTERM (Linux's parent-death signal), and the keeper stops the command the same way. The
  command gets the same signal should the keeper itself be killed;
* what is left of the command's group once a stopped command has ended (a shell's child) is
  sent SIGTERM, then SIGKILL after :data:`LINGER` seconds; a command that has not ended
  :data:`GRACE` seconds after being asked is killed with its group.

The stage's lock is a descriptor the keeper inherits: the lock holds until the command's
processes are gone, so a rerun never starts a second copy of a command still stopping.

The keeper imports the standard library only, and runs isolated (``-I``): neither the working
folder nor ``PYTHON*`` variables reach its path. The parent side is :func:`run_kept`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Mapping, Sequence

GRACE = 60.0  # seconds a stopped command has to end (its batch in progress) before SIGKILL
LINGER = 5.0  # seconds what is left of its group has after SIGTERM
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36  # prctl(2)
_POLL = 0.05


def _prctl(option: int, value: int) -> None:
    """prctl(2) on Linux; elsewhere nothing: the keeper then ends with a parent that stops,
    not with one that is killed."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask the kernel for ``signum`` when this process's parent dies."""
    _prctl(_PR_SET_PDEATHSIG, signum)


def _own_group() -> None:
    """In the command before it runs: a process group of its own (Popen's ``process_group``
    from Python 3.11), and SIGTERM should the keeper die."""
    os.setpgid(0, 0)
    die_with_parent()


# -- the parent's side --------------------------------------------------------------------------

def run_kept(argv: Sequence[str], *, executable: str, cwd=None,
             env: Mapping[str, str] | None = None, pass_fds: Sequence[int] = ()) -> int:
    """Run ``argv`` (``executable``, an absolute path) through a keeper; its exit status
    (negative: the signal that ended it). ``pass_fds`` stay open in the keeper, not in the
    command. A program that cannot be started raises ``OSError`` with the reason. Stopped
    here (SIGTERM's error, ``KeyboardInterrupt``), the keeper is asked to stop the command,
    and the error is raised once the command has ended."""
    status_read, status_write = os.pipe()
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()),
             str(status_write), executable, *argv],
            cwd=cwd, env=None if env is None else dict(env),
            pass_fds=(status_write, *pass_fds))
    except BaseException:
        os.close(status_read)
        raise
    finally:
        os.close(status_write)
    try:
        with os.fdopen(status_read, "rb") as status:
            problem = status.read().decode("utf-8", "replace")  # EOF once the command started
        rc = keeper.wait()
    except BaseException:
        _stop(keeper)
        raise
    if problem:
        raise OSError(problem)
    return rc


def _stop(keeper: subprocess.Popen) -> None:
    """Ask the keeper to stop its command, and wait until it has. What interrupts the wait is
    another stop asked of this process (a signal's error), passed on in turn: the command's
    second stop ends it at once. The keeper's :data:`GRACE` bounds the wait; a keeper that
    outlives it is killed (its command then gets the parent-death signal)."""
    deadline = time.monotonic() + GRACE + LINGER + 10
    while keeper.poll() is None:
        try:
            keeper.send_signal(signal.SIGTERM)
            keeper.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            keeper.kill()
        except BaseException:  # a second SIGTERM or Ctrl-C: asked again
            continue


# -- the keeper's side --------------------------------------------------------------------------

class _Keeper:
    def __init__(self) -> None:
        self.command: subprocess.Popen | None = None
        self.pid = 0  # the command's; also its process group's id
        self.status: int | None = None  # the command's exit status, once it has ended
        self.stop_by = 0.0  # when a stopped command is killed; 0: not asked to stop

    def ask_stop(self, signum=None, frame=None) -> None:
        if not self.stop_by:
            self.stop_by = time.monotonic() + GRACE
        if self.pid and self.status is None:
            _signal(self.pid, signal.SIGTERM, group=False)

    def start(self, program: str, argv: list[str], status_fd: int) -> None:
        try:
            # kept: a Popen object collected would reap the command in its __del__, unseen
            self.command = subprocess.Popen(argv, executable=program, preexec_fn=_own_group)
        except OSError as error:
            os.write(status_fd, (error.strerror or str(error)).encode())
            os._exit(127)
        self.pid = self.command.pid
        os.close(status_fd)
        if self.stop_by:  # asked before the command existed
            _signal(self.pid, signal.SIGTERM, group=False)

    def wait(self) -> int:
        """The command's exit status, once it and (when stopped) its group are gone."""
        while self.status is None:
            self.reap()
            if self.status is None:
                if self.stop_by and time.monotonic() > self.stop_by:
                    _signal(self.pid, signal.SIGKILL, group=True)
                time.sleep(_POLL)
        if self.stop_by:
            self.end_group()
        return self.status

    def reap(self) -> None:
        """Reap every child that has ended: the command, and its orphans (the keeper is their
        subreaper, so that none lingers as a zombie of a slow init, still in the group)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:  # no child left, the command included
                if self.status is None:  # reaped unseen (never, with self.command kept): said
                    self.status = 1  # to have failed rather than waited for, for ever
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = os.waitstatus_to_exitcode(status)
                if self.command is not None:  # so that it never waits for the pid itself
                    self.command.returncode = self.status

    def end_group(self) -> None:
        """SIGTERM to what is left of the command's group, SIGKILL :data:`LINGER` s later."""
        deadline = time.monotonic() + LINGER
        if not _signal(self.pid, signal.SIGTERM, group=True):
            return
        while time.monotonic() < deadline:
            time.sleep(_POLL)
            self.reap()
            if not _signal(self.pid, 0, group=True):
                return
        _signal(self.pid, signal.SIGKILL, group=True)


def _signal(pid: int, signum: int, *, group: bool) -> bool:
    """Send ``signum`` to ``pid`` (or its group); whether there was anyone to send it to."""
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _exit_as(rc: int) -> None:
    """End this process as the command ended: its status, or the signal that killed it."""
    if rc < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        rc = 128 - rc
    sys.exit(rc)


def main(args: list[str]) -> None:
    parent, status_fd, program, argv = int(args[0]), int(args[1]), args[2], args[3:]
    keeper = _Keeper()
    # a terminal's Ctrl-C reaches the parent too, which asks; a handler, unlike SIG_IGN, is not
    # inherited by the command
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, keeper.ask_stop)
    die_with_parent()
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != parent:  # the parent died before it could be watched
        os._exit(128 + signal.SIGTERM)
    keeper.start(program, argv, status_fd)
    _exit_as(keeper.wait())


if __name__ == "__main__":
    main(sys.argv[1:])
