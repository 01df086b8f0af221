"""dsv4_ops benchmarks: timing helpers, case builders and one script per op family.

    python benchmarks/run.py [--quick] [--only REGEX] [--out DIR]      # everything
    python benchmarks/bench_compress.py --quick                       # one family
    python benchmarks/peer_compare.py --peer-dir PEER                 # vs the reference engine
"""
