"""Running policies in the world: the lockstep episode runner, evaluation, the LM judge, conformance checks, Ray, Gymnasium."""
