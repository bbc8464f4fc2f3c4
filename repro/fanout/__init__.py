"""Many runs at once: conditions, the cross-verification matrix, bisect, and where they run.

conditions  the conditions file (`[[condition]]` tables) and each condition's content hash
cell        one condition's arms in one run directory (its engine environment made or reused)
matrix      every condition × arm, resumed by content hash; matrix.json and MATRIX.md
bisect      the first release (or main commit) whose verdict differs from the bad end's
slurm       the same cells as one Slurm job array (sbatch, squeue / scontrol, sacct)
"""
