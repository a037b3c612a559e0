"""`wisp bench llama-cpp`: llama.cpp as the peer, in our harness. llama-bench at each expert placement
(`llama_bench`), the random GGUF it reads (`random_gguf`), the GPU memory both sides are held to
(`gpu_peak`) and what sampling it costs (`sampler_cost`), and our records beside llama.cpp's (`compare`,
`paired`). Building llama.cpp is a recipe: benchmarks/recipes/llama_cpp/{fetch,build}.sh.
"""
