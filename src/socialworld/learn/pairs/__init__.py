"""The sleep phase's pairs (contract §7): wake episodes -> counterfactual preference pairs ->
screening -> strict gating, with a report that counts every exclusion by reason.

The package, by layer: :mod:`~socialworld.learn.pairs.record` (the :class:`Pair` record and its
Parquet file), :mod:`~socialworld.learn.pairs.counterfactual` (replay, forks, rollouts),
:mod:`~socialworld.learn.pairs.sources` (each way of building pairs: one function of one signature,
``(unit, cfg, report) -> pairs``, registered by name in ``SOURCES``; a recipe names the ones it uses
in ``PairBuild.sources``), :mod:`~socialworld.learn.pairs.gating` (screening, gating, replay, the
report) and :mod:`~socialworld.learn.pairs.sleep` (``run_sleep``, the one entry point).

A pair's prompt is the one its step recorded (the messages the language model received); a
scripted policy's step (a reference episode's) recorded none, so there the language-model
policy's prompt for the observation is rendered.

* **Counterfactuals** — each decision step of a wake episode is replayed exactly (the replay
  checks every recorded reward), the world is forked, and each candidate action is scored by
  ``rollouts`` continuations of the ``continuation`` policy (common random numbers: rollout m of
  every candidate uses the same reseed). Provenance: ``simulator_rollout(<policy>, M, horizon)``.
* **Action track** (step level) — prompt = the policy's prompt at that step; chosen = the best
  candidate as a whole turn (:func:`~socialworld.agents.lm.policy.target_turn`): its belief is
  :func:`~socialworld.agents.lm.policy.belief_target` (what the observation supports about the focus
  NPC, never the hidden truth) and its SAY line the expert's template words for that action (the
  words the candidate was scored with), so the action adapter learns the words with the decision;
  rejected = the turn the policy wrote. Kept when the value margin is >= ``margin``.
  With ``wake_chosen="label"`` or ``"label_by_margin"`` chosen is instead the continuation
  policy's action at that state (DAgger's expert label: the policy is fed the episode's
  observations in order); only the label and the taken action are rolled out.
  ``label_by_margin`` keeps a label only when its rollout value beats the policy's by ``margin``;
  ``label`` keeps every label that differs from what the policy did (plain DAgger: behaviour
  cloning needs every disagreement; the values are still recorded, the quality threshold is not
  applied to them). A label equal to the taken action is ``label_agrees``.
* **Reference states** (source ``reference``, action track, ``reference_chosen`` = ``best`` or
  ``own``) — the same scoring at each state of the reference episode (the continuation policy on
  the same seed): chosen = the best candidate (``best``) or the reference's own action (``own``: DAgger's
  expert label, with simulator-scored negatives), rejected = a candidate at least ``margin``
  worse than chosen, drawn by a seeded RNG; both as whole turns with the template's words. The
  wake of a weak policy stays in opening states; these pairs cover the rest of the task.
* **Dialogue track** (source ``dialogue``, trajectory level) — two trajectories of the same scenario and seed (the
  policy's and the continuation policy's); at aligned steps where both took the same action,
  chosen = the utterance of the higher-outcome trajectory, rejected = the other's, when its
  ``q_t`` is higher too.
* **Counterfactual utterances** (source ``utterance``, dialogue track) — a weak policy rarely
  takes the continuation policy's action at the same step, so aligned steps are rare. At each
  step where the policy's action ran as written, the world is forked twice: the same action
  with the policy's words and with the expert's template words, each rolled out like an action
  candidate. chosen = the words with the higher ``q_t``, kept when the gap is >= ``q_margin``
  and their trajectory's return is not lower. Both sides are trajectories of the same scenario
  and seed aligned at that step by construction.
* Dialogue pairs complete the whole turn: prompt = the policy's prompt; chosen and rejected =
  ``BELIEF/ACTION`` (the same head on both sides) + ``SAY:`` + the words, which is how the
  policy decodes them (one assistant turn). The shared head cancels in the DPO margin (the NLL
  term of ``sft_weight`` still trains it).
* **Screening** — exact dedup, a cap per template key, an optional capability filter (a callable
  that says the current policy already prefers chosen), quality threshold.
* **Replay** (``replay`` > 0) — after gating, pairs that earlier cycles kept are added back, up to
  ``replay`` × this cycle's kept pairs per track, drawn by a seeded RNG; a pair equal to one kept
  now is not replayed (counted ``replay_duplicate``). They passed the same screening and gating
  when they were built. Each cycle's adapter then also sees what earlier cycles taught.
* **Gating** — action track: the source episode's U, A_e, S_npc and D must be numbers with source
  ``direct`` or ``fused`` (``degraded``, ``proxy``, ``missing`` excluded); dialogue track:
  relaxed (its episode's D must be a number). ``gating="off"`` skips it (E2, no source constraints:
  the screening, quality threshold included, still applies, so it admits exactly the pairs strict
  gating excluded for their evidence). A judge's ranking (source ``judge``) is ``proxy`` evidence;
  the report counts how often the judge ordered the two episodes it ranked as their returns do
  (``judge_agreement``).

Pairs are TRL conversational preference rows (``prompt``/``chosen``/``rejected`` as message
lists) plus our metadata columns, written to Parquet.
"""
