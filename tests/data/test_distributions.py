import pytest

from hermes.data.distributions import DISTRIBUTIONS, DistributionError, describe, sample, usable


def test_the_seventeen_reference_distributions():
    assert len(DISTRIBUTIONS) == 17
    assert DISTRIBUTIONS["science"] == {"web": 94, "vision": 65, "image_gen": 15, "terminal": 94, "file": 94, "browser": 50}
    assert DISTRIBUTIONS["browser_tasks"] == {"vision": 12, "terminal": 15, "browser": 97}


def test_frequencies_match_probabilities_under_a_fixed_seed():
    dist = {"terminal": 80, "file": 30}
    n = 20_000
    draws = [sample(dist, seed=7, key=f"k{i}") for i in range(n)]
    share = {t: sum(t in d for d in draws) / n for t in dist}
    # Both drawn independently; when neither is drawn (p = 0.2 * 0.7) the most probable is used.
    assert share["terminal"] == pytest.approx(0.80 + 0.2 * 0.7, abs=0.015)
    assert share["file"] == pytest.approx(0.30, abs=0.015)
    both = sum(len(d) == 2 for d in draws) / n
    assert both == pytest.approx(0.8 * 0.3, abs=0.015)
    assert all(d for d in draws)


def test_sampling_is_reproducible_and_seed_dependent():
    dist = DISTRIBUTIONS["balanced"]
    a = [sample(dist, 1, f"k{i}") for i in range(200)]
    assert a == [sample(dist, 1, f"k{i}") for i in range(200)]
    assert a != [sample(dist, 2, f"k{i}") for i in range(200)]


def test_toolsets_without_backend_are_left_out_loudly(caplog):
    kept = usable("science", {"terminal", "file"})
    assert kept == {"terminal": 94, "file": 94}
    assert "browser, image_gen, vision, web" in caplog.text


def test_distribution_with_nothing_usable_is_refused():
    with pytest.raises(DistributionError, match="minimal.*web"):
        usable("minimal", {"terminal", "file"})
    with pytest.raises(DistributionError, match="unknown distribution 'nope'"):
        usable("nope", {"terminal"})


def test_describe_lists_every_distribution():
    text = describe()
    assert all(name in text for name in DISTRIBUTIONS)


def test_different_seeds_give_unrelated_draws():
    # Found once with a generator seeded from one hash: seeds 1 and 4 drew identically for the first prompts.
    dist = {"terminal": 80, "file": 80}
    patterns = {tuple(len(sample(dist, seed, f"key{i}-0")) for i in range(30)) for seed in range(20)}
    assert len(patterns) == 20
