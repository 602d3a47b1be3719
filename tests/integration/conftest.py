from __future__ import annotations

import pytest

from cluster.config import build_config
from cluster.driver import WaveRun


@pytest.fixture(scope="session")
def run_wave(fleet, tmp_path_factory):
    """Run a real wave on the session's fleet; returns (result, results_dir)."""
    root = tmp_path_factory.mktemp("results")

    def _run(**cfg):
        wave = WaveRun(build_config(cfg), root, progress=False, fleet=fleet)
        result = wave.run()
        return result, wave.dir

    _run.root = root
    return _run
