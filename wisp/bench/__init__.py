"""The benchmarks `wisp bench` runs (arguments in args.py, torch-free): decode, prefill, concurrent streams
(serve/), agent sessions, the soak of `wisp serve` (soak/), hybrid's accuracy, the llama.cpp peer (llama_cpp/),
kernel sweeps (sweeps/) and step profiles (profiles/). Their results are kept under benchmarks/results/ and
rendered into BENCHMARKS.md by report.py; GPU-machine recipes and one-off probes live apart, in benchmarks/."""
