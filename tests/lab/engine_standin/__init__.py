"""The biv100 lab's simulated engine: a stand-in for vLLM 0.10.1.1's OpenAI API server.

It is not vLLM and loads no model. It runs on a lab host's plain Python (3.8+, standard library
only) and behaves, as far as the collection can observe, like

    python -m vllm.entrypoints.openai.api_server <arguments>

on a BI-V100 host: the same command line (rebuilt from 0.10.1.1's sources, flags-0.10.1.1.json),
the same start-up failures (GPUs, PYTORCH_CUDA_ALLOC_CONF, model architecture, context length,
and a documented model of the GPUs' memory: the KV cache must hold one sequence of
max_model_len),
the port bound early and served only after a load time, and the OpenAI routes with
deterministic text in vLLM's response shapes. It reads the installed vllm package's serving
files, so deploying or rolling back the team's fixes changes what probes observe. Nothing outside
tests/ imports it.

What a benchmark or an evaluation measures is simulated too, and says so:

- speed: answers leave as the engine's steps make their tokens (speed_model.py, which is the
  reference, and engine_steps.py): at most --max-num-seqs sequences at once and as many as the
  KV cache holds, the rest queued first come first served; in each step every running sequence
  makes a token and prompts are read in chunks of what is left of --max-num-batched-tokens (8 ms
  a step beside tokens / BIV100_STANDIN_PREFILL_TPS seconds), a decode step of n sequences
  taking 1 + 0.2 (n - 1) times one's 1 / BIV100_STANDIN_DECODE_TPS; long prompts side by side
  run out of memory unless PYTORCH_CUDA_ALLOC_CONF keeps large blocks whole. Streams are paced without drift; a non-streamed answer leaves with
  its last token. ignore_eos, min_tokens and stream_options (include_usage,
  continuous_usage_stats) behave as in vLLM 0.10.1.1 (sampling.py).
- quality: the evaluation set's question forms get answers computed from the question
  (evaluation_solver.py); BIV100_STANDIN_WRONG_SHARE makes a fixed share of them wrong.
- every HTTP response carries the header `x-biv100-simulated: engine stand-in`, which no real
  vLLM sends: the bench marks figures measured on it as simulated.

Launch it with the interpreter whose site-packages hold the host's vllm (where the real engine
would run; otherwise set BIV100_STANDIN_VLLM_ROOT), tests/lab on PYTHONPATH:

    PYTHONPATH=<checkout>/tests/lab /usr/local/corex/python3/bin/python3 -m engine_standin \\
        /opt/models/qwen3_5 --served-model-name qwen3_5 --host 0.0.0.0 --port 8000 \\
        --tensor-parallel-size 4 ...

Environment:

    BIV100_STANDIN_LOAD_SECONDS   seconds between binding the port and serving it (default 2)
    BIV100_STANDIN_IXSMI          ixsmi to count GPUs with (default /usr/local/corex/bin/ixsmi),
                                  which lists this engine on the GPUs it holds
    BIV100_STANDIN_VLLM_ROOT      the installed vllm package folder (default: found on sys.path)
    BIV100_STANDIN_NEVER_HEALTHY  1: bind the port and never finish loading
    BIV100_STANDIN_CRASH_AFTER    N: exit with status 1 after answering N chat requests
    BIV100_STANDIN_PREFILL_TPS    prompt tokens per second of a sequence alone (default 200000)
    BIV100_STANDIN_DECODE_TPS     output tokens per second of a sequence alone (default 6000);
                                  with the other defaults, the lab's default bench at Sub168
                                  (1024-token prompts, 128 to 256 output tokens, 8 in flight) is
                                  predicted at 10,503 against the gate's 8,000
    BIV100_STANDIN_STEP_SECONDS   what a step that reads prompt tokens costs beside them
                                  (default 0.008)
    BIV100_STANDIN_JITTER         0..1 (default 0): each engine step runs up to that much longer
                                  or shorter, drawn by a generator seeded with
                                  BIV100_STANDIN_SEED and the step's number
    BIV100_STANDIN_WRONG_SHARE    0..1 (default 0): share of the evaluation set's questions
                                  answered wrongly, chosen by the sha256 of the prompt
    BIV100_STANDIN_BREAK          answer one kind of request wrongly, one of:
        n                      one choice fewer than `n` asks for
        tools                  a tool call comes back as content text, no tool_calls
        max_completion_tokens  400 for requests carrying max_completion_tokens (the old base)
        tool_content_none      500 for an assistant message with content null and tool_calls
        thinking_tools         a tool request with thinking on spends the budget thinking
        fragmentation          CUDA out of memory for a long prompt (over 1024 tokens) that
                               begins to run beside another, whatever
                               PYTORCH_CUDA_ALLOC_CONF says
        json_object            response_format json_object not applied: braces around prose
    CUDA_VISIBLE_DEVICES, PYTORCH_CUDA_ALLOC_CONF, VLLM_ALLOW_LONG_MAX_MODEL_LEN, VLLM_API_KEY
                                  as vLLM and PyTorch read them
"""
