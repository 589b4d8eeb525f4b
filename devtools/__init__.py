"""Research tools kept outside the shipped `mkcode` package (not installed by the wheel).

Run them from a source checkout, at the repository root, against the installed (editable) package:
`python -m devtools.bench.host_overhead`, `python -m devtools.checkpoint.bench_load`, ... See
devtools/README.md.
"""
