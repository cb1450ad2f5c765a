"""The launcher's forked workers: exit codes, environment, and never returning to the caller.

``pipebubble run`` forks its ranks from the launcher (no new interpreter, no second import of
torch); the distributed tests run them for real. These check the fork itself, without torch.
"""

import os
import signal
import time

from pipebubble.runtime.dist.launch import describe_exit, fork_worker, loopback_socket


def finished(child, within=30.0):
    """The child's exit code, waiting at most ``within`` seconds (a test never hangs)."""
    deadline = time.monotonic() + within
    while child.poll() is None:
        if time.monotonic() > deadline:
            child.kill()
            raise AssertionError(f"the forked child did not finish within {within:g} s")
        time.sleep(0.01)
    return child.returncode


def test_the_workers_code_is_its_exit_code_and_the_caller_continues_once():
    sock = loopback_socket(1)
    try:
        read, write = os.pipe()
        pid_before = os.getpid()

        def work():
            os.write(write, f"{os.environ['RANK']} {os.environ.get('KEPT')}".encode())
            return 7

        child = fork_worker(work, {"RANK": "3"}, sock.fileno())
        os.close(write)
        assert os.getpid() == pid_before  # only the parent comes back here
        assert finished(child) == 7
        assert os.read(read, 100) == b"3 None"  # the environment is exactly the one given
        os.close(read)
    finally:
        sock.close()


def test_an_exception_or_sys_exit_in_the_worker_ends_the_child_not_the_caller(capfd):
    sock = loopback_socket(1)
    try:
        def boom():
            raise RuntimeError("worker broke")

        def leave():
            raise SystemExit(5)

        assert finished(fork_worker(boom, {}, sock.fileno())) == 1
        assert "RuntimeError: worker broke" in capfd.readouterr().err
        assert finished(fork_worker(leave, {}, sock.fileno())) == 5
    finally:
        sock.close()


def test_a_killed_worker_is_named_by_its_signal():
    sock = loopback_socket(1)
    try:
        def hang():
            signal.pause()
            return 0

        child = fork_worker(hang, {}, sock.fileno())
        assert child.poll() is None
        child.kill()
        assert describe_exit(2, child.wait()) == "rank 2 died (killed by SIGKILL)"
    finally:
        sock.close()
