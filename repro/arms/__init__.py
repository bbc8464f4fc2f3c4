"""The two corruption arms, with the prompts and sizes they are built from. Each arm runs an
APC-on engine and an APC-off control on the same prompts and returns the paired figures;
`repro.grading` turns them into a verdict.

This package's own import is empty on purpose: `repro.arms.prompts` and `repro.arms.geometry`
are pure and read by the evidence side, which must not load the engine modules the arms use.
The runner maps arm names to their functions (`repro.runner.ARM_RUNNERS`)."""
