"""Investigation aid, not part of any stage: a memory log from inside each Beam SDK worker process.

Active only when this folder is on PYTHONPATH, MEMPROBE_DIR is set and the process is a worker
(`apache_beam.runners.worker.sdk_worker_main`, which the DirectRunner's multi_processing mode
starts with the runner's environment). Every 2 s it appends to MEMPROBE_DIR/<pid>.log: RSS and its
peak (VmHWM), Python's traced heap (tracemalloc, one frame), glibc's malloc in use / free / mmapped
(mallinfo2), pyarrow's pool, the thread count and the bytes waiting in Beam's data-plane queues.

    PYTHONPATH=.:benchmarks/worker_probe MEMPROBE_DIR=/tmp/probe labse-clean ... \\
        --direct_running_mode multi_processing --direct_num_workers 2

What this told: BENCHMARKS.md, "Why the DirectRunner's workers grow with the input".
"""
import os
import sys

if os.environ.get("MEMPROBE_DIR") and "sdk_worker_main" in " ".join(sys.orig_argv):
    import ctypes
    import gc
    import threading
    import time
    import tracemalloc

    tracemalloc.start(1)
    _libc = ctypes.CDLL("libc.so.6")

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

    _libc.mallinfo2.restype = _MallInfo2

    def _status_mb() -> dict:
        with open("/proc/self/status", encoding="ascii") as f:
            return {line.split(":")[0]: int(line.split()[1]) >> 10 for line in f if line.startswith(("VmRSS", "VmHWM"))}

    def _queued() -> str:
        queues = sys.modules.get("apache_beam.utils.byte_limited_queue")
        if queues is None:
            return "-"
        found = [o for o in gc.get_objects() if isinstance(o, queues.ByteLimitedQueue) and o._byte_size]
        return " ".join(f"{o._byte_size >> 20}MB/{len(o._queue)}" for o in found) or "0"

    def _line() -> str:
        info, status = _libc.mallinfo2(), _status_mb()
        traced, traced_peak = tracemalloc.get_traced_memory()
        pa = sys.modules.get("pyarrow")
        arrow = f"{pa.total_allocated_bytes() >> 20}/{pa.default_memory_pool().max_memory() >> 20}" if pa else "-"
        return (f"{time.strftime('%H:%M:%S')} rss {status['VmRSS']} hwm {status['VmHWM']} traced {traced >> 20} "
                f"traced_peak {traced_peak >> 20} malloc_inuse {(info.uordblks + info.hblkhd) >> 20} "
                f"malloc_free {info.fordblks >> 20} mmapped {info.hblkhd >> 20} arrow {arrow} "
                f"threads {threading.active_count()} queued {_queued()}")

    def _log_forever() -> None:
        with open(f"{os.environ['MEMPROBE_DIR']}/{os.getpid()}.log", "w", buffering=1, encoding="utf-8") as out:
            while True:
                time.sleep(2)
                out.write(_line() + "\n")

    threading.Thread(target=_log_forever, daemon=True).start()
