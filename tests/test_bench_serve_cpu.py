"""`tttr bench serve`'s --db overhead by the servers' CPU time: the reading it is built on."""

from __future__ import annotations

import subprocess
import sys
import time

from tttr.engine.bench.serve import _cpu_seconds


def test_a_process_cpu_time_counts_its_work_not_its_waiting():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.4: pass\ntime.sleep(30)"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 60
        while (_cpu_seconds(busy.pid) or 0) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
        burnt, waited = _cpu_seconds(busy.pid), _cpu_seconds(idle.pid)
        assert burnt >= 0.4  # its loop's CPU second fractions, whatever the wall time under load
        assert waited < burnt  # a sleeping process costs (almost) nothing
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    assert _cpu_seconds(busy.pid) is None  # gone: no figure rather than a wrong one
