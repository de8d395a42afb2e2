"""Marks every answer of the lab's real engine as the lab's, as the stand-in marks its own.

The real vLLM 0.10.1.1 in the lab serves a tiny random-weight model on the lab's CPU: its
figures are real measurements of a real server, and nothing of a BI-V100's. The collection
marks figures `simulated` when an answer carries `x-biv100-simulated`, so this header puts the
real engine's figures beside the stand-in's, marked wherever they appear. Installed in each
real-engine host's venv as `biv100_lab_marker` and loaded by vLLM's own `--middleware` option
(an HTTP middleware function), so that no file of the vllm package changes.
"""

SIMULATED_HEADER = ("x-biv100-simulated", "real vLLM 0.10.1.1 on the lab's CPU")


async def mark_simulated(request, call_next):
    response = await call_next(request)
    response.headers[SIMULATED_HEADER[0]] = SIMULATED_HEADER[1]
    return response
