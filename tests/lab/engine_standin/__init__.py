"""The biv100 lab's simulated engine: a stand-in for vLLM 0.10.1.1's OpenAI API server.

It is not vLLM and loads no model. It runs on a lab host's plain Python (3.8+, standard library
only) and behaves, as far as the collection can observe, like

    python -m vllm.entrypoints.openai.api_server <arguments>

on a BI-V100 host: the same command line (rebuilt from 0.10.1.1's sources, flags-0.10.1.1.json),
the same start-up failures (GPUs, PYTORCH_CUDA_ALLOC_CONF, model architecture, context length),
the port bound early and served only after a load time, and the OpenAI routes with
deterministic text in vLLM's response shapes. It reads the installed vllm package's serving
files, so deploying or rolling back the team's fixes changes what probes observe. Nothing outside
tests/ imports it.

What a benchmark or an evaluation measures is simulated too, and says so:

- speed: answers leave on a documented schedule (speed_model.py): at most --max-num-seqs
  sequences at once, the rest queued first come first served; the first token after
  prompt_tokens / BIV100_STANDIN_PREFILL_TPS seconds, then one every
  1 / BIV100_STANDIN_DECODE_TPS. Streams are paced without drift; a non-streamed answer
  leaves with its last token. ignore_eos, min_tokens and stream_options (include_usage,
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
    BIV100_STANDIN_PREFILL_TPS    prompt tokens per second per sequence (default 40000)
    BIV100_STANDIN_DECODE_TPS     output tokens per second per sequence (default 5000); with
                                  the prefill default, the lab's default bench load (1024-token
                                  prompts, 128 to 256 output tokens, 2 in flight, max_num_seqs
                                  2) is predicted at 10,093 to 10,993 against the gate's 8,000
                                  (about 10,000 measured over loopback)
    BIV100_STANDIN_WRONG_SHARE    0..1 (default 0): share of the evaluation set's questions
                                  answered wrongly, chosen by the sha256 of the prompt
    BIV100_STANDIN_BREAK          answer one kind of request wrongly, one of:
        n                      one choice fewer than `n` asks for
        tools                  a tool call comes back as content text, no tool_calls
        max_completion_tokens  400 for requests carrying max_completion_tokens (the old base)
        tool_content_none      500 for an assistant message with content null and tool_calls
        thinking_tools         a tool request with thinking on spends the budget thinking
        fragmentation          500 (CUDA out of memory) for a long prompt (over 1024 tokens)
                               that arrives while another long prompt is being prefilled
        json_object            response_format json_object not applied: braces around prose
    CUDA_VISIBLE_DEVICES, PYTORCH_CUDA_ALLOC_CONF, VLLM_ALLOW_LONG_MAX_MODEL_LEN, VLLM_API_KEY
                                  as vLLM and PyTorch read them
"""
