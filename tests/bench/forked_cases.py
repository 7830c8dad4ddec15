"""bench.common.forked: benchmark programs run in a forked copy of the test process, as `python -m` would run them.

Run by test_bench_forked.py in a fresh interpreter: whether forking is safe depends on the threads a process holds,
and tests that ran before in the same worker may have left some."""

import os
import sys
import threading
import time

import pytest

from bench.common import forked, netns

PROBE = """
import os, sys
print("argv", sys.argv[1:], "name", __name__, "env", os.environ.get("PROBE_VALUE"), "path", "PATH" in os.environ)
print("devices", sorted(os.listdir("/sys/class/net")))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def probe(tmp_path, monkeypatch):
    (tmp_path / "forked_probe.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _finish(child, deadline_s: float = 60) -> int:
    deadline = time.monotonic() + deadline_s
    while child.poll() is None:
        assert time.monotonic() < deadline, "the child did not finish"
        time.sleep(0.01)
    return child.returncode


def test_a_module_runs_as_main_with_its_argv_environment_output_and_exit_status(probe):
    assert forked.fork_safe()
    log = probe / "out.txt"
    with open(log, "w") as f:
        child = forked.start("forked_probe", ["3", "x y"], env={"PROBE_VALUE": "seven"}, stdout=f)
    assert isinstance(child, forked.Child)
    assert _finish(child) == 3
    text = log.read_text()
    # Only the given environment (no PATH), both streams in the file, the module run as __main__.
    assert "argv ['3', 'x y'] name __main__ env seven path False" in text and "to stderr" in text
    with open(log, "w") as f:
        assert _finish(forked.start("forked_probe", ["0"], stdout=f)) == 0


def test_a_process_with_another_python_thread_starts_a_fresh_interpreter_instead(probe):
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not forked.fork_safe()
        log = probe / "out.txt"
        env = dict(os.environ, PROBE_VALUE="fresh", PYTHONPATH=str(probe))
        with open(log, "w") as f:
            child = forked.start("forked_probe", ["4"], env=env, stdout=f)
        assert not isinstance(child, forked.Child)
        assert _finish(child) == 4 and "env fresh" in log.read_text()
        with pytest.raises(RuntimeError, match="other threads"):
            forked.call(sum, [1, 2])
    finally:
        stop.set()
        other.join()


def _fails(word: str):
    raise ValueError(f"bad {word}")


def test_call_returns_the_childs_result_and_names_its_failure():
    assert forked.call(sorted, [3, 1, 2]) == [1, 2, 3]
    assert forked.call(os.getpid) != os.getpid()  # it ran elsewhere
    with pytest.raises(RuntimeError, match="ValueError: bad input"):
        forked.call(_fails, "input")
    with pytest.raises(RuntimeError, match="died in its forked child"):
        forked.call(os._exit, 9)


def test_a_child_on_a_namespace_host_sees_that_hosts_network(probe):
    ok, why = netns.available()
    if not ok:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    with netns.Hosts(2) as hosts:
        log = probe / "out.txt"
        with open(log, "w") as f:
            child = hosts.start_module(1, "forked_probe", ["0"], stdout=f)
        assert _finish(child) == 0
    # Its /sys lists that host's devices, not this machine's (UCX picks its devices there).
    assert f"devices {sorted(['lo', hosts.device])}" in log.read_text()
    assert sys.modules["bench.common.forked"] is forked
