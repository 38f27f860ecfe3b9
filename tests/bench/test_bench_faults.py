"""What bench/bench_faults.py measures per cell that is plain arithmetic: the longest stall (inputs
waiting, the worker ready, no output), and which faults apply to which link."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_faults import FAULTS, LIMIT_DATA, LINKS, applies, longest_stall


def test_a_stall_counts_only_ready_time_with_inputs_waiting_and_ends_at_an_output() -> None:
    samples = [(float(t), 200) for t in range(0, 11)]
    # one input published at 0.5, its output at 6.5: 6 s waiting, ready, without an output (to the
    # samples' resolution of 1 s here)
    assert longest_stall(samples, [6.5], {"a": 0.5}, {"a": 6.5}) == 6.0
    # the same wait, but the worker said not ready (a dependency down) at 3, 4 and 5: only 3 s count
    down = [(t, 503 if 2 < t <= 5 else 200) for t, _ in samples]
    assert longest_stall(down, [6.5], {"a": 0.5}, {"a": 6.5}) == 3.0
    # an output of another input at 3.5 ends the run: 3 s before it, 3 s after it (to 6.5)
    assert longest_stall(samples, [3.5, 6.5], {"a": 0.5, "b": 0.6}, {"a": 6.5, "b": 3.5}) == 3.0
    # without that output the stall is the whole 6 s
    assert longest_stall(samples, [6.5], {"a": 0.5, "b": 0.6}, {"a": 6.5, "b": 6.5}) == 6.0
    # nothing waiting: no stall, however long without output
    assert longest_stall(samples, [], {}, {}) == 0.0


def test_every_link_has_its_faults_and_byte_cuts_where_they_apply() -> None:
    assert [f for f in FAULTS if applies(f, "registry")] == ["latency_500", "latency_5s", "reset_peer", "timeout",
                                                             "down"]
    assert [link for link in LINKS if applies("flap", link)] == ["broker"]
    assert {link for link in LINKS if applies("limit_data", link)} == set(LIMIT_DATA)
    assert LIMIT_DATA["broker"] == ("upstream", 2048)  # the worker's produce requests are cut, not only fetched
