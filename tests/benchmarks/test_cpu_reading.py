"""The benchmarks' CPU reading (benchmarks/loadclient.py ``thread_cpu``/``cpu_since``).

A goal is a ratio of two CPU figures; a small run (the CI's goals run is 30 requests) must not
read a server's few milliseconds as nothing. ``/proc/PID/stat`` counts in 10 ms clock ticks,
so these tests would fail on it: the child below spends 4 ms, which ticks read as 0 or 10.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import ModuleType

from .scripts import load

# Spins until its own thread has spent SPIN seconds of CPU each time it reads "main", says so.
# "start" starts a thread that spends 5 * SPIN and then waits; "end" lets it end.
CHILD = textwrap.dedent(
    """
    import sys, threading, time
    SPIN = float(sys.argv[1])
    def spin(seconds):
        start = time.thread_time()
        while time.thread_time() - start < seconds:
            pass
    spun, release = threading.Event(), threading.Event()
    def helper():
        spin(5 * SPIN)
        spun.set()
        release.wait()
    worker = threading.Thread(target=helper)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "start":
            worker.start()
            spun.wait()
        elif line.strip() == "end":
            release.set()
            worker.join()
        else:
            spin(SPIN)
        print("done", flush=True)
    """
)


def _loadclient() -> ModuleType:
    return load("loadclient")


def _spinner(spin: float) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(spin)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        with child:
            child.kill()
        raise AssertionError("the spinning child did not start")
    return child


def _ask(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write(line + "\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "done"


def test_a_few_milliseconds_of_cpu_are_read_to_the_millisecond() -> None:
    loadclient = _loadclient()
    with _spinner(0.004) as child:
        before = loadclient.thread_cpu([child.pid])
        _ask(child, "main")
        spent = loadclient.cpu_since(before, [child.pid])
        child.kill()
    assert 0.004 <= spent < 0.009


def test_a_thread_that_ends_between_readings_is_not_subtracted() -> None:
    # A sum over the process's threads before and after would subtract the 20 ms the ended
    # thread had spent before the first reading; its time since is lost with it, and the thread
    # that stays is still counted.
    loadclient = _loadclient()
    with _spinner(0.004) as child:
        _ask(child, "start")
        before = loadclient.thread_cpu([child.pid])
        _ask(child, "end")
        _ask(child, "main")
        spent = loadclient.cpu_since(before, [child.pid])
        child.kill()
    assert 0.004 <= spent < 0.009
