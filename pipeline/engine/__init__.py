"""The stage engine: stages files, up to date or stale (and why), running one stage,
the lock file, the code version of a command, and torchrun for a stage's nproc."""
