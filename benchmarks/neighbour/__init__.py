"""`bench.py neighbour`: colocated decode ITL beside a CPU-burning neighbour process."""
