"""The rooms of a wave. `cluster/driver.py` (WaveRun) runs a wave through them; each room gets what it uses by
constructor argument.

- `plan`: the plan of a wave (tasks, seeds, faults, references), a replay's and a boundary-enumerated one's.
- `parts`: what a wave runs on (`Parts`: store, proxy, services, fleet), checked before anything starts.
- `access`: each attempt's credentials and the runner contract's environment, and their revocation.
- `health`: every part watched; a lost part is a harness fault that ends the wave.
- `nodes`: placement of attempts on sandbox nodes, and PK3's node loss and return.
- `timeline`: the wave's event log, and the state of each task's run.
"""
