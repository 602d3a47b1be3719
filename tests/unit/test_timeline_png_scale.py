"""timeline.png draws a lane per task up to PNG_LANES tasks; past that, the attempts running over time (a lane each
made a 10,000-task picture 280,000 pixels tall, 11 MB, drawn in minutes)."""
from __future__ import annotations

import struct

import orjson

from cluster import report, results


def _timeline(d, tasks: int) -> None:
    lines = [{"t": 0.0, "wall": 0.0, "event": "wave_start"}]
    for i in range(tasks):
        tid = f"t{i:04d}"
        lines.append({"t": 1.0 + i * 0.01, "event": "attempt_start", "task": tid, "attempt": 1})
        if i % 7 == 0:
            lines.append({"t": 1.5 + i * 0.01, "event": "fault_inject", "task": tid, "instance": f"{tid}-PK1",
                          "applied": True})
            lines.append({"t": 1.6 + i * 0.01, "event": "fault_clear", "task": tid, "instance": f"{tid}-PK1"})
        lines.append({"t": 3.0 + i * 0.01, "event": "attempt_end", "task": tid, "attempt": 1,
                      "exit_code": -9 if i % 7 == 0 else 0})
    (d / results.TIMELINE).write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))


def _png_size(p) -> tuple[int, int]:
    head = p.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_a_small_wave_has_a_lane_per_task(tmp_path):
    _timeline(tmp_path, 10)
    report._timeline_png(tmp_path)
    assert _png_size(tmp_path / results.TIMELINE_PNG) == (800, round((0.35 * 10 + 1.5) * 80))


def test_a_wave_past_the_lanes_shows_attempts_running_in_a_picture_of_fixed_size(tmp_path):
    _timeline(tmp_path, report.PNG_LANES + 100)
    report._timeline_png(tmp_path)
    png = tmp_path / results.TIMELINE_PNG
    assert _png_size(png) == (800, 360)  # not (0.35 * 400 + 1.5) * 80 = 11,320 pixels tall
    assert png.stat().st_size < 200_000
