"""`wisp bench serve`: concurrent streams measured as `vllm bench serve` users expect, in process (the engine
stepped by hand) or against a live server (`--server URL`). load.py: when requests start (closed and open
loops) and their prompts; engine_driver.py and server_driver.py: the two ways of running them;
request_times.py: what each request's run left; summary.py: a run's record and the table; plot.py: the PNG;
run.py: the command."""
