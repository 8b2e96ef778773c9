import pytest

from socialworld.agents.registry import make_policy
from socialworld.metrics.stats import bootstrap, metric_interval, metric_value, paired_difference, pooled_paired_difference
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.spec import resolve_scenarios


@pytest.fixture(scope="module")
def l0_jobs():
    return [EpisodeJob(s, seed) for s in resolve_scenarios(None, ["L0"]) for seed in episode_seeds(7, s.id, 6)]


@pytest.fixture(scope="module")
def expert_eps(l0_jobs):
    return run_episodes(make_policy("expert"), l0_jobs)


@pytest.fixture(scope="module")
def random_eps(l0_jobs):
    return run_episodes(make_policy("random", seed=3), l0_jobs)


def test_bootstrap_is_seeded_and_brackets_the_mean():
    xs = [0.0, 1.0] * 50
    a, b = bootstrap(xs, seed=1), bootstrap(xs, seed=1)
    assert a == b
    assert a.lo < a.mean == 0.5 < a.hi
    # the normal approximation of a fair coin's mean over n=100: +-1.96*0.05
    assert a.hi - a.lo == pytest.approx(2 * 1.96 * 0.05, abs=0.02)
    assert bootstrap([0.3] * 9).lo == bootstrap([0.3] * 9).hi == pytest.approx(0.3)
    with pytest.raises(ValueError):
        bootstrap([])


def test_paired_difference_separates_expert_from_random(expert_eps, random_eps):
    for key in ("pass", "D", "CR"):
        iv = paired_difference(random_eps, expert_eps, key)
        assert iv.excludes_zero() and iv.mean > 0, (key, iv)
        assert iv.n == len(expert_eps)
    same = paired_difference(expert_eps, expert_eps, "D")
    assert same.mean == same.lo == same.hi == 0.0 and not same.excludes_zero()
    assert metric_interval(expert_eps, "pass").mean == pytest.approx(
        sum(metric_value(e, "pass") for e in expert_eps) / len(expert_eps))


def test_paired_difference_refuses_unmatched_episodes(expert_eps, random_eps):
    with pytest.raises(ValueError, match="same episodes"):
        paired_difference(random_eps[1:], expert_eps, "D")
    with pytest.raises(KeyError):
        metric_value(expert_eps[0], "charm")


def test_a_pooled_difference_pairs_within_each_run_and_bootstraps_all_of_them(expert_eps, random_eps):
    """Two runs that share their episodes' keys (as runs of other seeds may by chance): pairs never
    cross runs, so the pooled mean is the mean of both runs' differences, over twice the episodes."""
    run2_a, run2_b = expert_eps, expert_eps  # a second run where B equals A on every episode
    iv = pooled_paired_difference([(random_eps, expert_eps), (run2_a, run2_b)], "D", resamples=2000)
    one = paired_difference(random_eps, expert_eps, "D", resamples=2000)
    assert iv.n == 2 * len(expert_eps) and iv.mean == pytest.approx(one.mean / 2)
    assert iv.excludes_zero() and iv.lo < one.lo  # the second run's zeros pull the interval down
    with pytest.raises(ValueError, match="same episodes"):  # a run's unmatched episodes are an error, as unpooled
        pooled_paired_difference([(random_eps, expert_eps), (random_eps[1:], expert_eps)], "D")


def test_kappa_rho_and_ranks_against_hand_computed_values():
    import math

    from socialworld.metrics.stats import cohen_kappa, ranks, spearman

    # p_o = 3/4; p_a = 1/2, p_b = 1/4; p_e = 1/2 * 1/4 + 1/2 * 3/4 = 1/2; kappa = (3/4 - 1/2) / (1/2)
    assert cohen_kappa([True, True, False, False], [True, False, False, False]) == pytest.approx(0.5)
    assert cohen_kappa([True, False], [False, True]) == pytest.approx(-1.0)
    assert cohen_kappa([True, True], [True, True]) is None  # p_e = 1: undefined, not 0 and not 1
    assert list(ranks([3, 1, 3, 2])) == [3.5, 1.0, 3.5, 2.0]
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(1 - 6 * 2 / (4 * 15))  # no ties: 1 - 6 sum d^2 / n(n^2-1)
    # ties: ranks x = (1.5, 1.5, 3), y = (1, 2, 3); cov 1/2, var x 1/2, var y 2/3
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.5 / math.sqrt(0.5 * 2 / 3))
    assert spearman([5, 5, 5], [1, 2, 3]) is None
    with pytest.raises(ValueError):
        cohen_kappa([True], [True, False])


def test_a_bootstrapped_statistic_leaves_out_undefined_resamples():
    import numpy as np

    from socialworld.metrics.stats import bootstrap_statistic, cohen_kappa

    a = np.array([True, True, False, False, True, False])
    b = np.array([True, False, False, False, True, True])
    i = bootstrap_statistic(len(a), lambda ix: cohen_kappa(a[ix], b[ix]), resamples=500, seed=3)
    assert i.mean == pytest.approx(cohen_kappa(a, b)) and i.lo <= i.mean <= i.hi and 0 < i.resamples < 500  # some all-equal draws
    assert i == bootstrap_statistic(len(a), lambda ix: cohen_kappa(a[ix], b[ix]), resamples=500, seed=3)  # seeded
    assert bootstrap_statistic(3, lambda ix: None) is None
    # defined on all items, on no resample (a draw of 30 with no repeat): no interval, not a NaN one
    assert bootstrap_statistic(30, lambda ix: 1.0 if len(set(ix.tolist())) == 30 else None, resamples=50) is None
