"""Compare the runs of one or more sweeps (docs/training.md, Comparing runs); same as `archsweep-compare`.

    python compare.py outputs/sweeps/<time>                       # table, plots, comparison.md in that directory
    python compare.py sweep_a sweep_b --out reports/pos           # several sweeps as one grid
    python compare.py outputs/sweeps/<time> --target "val/exact_match>=0.99" --sort test_long/exact_match
"""

import sys

from archsweep.cli import compare_main

if __name__ == "__main__":
    sys.exit(compare_main())
