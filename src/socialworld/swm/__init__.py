"""Social world models: S3AP social states, theory-of-mind evaluation, Foresee-and-Act, multi-episode chains."""
