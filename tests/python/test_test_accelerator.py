"""The test accelerator dlop_test: streams, events, copies and pinned memory
behave as on a GPU, late copies expose missing waits, and training on it
matches the CPU.

Most tests make copies late (``acc.timing(delay_us=DELAY_US)``): a copy then
reads its source after DELAY_US / 2 and writes its destination after DELAY_US,
so a reader or writer that does not wait for it is wrong by a wide margin.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

acc = pytest.importorskip("dlop.testing.accelerator", reason="dlop.testing._accelerator is not built")

DELAY_US = 20_000
DELAY_S = DELAY_US / 1e6
N = 1024


@pytest.fixture
def late():
    with acc.timing(delay_us=DELAY_US, copy_gbps=0):
        yield
    torch.accelerator.synchronize()


def values(n: int = N, start: float = 1.0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float32)


def test_registration_and_device_module():
    import dlop.testing.accelerator as again

    again._register()  # a second registration does nothing
    assert again is acc and torch.dlop_test is acc
    assert torch.get_device_module("dlop_test") is acc
    assert torch.accelerator.current_accelerator() == torch.device("dlop_test")
    assert torch.accelerator.device_count() == acc.device_count() == 2
    if not torch.cuda.is_available():
        assert torch._utils._get_available_device_type() == "dlop_test"
    t = torch.ones(2).dlop_test()
    assert t.is_dlop_test and t.device == torch.device("dlop_test:0")


def test_non_blocking_copy_from_pinned_memory_returns_before_the_data_arrives(late):
    src = values().pin_memory()
    dst = torch.zeros(N, device="dlop_test")
    start, waits = time.perf_counter(), acc.host_waits()
    dst.copy_(src, non_blocking=True)
    assert acc.host_waits() == waits  # returned without waiting for the copy (its time would race a busy host)
    acc.current_stream().synchronize()
    assert time.perf_counter() - start >= DELAY_S
    assert torch.equal(dst.cpu(), src)


def test_blocking_copies_wait_for_the_data(late):
    src = values()
    for pinned, non_blocking in ((True, False), (False, True), (False, False)):
        host = src.pin_memory() if pinned else src.clone()
        dst = torch.zeros(N, device="dlop_test")
        start = time.perf_counter()
        dst.copy_(host, non_blocking=non_blocking)
        assert time.perf_counter() - start >= DELAY_S, (pinned, non_blocking)
        assert acc.current_stream().query()
        back = torch.empty(N)
        back.copy_(dst, non_blocking=non_blocking)  # pageable: waits even when non_blocking
        assert torch.equal(back, src)


def test_device_to_host_copy_into_pinned_memory_lands_late(late):
    dev = values().to("dlop_test")
    out = torch.full((N,), -1.0).pin_memory()
    out.copy_(dev, non_blocking=True)
    assert torch.all(out == -1), "the host sees the data before the copy ended"
    done = torch.Event(device="dlop_test")
    done.record()
    done.synchronize()
    assert torch.equal(out, values())


def test_stream_runs_its_work_in_order(late):
    dst = torch.zeros(N, device="dlop_test")
    out = torch.empty(N).pin_memory()
    for k in range(3):
        dst.copy_(values(start=100.0 * k).pin_memory(), non_blocking=True)
    out.copy_(dst, non_blocking=True)  # queued behind the three, reads the last
    acc.synchronize()
    assert torch.equal(out, values(start=200.0))


def test_events_query_synchronize_and_wait_across_streams(late):
    s1, s2 = acc.Stream(), acc.Stream()
    assert s1 != s2 and s1.device == torch.device("dlop_test:0")
    never = torch.Event(device="dlop_test")
    assert never.query()  # never recorded

    src = values().pin_memory()
    dst = torch.zeros(N, device="dlop_test")
    out = torch.zeros(N).pin_memory()
    start_event = torch.Event(device="dlop_test", enable_timing=True)
    with acc.stream(s1):
        start_event.record()
        dst.copy_(src, non_blocking=True)
    copied = s1.record_event(torch.Event(device="dlop_test", enable_timing=True))
    assert not copied.query()
    s2.wait_event(copied)  # s2 waits on its worker; the host goes on
    with acc.stream(s2):
        out.copy_(dst, non_blocking=True)
    assert not s2.query()
    s2.synchronize()
    assert copied.query()
    assert torch.equal(out, src)
    assert start_event.elapsed_time(copied) >= DELAY_US / 1000 * 0.9


def test_a_missing_wait_reads_stale_data_and_the_wait_fixes_it(late):
    src = values().pin_memory()
    side = acc.Stream()

    # Computation runs after the current stream only: a copy on another stream
    # that it does not wait for has not landed yet.
    dst = torch.zeros(N, device="dlop_test")
    with acc.stream(side):
        dst.copy_(src, non_blocking=True)
    assert torch.all(dst * 1 == 0).item()
    dst = torch.zeros(N, device="dlop_test")
    with acc.stream(side):
        dst.copy_(src, non_blocking=True)
    acc.current_stream().wait_stream(side)
    assert torch.equal((dst * 1).cpu(), src)

    # Stream to stream: a copy that does not wait reads its source before the
    # earlier copy on the other stream has written it.
    for wait in (False, True):
        x = torch.zeros(N, device="dlop_test")
        out = torch.full((N,), -1.0).pin_memory()
        producer, consumer = acc.Stream(), acc.Stream()
        with acc.stream(producer):
            x.copy_(src, non_blocking=True)
        if wait:
            consumer.wait_stream(producer)
        with acc.stream(consumer):
            out.copy_(x, non_blocking=True)
        acc.synchronize()
        expected = src if wait else torch.zeros(N)
        assert torch.equal(out, expected), f"wait={wait}"


def test_host_overwriting_a_pinned_source_too_early_changes_the_copy(late):
    src = values().pin_memory()
    dst = torch.zeros(N, device="dlop_test")
    dst.copy_(src, non_blocking=True)
    src.fill_(7.0)  # before the copy read it: a bug the event would have caught
    assert torch.all(dst.cpu() == 7.0)


def test_pinned_memory():
    assert torch.empty(N, pin_memory=True).is_pinned()
    assert torch.ones(N).pin_memory().is_pinned()
    assert not torch.ones(N).is_pinned()
    assert not torch.ones(N, device="dlop_test").is_pinned()
    # C++: at::getHostAllocator(PrivateUse1) is this allocator, and its memory counts as pinned.
    assert acc._C._host_allocator_check()


def test_freed_exported_memory_poisons_itself():
    # On a GPU the caching allocator hands a freed block to the next tensor
    # while a peer that mapped it may still read it: here the block fills
    # with set bits (NaN, -1) when its creator frees it, so such a read fails.
    mine, handle = acc.empty_shared(4096, 0)
    mine.fill_(7)
    theirs = acc.open_shared(handle, 4096, 0)  # as a peer process maps it
    acc.synchronize(0)
    assert theirs.cpu().eq(7).all()
    del mine
    assert theirs.cpu().eq(255).all()
    assert theirs.view(torch.float32).cpu().isnan().all()


def test_two_devices_and_copies_between_them(late):
    assert acc.device_count() == 2
    src = values().pin_memory()
    a = torch.zeros(N, device="dlop_test:0")
    a.copy_(src, non_blocking=True)  # late, on device 0's current stream
    b = a.to("dlop_test:1")  # queued on device 1, after device 0's copy
    assert b.device == torch.device("dlop_test:1")
    assert torch.equal(b.cpu(), src)

    with acc.device(1):
        assert acc.current_device() == 1 and torch.empty(1, device="dlop_test").device.index == 1
        assert acc.current_stream().device_index == 1
    assert acc.current_device() == 0
    acc.set_device("dlop_test:1")
    try:
        assert torch.accelerator.current_device_index() == 1
    finally:
        torch.accelerator.set_device_index(0)


def test_dtype_converting_and_non_contiguous_copies(late):
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    d = x.t().to("dlop_test", dtype=torch.float32)  # non-contiguous source, float64 -> float32
    assert d.dtype == torch.float32 and torch.equal(d.cpu(), x.t().float())

    wide = torch.zeros(4, 6, dtype=torch.int32)
    wide[:, ::2].copy_(d)  # device -> non-contiguous host view, float32 -> int32
    assert torch.equal(wide[:, ::2], x.t().int()) and torch.all(wide[:, 1::2] == 0)

    e = torch.zeros(8, 3, dtype=torch.float64, device="dlop_test:1")
    e[::2].copy_(d)  # device 0 -> non-contiguous view on device 1, with conversion
    assert torch.equal(e.cpu()[::2], x.t()) and torch.all(e.cpu()[1::2] == 0)

    f = torch.empty(3, 4, device="dlop_test")
    f.copy_(torch.tensor(5.0))  # broadcast
    assert torch.all(f.cpu() == 5.0)


def test_copies_into_leaves_that_require_grad(late):
    # The copy runs on a stream's thread, outside the caller's no_grad.
    leaf = torch.zeros(N, requires_grad=True)
    param = torch.nn.Parameter(torch.zeros(N, device="dlop_test"))
    with torch.no_grad():
        leaf.copy_(values().to("dlop_test"))
        param.copy_(values())
    assert torch.equal(leaf.detach(), values()) and torch.equal(param.detach().cpu(), values())


def test_copy_rate_model():
    data = torch.ones(4_000_000 // 4).pin_memory()  # 4 MB
    dst = torch.empty_like(data, device="dlop_test")
    with acc.timing(delay_us=0, copy_gbps=1.0):  # 4 ms at 1 GB/s
        start = time.perf_counter()
        dst.copy_(data)
        assert time.perf_counter() - start >= 0.004
    assert torch.equal(dst.cpu(), data)


def test_streams_through_torch_accelerator():
    s = torch.Stream(device="dlop_test:1")
    with acc.stream(s):
        assert torch.accelerator.current_stream(1) == s
        assert acc.current_stream(1) == s
    assert acc.current_stream(1) == acc.default_stream(1)
    torch.accelerator.set_stream(s)
    assert torch.accelerator.current_stream(1) == s
    torch.accelerator.set_stream(acc.default_stream(1))

    seen = []
    with acc.stream(s):
        t = threading.Thread(target=lambda: seen.append(acc.current_stream(1)))
        t.start()
        t.join()
    assert seen == [acc.default_stream(1)]  # the current stream is per thread

    dev = torch.ones(4, device="dlop_test:1")
    dev.record_stream(s)
    torch.accelerator.synchronize(1)
    acc.synchronize("dlop_test:1")


def test_training_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 3),
    )
    dev = copy.deepcopy(cpu).to("dlop_test")
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 3, (8,))
    for model, device in ((cpu, "cpu"), (dev, "dlop_test")):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
    for (name, a), b in zip(cpu.state_dict().items(), dev.state_dict().values()):
        assert b.device.type == "dlop_test"
        assert torch.equal(a, b.cpu()), name


def test_ddp_runs_its_device_paths_on_dlop_test():
    """DDP's construction, its copy of inputs from another device on a side
    stream (then wait_stream and record_stream: the late copy must have landed
    before the forward reads it) and its reducer run on dlop_test; a local comm
    hook stands in for the all-reduce, which a real backend provides."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("cpu:fake,dlop_test:fake", store=FakeStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        reference = copy.deepcopy(model)
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model).to("dlop_test:1"), device_ids=[1])

        def local_hook(state, bucket):
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future

        ddp.register_comm_hook(None, local_hook)
        x = torch.randn(3, 4)
        x_dev = x.to("dlop_test:0")
        acc.synchronize(1)  # nothing queued on device 1 that would delay the forward by luck
        with acc.timing(delay_us=DELAY_US):
            ddp(x_dev).sum().backward()
        reference(x).sum().backward()
        for p, q in zip(ddp.parameters(), reference.parameters()):
            assert p.grad.device == torch.device("dlop_test:1")
            torch.testing.assert_close(p.grad.cpu(), q.grad)
    finally:
        dist.destroy_process_group()
        torch.accelerator.set_device_index(0)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )


def test_environment_is_read_at_load():
    code = "import dlop.testing.accelerator as a; print(a.device_count(), *a.settings().values())"
    done = _run(code, DLOP_TEST_DEVICE_COUNT="3", DLOP_TEST_DEVICE_DELAY_US="1500", DLOP_TEST_DEVICE_COPY_GBPS="25",
                DLOP_TEST_DEVICE_MEM_GBPS="900", DLOP_TEST_DEVICE_OP_US="40", DLOP_TEST_DEVICE_TFLOPS="0.5",
                DLOP_TEST_DEVICE_QUERY_US="7")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "1500", "25.0", "900.0", "40", "0.5", "7"]
    bad = _run(code, DLOP_TEST_DEVICE_DELAY_US="soon")
    assert bad.returncode != 0 and "DLOP_TEST_DEVICE_DELAY_US=soon" in bad.stderr
