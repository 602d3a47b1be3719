"""A host takes as many calls at once as one node can be given sandboxes, with room for the calls beside them."""
from cluster.config import WaveConfig
from fleet.host.actor import CALLS_AT_ONCE


def test_a_host_takes_every_sandbox_a_wave_can_place_on_it_and_the_calls_beside_them():
    most = WaveConfig.model_fields["concurrency"].metadata
    le = next(m.le for m in most if getattr(m, "le", None) is not None)
    assert CALLS_AT_ONCE >= 2 * le + 1000  # its tasks, their references, and the faults' and sweeps' calls
