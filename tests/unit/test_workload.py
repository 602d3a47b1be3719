from fleet import workload


def test_reference_is_deterministic_and_seed_dependent():
    assert workload.reference(3, 6) == workload.reference(3, 6)
    assert workload.fingerprint(workload.reference(3, 6)) != workload.fingerprint(workload.reference(4, 6))


def test_step_markers_count_each_application():
    files = workload.reference(3, 6)
    assert workload.step_counts(files) == {i: 1 for i in range(6)}
    files = workload.apply(files, workload.decide(3, 2))
    assert workload.step_counts(files)[2] == 2
