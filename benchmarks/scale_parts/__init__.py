"""The parts of benchmarks/scale.py that are not its costs: the workload it writes
(workload.py) and the table it prints (table.py). A folder, so that the benchmarks' smoke
test, which runs every ``benchmarks/*.py`` as a script, does not take them for scripts."""
