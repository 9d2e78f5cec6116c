"""``hops up`` adopts and reaps orphaned descendants, so that a SIGKILLed
process group does not linger as zombies under a PID 1 that never reaps.

Each check runs in a fresh interpreter: becoming a subreaper lasts for the
life of a process, and the test process must not adopt other tests' orphans.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_CHILD_SUBREAPER is Linux's")


def run(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_killed_groups_orphan_is_adopted_and_reaped() -> None:
    out = run("""
        import os, signal, subprocess, time
        from cli.up.launcher import become_subreaper, reap_orphans
        assert become_subreaper()
        leader = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; exit 0"],
                                  stdout=subprocess.PIPE, start_new_session=True)
        orphan = int(leader.stdout.readline())
        assert leader.wait() == 0
        os.killpg(leader.pid, signal.SIGKILL)
        # Adopted: a zombie of ours until reaped, so kill(pid, 0) still succeeds.
        time.sleep(0.3)
        os.kill(orphan, 0)
        reaped = 0
        for _ in range(250):
            reaped += reap_orphans(set())
            try:
                os.killpg(leader.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
        print(reaped)
    """)
    assert out == "1"


def test_reaping_leaves_the_status_of_a_tracked_child_alone() -> None:
    out = run("""
        import subprocess, time
        from cli.up.launcher import become_subreaper, reap_orphans
        assert become_subreaper()
        child = subprocess.Popen(["sh", "-c", "exit 3"])
        time.sleep(0.3)
        print(reap_orphans({child.pid}), child.wait())
    """)
    assert out == "0 3"


def test_free_port_never_gives_the_same_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may hand a just-closed ephemeral port out again; two services
    told one health port meant one failed to bind. A fake socket (the kernel's
    choice cannot be forced) answers 41000 twice, then 41001."""
    import cli.up.launcher as launcher

    answers = iter([41000, 41000, 41001])

    class Kernel:
        def __enter__(self) -> Kernel:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(answers)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(launcher, "_GIVEN", set())
    monkeypatch.setattr("cli.up.launcher.socket.socket", Kernel)
    assert [launcher.free_port(), launcher.free_port()] == [41000, 41001]
