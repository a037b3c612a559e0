"""wisp: serve Mixture-of-Experts models on GPUs too small to hold them.

    from wisp import LLM, SamplingParams
    llm = LLM("demo", mode="paged", expert_cap=8)
    print(llm.generate(["Hello"], SamplingParams(max_tokens=16))[0].text)
"""

from wisp.engine.llm import LLM, RequestOutput
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError

__all__ = ["LLM", "RequestOutput", "SamplingParams", "WispError"]
__version__ = "0.1.0"
