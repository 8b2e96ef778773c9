"""Optional Ray execution of the work that parallelises (contract §10): the sleep phase's
counterfactual scoring (a pure function of scenario, wake episode and reference episode), scripted
policies' rollouts, and suite variants. ``pip install 'socialworld[scale]'`` adds Ray.

:func:`pmap` is the one entry: ``[fn(x) for x in items]``, in input order, either in this process
(``ray=""``, the default: Ray is never imported) or as one Ray task per item (``ray="local"``
starts a local Ray on this machine's CPUs; any other value is a cluster address such as
``ray://head:10001`` or ``auto``). Every task's randomness comes from seeds derived from its
inputs (:func:`socialworld.world.rng.derive_seed`), never from the process, so both ways give the same
results, byte for byte (tested).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ray_init(address: str, num_cpus: int | None = None) -> None:
    """Connect to (or start, for ``local``) the Ray cluster once per process."""
    import ray

    if ray.is_initialized():
        return
    if address == "local":
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True, configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=True, configure_logging=False)


def _call(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def pmap(fn: Callable[[T], R], items: Sequence[T], ray: str = "", tick: Callable[[R], None] | None = None,
         options: dict[str, Any] | None = None) -> list[R]:
    """``[fn(x) for x in items]`` in input order; with ``ray``, one Ray task per item (``fn`` and
    the items travel by cloudpickle; ``options``: the task's resources, e.g. ``{"num_gpus": 1}``).
    ``tick(result)`` as each item finishes (a progress bar). A failing task raises at once, and
    the tasks still pending are cancelled."""
    if not ray:
        out = []
        for x in items:
            out.append(fn(x))
            if tick:
                tick(out[-1])
        return out
    import ray as ray_mod

    ray_init(ray)
    task = ray_mod.remote(**options)(_call) if options else ray_mod.remote(_call)
    refs = [task.remote(fn, x) for x in items]
    pending = list(refs)
    try:
        while pending:
            done, pending = ray_mod.wait(pending, num_returns=1)
            result = ray_mod.get(done[0])  # raises here if the task failed
            if tick:
                tick(result)
    except BaseException:
        for ref in pending:
            ray_mod.cancel(ref)
        raise
    return ray_mod.get(refs)


def _rollout(policy: str, seed: int, run_seed: int | None, lm_options: dict[str, Any], job: Any) -> Any:
    from socialworld.agents.registry import make_policy
    from socialworld.rollout.runner import run_episodes

    return run_episodes(make_policy(policy, seed=seed, **lm_options), [job], run_seed=run_seed)[0]


def rollouts(policy: str, jobs: Sequence[Any], ray: str = "", seed: int = 0, run_seed: int | None = None,
             tick: Callable[[Any], None] | None = None, voice: Any = None, **lm_options: Any) -> list[Any]:
    """The episode records of a policy that holds no model weights here (a scripted one, or an
    ``openai:`` endpoint) on ``jobs`` (:class:`~socialworld.rollout.runner.EpisodeJob`), in order. Without
    ``ray``, one lockstep batch; with it, one Ray task per job, each with its own policy. The same
    records either way: a scripted policy's state and randomness are per episode (its key), and an
    endpoint's replies do not depend on which other requests share its batch (at temperature 0).
    A local model is refused under ``ray``: it is loaded once, in this process; so is a ``voice`` (an
    NPC voice speaks in this process, :mod:`socialworld.world.voice`)."""
    from socialworld.agents.models import parse_model_spec
    from socialworld.agents.registry import make_policy
    from socialworld.rollout.runner import run_episodes

    if not ray:
        return run_episodes(make_policy(policy, seed=seed, **lm_options), jobs, run_seed=run_seed, on_episode=tick, voice=voice)
    if voice is not None:
        raise ValueError("an NPC voice speaks in this process: run it without --ray")
    if parse_model_spec(policy).kind not in ("scripted", "openai"):
        raise ValueError(f"--ray spreads scripted and openai: policies; {policy!r} is a local model (run it without --ray)")
    from functools import partial

    return pmap(partial(_rollout, policy, seed, run_seed, lm_options), jobs, ray=ray, tick=tick)
